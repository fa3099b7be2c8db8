"""What a user reads in a requester's `dual-pods.llm-d.ai/status` annotation (FMA's `{"Errors": [...]}`),
computed from each pass's outcome.

A pass ends in an Outcome: the errors it met (None when it failed in a way that says nothing about the
requester, e.g. a launcher that did not answer), when to look again, and what it changed. The status is
compared with what the requester already carries, never with memory: it is written only when it
differs, and an Event is recorded only for an error the annotation does not show yet. So a controller
that restarts while a problem stands writes nothing and records no second Event.
"""

import json
from dataclasses import dataclass, field

from api import keys
from controller import pods


class RequesterProblem(Exception):
    """Something the user should see in the requester's status. The work item retries with back-off, unless
    `retry` is False: then only a change to some object can settle it, and that change's event brings the next pass."""

    def __init__(self, *errors: str, retry: bool = True) -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)
        self.retry = retry


def status_json(errors: list[str]) -> str:
    return json.dumps({"Errors": errors or None})


def reported_errors(requester: pods.Pod) -> list[str]:
    """The errors the requester's status annotation shows (none when it has no status, or an unreadable one)."""
    try:
        found = json.loads(pods.annotations(requester).get(keys.STATUS_ANNOTATION) or "{}").get("Errors")
    except (ValueError, AttributeError):
        return []
    return [str(e) for e in found] if isinstance(found, list) else []


@dataclass
class Outcome:
    """How a pass ended."""

    errors: list[str] | None = field(default_factory=list)  # None: unknown, leave the status as it is
    again_after: float | None = None  # seconds until the next look, if no event is awaited
    failure: BaseException | None = None  # re-raised after the status is written, for the queue's back-off
    changed: list[str] = field(default_factory=list)  # what the pass wrote, in words


def new_errors(requester: pods.Pod, errors: list[str]) -> list[str]:
    """The errors of `errors` that the requester does not show yet (each deserves one Event)."""
    shown = reported_errors(requester)
    return [e for e in errors if e not in shown]
