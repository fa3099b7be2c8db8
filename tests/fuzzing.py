"""A bounded property-based run (schemathesis on hypothesis) against one of our HTTP servers, from its own document.

The server under test is a real process, started by the test; its `/openapi.json` (fetched from it, so
the document is tested too) drives generation. For every operation, in schemathesis' positive mode
(requests the document allows) and negative mode (requests it forbids), each generated request must:

- get an HTTP answer below 500 (the process may not crash or time out either);
- if refused (4xx), carry a JSON body with a message (`FuzzTarget.message_of`), and leave the server's
  observable state (`FuzzTarget.snapshot`) exactly as it was;
- for negative data, be refused (schemathesis' `negative_data_rejection`: what the document forbids,
  the server must not accept), unless the server forwards what it cannot judge (a proxy).

After the run the process must still be alive with no child processes it did not have before.
Runs are bounded (`examples` per operation and mode, at most `MAX_EXAMPLES`) and derandomized, so a
failure repeats; `FuzzTarget.restore` puts back what an accepted request changed (a sleep) when later
requests depend on it.

Fuzzing another server takes one `FuzzTarget`: its process, URLs, how its errors carry their message,
what state a refused request must not change, and its example budget (see the test modules).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import psutil
import requests
import schemathesis

# What `schemathesis.openapi.from_url` would import on its first call, imported with this module instead (at
# collection, one thread): CPython 3.11.7's AST constructor can fail with "SystemError: AST constructor recursion
# depth mismatch" when code is compiled while another thread compiles too (python/cpython#106905, fixed in 3.11.8),
# and pytest compiles schemathesis' modules as they are imported (it is a pytest plugin).
import schemathesis.specs.openapi.schemas
from schemathesis.core.result import Err
from schemathesis.core.transport import Response
from schemathesis.specs.openapi.checks import negative_data_rejection

MAX_EXAMPLES = 200  # per operation and mode, the issue's bound
REQUEST_TIMEOUT_S = 30.0


def detail_message(body: Any) -> str | None:
    """`{"detail": ...}`: the requester's SPI (and FMA's launcher)."""
    return body.get("detail") if isinstance(body, dict) else None


def launcher_message(body: Any) -> str | None:
    """The launcher's `{"detail": ..., "reason": ...}`: a message, or for a 422 FastAPI's list of issues."""
    detail = detail_message(body)
    if isinstance(detail, list):
        return "; ".join(str(issue.get("msg", "")) for issue in detail if isinstance(issue, dict)) or None
    return detail


def openai_message(body: Any) -> str | None:
    """`{"error": {"message": ...}}`: the OpenAI servers and the requester's proxy."""
    error = body.get("error") if isinstance(body, dict) else None
    return error.get("message") if isinstance(error, dict) else None


@dataclass
class FuzzTarget:
    name: str
    process: psutil.Process
    base_url: str  # where requests go
    schema_url: str  # the document describing them
    message_of: Callable[[Any], str | None]
    snapshot: Callable[[], object]  # the state a refused request must leave unchanged
    examples: int = 50  # per operation and mode
    examples_for: dict[str, int] = field(default_factory=dict)  # "POST /sleep" -> examples
    restore: Callable[[], None] = lambda: None  # after an accepted request
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request
    # Whether what the document forbids must be refused; False for a proxy, which forwards what it cannot judge.
    rejects_invalid: bool = True
    # Operations ("GET /watch") whose accepted requests never end (a stream that a server keeps alive): their
    # answers' status and headers are checked, and a successful answer's body is not read.
    streaming: frozenset[str] = frozenset()
    # Child processes the server accounts for at the end (PIDs), beyond those it had at the start: what `restore`
    # made again (the launcher's instances).
    accounted_children: Callable[[], set[int]] = set


@dataclass
class FuzzReport:
    cases: int = 0
    refused: int = 0
    seconds: float = 0.0
    by_status: dict[int, int] = field(default_factory=dict)


class FuzzFailure(AssertionError):
    pass


