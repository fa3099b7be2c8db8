"""The status both controllers give our custom resources: FMA's `errors` and dualpods' `Ready` and
`Stalled` conditions, computed from what one pass found.

A pass finds the object's problems (each a reason and a message) and whether it does what it asks for
now; `computed` turns those into the status the object should carry: `errors` and `Stalled` from the same
problems, `Ready`, all at the object's generation. A condition keeps the `lastTransitionTime` the object
already carries while its status stays the same, so a status computed again from an unchanged world equals
the one shown and nothing is written (status_writer.py). The object itself is the record: nothing of it is
kept in memory, and a restarted controller computes the same status.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from pydantic import ValidationError

from api.crds import READY, STALLED, Condition, ConditionStatus, Status

S = TypeVar("S", bound=Status)

NO_ERRORS: Final = "NoErrors"


@dataclass(frozen=True)
class Fault:
    """Something wrong with the object or what it names, as its status conditions show it; `reason` is the
    condition reason (CamelCase). (A reconcile pass's own ending is the work queue's Problem: workqueue.py.)"""

    reason: str
    message: str


@dataclass(frozen=True)
class Readiness:
    """Whether the object does what it asks for now, and why (used only when there is no problem)."""

    ready: bool
    reason: str
    message: str = ""


def current(kind: type[S], obj: Mapping[str, Any]) -> S:
    """The status the object carries; an unreadable one (written by hand) counts as none."""
    try:
        return kind.model_validate(obj.get("status") or {})
    except ValidationError:
        return kind()


def computed(
    shown: S,
    generation: int,
    problems: Sequence[Fault],
    readiness: Readiness,
    now: datetime,
    also: Mapping[str, Readiness] | None = None,
    **extra: Any,
) -> S:
    """The status an object at `generation` should carry after a pass that found `problems` and
    `readiness`; `shown` is what it carries now (its transition times are kept), `also` the kind's own
    conditions by type (e.g. PoolReady), `extra` its own fields (e.g. servedRequesters)."""
    errors = [problem.message for problem in problems]
    if problems:
        joined = "; ".join(errors)
        ready = _condition(shown, READY, "False", problems[0].reason, joined, generation, now)
        stalled = _condition(shown, STALLED, "True", problems[0].reason, joined, generation, now)
    else:
        status: ConditionStatus = "True" if readiness.ready else "False"
        ready = _condition(shown, READY, status, readiness.reason, readiness.message, generation, now)
        stalled = _condition(shown, STALLED, "False", NO_ERRORS, "", generation, now)
    own = [
        _condition(shown, kind, "True" if r.ready else "False", r.reason, r.message, generation, now)
        for kind, r in (also or {}).items()
    ]
    return type(shown)(observed_generation=generation, errors=errors, conditions=[ready, stalled, *own], **extra)


def _condition(
    shown: Status, kind: str, status: ConditionStatus, reason: str, message: str, generation: int, now: datetime
) -> Condition:
    before = shown.condition(kind)
    unchanged = before is not None and before.status == status
    since = before.last_transition_time if before is not None and unchanged else rfc3339(now)
    return Condition(
        type=kind,
        status=status,
        observed_generation=generation,
        last_transition_time=since,
        reason=reason,
        message=message,
    )


def rfc3339(moment: datetime) -> str:
    """Kubernetes' metav1.Time on the wire: UTC, whole seconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
