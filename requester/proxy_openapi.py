"""The request proxy's OpenAPI document: what the proxy itself answers, around the model server's API.

The proxy forwards every path, so its document is not read off a route table: it lists the paths the
proxy treats in its own way (held, guarded, shed, or answered by it) and the answers it gives itself.
It is served on the SPI port (`/v1/proxy/openapi.json`), because the proxy port's `/openapi.json` is the
model server's own document, forwarded like every other path.
"""

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from api import version
from api.openai_errors import ErrorBody
from api.openapi import TEXT, Content, Operation, Reply, build_document

from .proxy import GUARDED_PATHS, INFERENCE_PATHS, MONITORING_PATHS, OVERLOADED_RETRY_AFTER_S, UNAVAILABLE_RETRY_AFTER_S

VERSION = version.release()
ERROR = Content(ErrorBody)
FORWARDED = Reply("the model server's answer, streamed as it comes (any status the server gives)")
UNAVAILABLE = Reply(
    "not bound to a model server, or not ready within the hold timeout", ERROR,
    {"Retry-After": f"seconds to wait ({UNAVAILABLE_RETRY_AFTER_S})"},
)  # fmt: skip
UNREACHABLE = Reply("the model server cannot be reached, or broke the connection", ERROR)
SHED = Reply("the model server's queue is too deep", ERROR, {"Retry-After": f"seconds ({OVERLOADED_RETRY_AFTER_S})"})


class GuardedCompletion(BaseModel):
    """The fields of a completion the guard reads; every other field is forwarded untouched."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]] | None = Field(default=None, description="completions")
    messages: list[dict[str, Any]] | None = Field(default=None, description="chat completions")
    n: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0, description="chat completions")


def _guarded(chat: bool) -> Operation:
    what = "chat completion" if chat else "completion"
    return Operation(
        f"A {what}: held while not ready, refused if it can never fit, shed under overload, else forwarded",
        {
            200: FORWARDED,
            400: Reply("cannot fit the instance's context or KV cache (codes `context_length_exceeded`, "
                       "`kv_cache_capacity_exceeded`), or the server's own 400", ERROR),
            413: Reply("a body over 64 MiB", ERROR),
            429: SHED,
            502: UNREACHABLE,
            503: UNAVAILABLE,
        },
        body=Content(GuardedCompletion),
        tags=("inference",),
    )  # fmt: skip


def _inference() -> Operation:
    return Operation("Held while not ready, shed under overload, else forwarded",
                     {200: FORWARDED, 429: SHED, 502: UNREACHABLE, 503: UNAVAILABLE},
                     body=Content(dict[str, Any]), body_required=False, tags=("inference",))  # fmt: skip


def _monitoring() -> Operation:
    return Operation("The model server's own monitoring route: forwarded at once, never held",
                     {200: FORWARDED, 502: UNREACHABLE, 503: Reply("no model server bound yet", ERROR)},
                     tags=("monitoring",))  # fmt: skip


@functools.cache
def document() -> dict[str, Any]:
    """Built once per process (pydantic's JSON schemas take ~20 ms): callers serve it, never change it."""
    operations: list[tuple[str, str, Operation]] = [
        ("GET", "/ready", Operation("Whether the proxy would forward at once (bound and ready)", {
            200: Reply("`OK`", TEXT), 503: Reply("`Service Unavailable`", TEXT)})),
        ("GET", "/v1/models", Operation("Held while not ready, then forwarded",
                                        {200: FORWARDED, 502: UNREACHABLE, 503: UNAVAILABLE})),
    ]  # fmt: skip
    operations += [("POST", path, _guarded(chat)) for path, chat in GUARDED_PATHS.items()]
    operations += [("POST", path, _inference()) for path in sorted(INFERENCE_PATHS - set(GUARDED_PATHS))]
    operations += [("GET", path, _monitoring()) for path in sorted(MONITORING_PATHS)]
    return build_document(
        "dualpods requester request proxy",
        VERSION,
        operations,
        "The requester Pod's stable address for its bound model server's OpenAI API (E7). Every path not "
        "listed here is held while the requester is not ready and then forwarded unchanged.",
    )