def _call(target: FuzzTarget, case: schemathesis.Case[Any]) -> Response:
    if f"{case.method.upper()} {case.path}" not in target.streaming:
        return case.call(base_url=target.base_url, headers=target.headers, timeout=REQUEST_TIMEOUT_S)
    started = time.monotonic()
    sent = case.as_transport_kwargs(base_url=target.base_url, headers=target.headers)
    with requests.request(**sent, stream=True, timeout=REQUEST_TIMEOUT_S) as answer:
        content = b"" if answer.status_code < 300 else answer.content  # a stream ends when the client leaves
        headers = {name: answer.raw.headers.getlist(name) for name in answer.raw.headers}
        return Response(answer.status_code, headers, content, answer.request, time.monotonic() - started,
                        verify=True, message=answer.reason, encoding=answer.encoding)  # fmt: skip


def _check(target: FuzzTarget, case: schemathesis.Case[Any], report: FuzzReport, negative: bool) -> None:
    before = target.snapshot()
    try:
        response = _call(target, case)
    except requests.RequestException as err:
        alive = target.process.is_running() and target.process.status() != psutil.STATUS_ZOMBIE
        raise FuzzFailure(f"{target.name}: no HTTP answer ({'alive' if alive else 'the process died'}): {err!r}\n"
                          f"{case.as_curl_command()}") from None  # fmt: skip
    status = response.status_code
    report.cases += 1
    report.by_status[status] = report.by_status.get(status, 0) + 1
    where = f"{target.name}: {case.method} {case.formatted_path} answered {status}"
    if status >= 500:
        raise FuzzFailure(f"{where}: {response.text[:500]}\n{case.as_curl_command()}")
    if 400 <= status < 500:
        report.refused += 1
        try:
            message = target.message_of(response.json())
        except ValueError:
            message = None
        if not message:
            raise FuzzFailure(f"{where} without a JSON message: {response.text[:300]!r}\n{case.as_curl_command()}")
        after = target.snapshot()
        if after != before:
            raise FuzzFailure(f"{where} but changed the state: {before!r} -> {after!r}\n{case.as_curl_command()}")
    else:
        if negative and target.rejects_invalid:
            case.validate_response(response, checks=[negative_data_rejection])
        target.restore()


def _run_operation(
    target: FuzzTarget, operation: Any, mode: schemathesis.GenerationMode, examples: int, report: FuzzReport
) -> None:
    negative = mode is schemathesis.GenerationMode.NEGATIVE

    @hypothesis.settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case[Any]) -> None:
        _check(target, case, report, negative)

    try:
        run()
    except hypothesis.errors.Unsatisfiable:
        if not negative:
            raise  # an operation with no inputs has no invalid ones; every operation has valid ones


def fuzz(target: FuzzTarget) -> FuzzReport:
    """Run every operation of `target`'s document; raises FuzzFailure (or schemathesis' failure) on the first
    broken property, with a curl command that repeats it."""
    schema = schemathesis.openapi.from_url(target.schema_url)
    children = {p.pid for p in target.process.children(recursive=True)}
    report = FuzzReport()
    started = time.monotonic()
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise FuzzFailure(f"{target.name}'s document has an invalid operation: {result.err()}")
        operation = result.ok()
        examples = min(target.examples_for.get(f"{operation.method.upper()} {operation.path}", target.examples),
                       MAX_EXAMPLES)  # fmt: skip
        if examples == 0:
            continue
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            _run_operation(target, operation, mode, examples, report)
    report.seconds = time.monotonic() - started
    print(f"fuzzed {target.name}: {report.cases} requests in {report.seconds:.1f} s, by status {report.by_status}")
    if not target.process.is_running() or target.process.status() == psutil.STATUS_ZOMBIE:
        raise FuzzFailure(f"{target.name} died during the run")
    leaked = {p.pid for p in target.process.children(recursive=True)} - children - target.accounted_children()
    if leaked:
        raise FuzzFailure(f"{target.name} left processes behind: {sorted(leaked)}")
    return report
