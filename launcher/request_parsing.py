"""A request's query, headers and body, checked as FMA's launcher (FastAPI) checks them.

FastAPI validates every input with pydantic in lax mode, so `?detail=off` is false and `?since=abc` is
refused; a refusal is a 422 whose `detail` lists each problem as `{type, loc, msg, input}` (`loc` starts
with `query`, `header` or `body`). A body that is not JSON at all is refused the same way, with the
offset of the syntax error in `loc`. Clients written for FMA's launcher therefore get the same answers
here, to the status code and the shape of the body.
"""

import json
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python

from api.launcher import VllmConfig

from .errors import Unprocessable

M = TypeVar("M", bound=BaseModel)


def _issues(error: ValidationError, where: str) -> list[dict[str, Any]]:
    issues = []
    for problem in error.errors(include_url=False):
        issue: dict[str, Any] = {
            "type": problem["type"],
            "loc": [where, *problem["loc"]],
            "msg": problem["msg"],
            "input": to_jsonable_python(problem.get("input"), fallback=str),
        }
        if "ctx" in problem:
            issue["ctx"] = to_jsonable_python(problem["ctx"], fallback=str)
        issues.append(issue)
    return issues


def _validated(model: type[M], values: Mapping[str, Any], where: str) -> M:
    try:
        return model.model_validate(dict(values))
    except ValidationError as err:
        raise Unprocessable(_issues(err, where)) from None


def query(params: Mapping[str, str], model: type[M]) -> M:
    """The query parameters `model` declares (others are ignored, as FastAPI does)."""
    return _validated(model, {name: params[name] for name in model.model_fields if name in params}, "query")


def headers(received: Mapping[str, str], model: type[M]) -> M:
    """The headers `model` declares, matched without regard to case."""
    return _validated(model, {name: received[name] for name in model.model_fields if name in received}, "header")


def vllm_config(body: bytes) -> VllmConfig:
    """A create request's body: JSON, then a VllmConfig (unknown fields ignored)."""
    if not body.strip():
        raise Unprocessable([{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}])
    try:
        parsed = json.loads(body)
    except UnicodeDecodeError as err:
        raise Unprocessable([{"type": "json_invalid", "loc": ["body", err.start], "msg": "JSON decode error",
                              "input": {}, "ctx": {"error": "the body is not UTF-8"}}]) from None  # fmt: skip
    except json.JSONDecodeError as err:
        raise Unprocessable([{"type": "json_invalid", "loc": ["body", err.pos], "msg": "JSON decode error",
                              "input": {}, "ctx": {"error": err.msg}}]) from None  # fmt: skip
    try:
        return VllmConfig.model_validate(parsed)
    except ValidationError as err:
        raise Unprocessable(_issues(err, "body")) from None
