"""What a user reads in a requester's `dual-pods.llm-d.ai/status` annotation (FMA's `{"Errors": [...]}`),
computed from each pass's outcome, and the whole requester a pass wants (`desired_requester`): its status with
the metadata its steps asked for, written in one write.

A pass ends in an Outcome: the errors it met (None when it failed in a way that says nothing about the
requester, e.g. a launcher that did not answer), what the work queue does next (its Result), and what it
changed. The status is compared with what the requester already carries, never with memory: it is written
only when it differs, and an Event is recorded only for an error the annotation does not show yet. So a
controller that restarts while a problem stands writes nothing and records no second Event.
"""

import json
from dataclasses import dataclass, field
from enum import StrEnum

from api import keys
from controller import pods
from controller.dualpods.snapshot import BoundNow, Snapshot, own_metadata, settled
from controller.dualpods.writer import set_annotation, set_finalizer, set_label
from kube.workqueue import DONE, Result


def status_json(errors: list[str]) -> str:
    return json.dumps({"Errors": errors or None})


def reported_errors(requester: pods.Pod) -> list[str]:
    """The errors the requester's status annotation shows (none when it has no status, or an unreadable one)."""
    try:
        found = json.loads(pods.annotations(requester).get(keys.STATUS_ANNOTATION) or "{}").get("Errors")
    except (ValueError, AttributeError):
        return []
    return [str(e) for e in found] if isinstance(found, list) else []


class Ending(StrEnum):
    """How a pass's step ended (the `result` label of dualpods_passes_total)."""

    DONE = "done"
    WAIT = "wait"
    PROBLEM = "problem"  # the user is told (status, Event)
    ERROR = "error"  # unexpected, or transient (a call that failed): retried with back-off


@dataclass
class Outcome:
    """How a pass ended."""

    errors: list[str] | None = field(default_factory=list)  # None: unknown, leave the status as it is
    next: Result = DONE  # what the work queue does with the requester next
    changed: list[str] = field(default_factory=list)  # what the pass wrote, in words
    ending: Ending = Ending.DONE


def new_errors(requester: pods.Pod, errors: list[str]) -> list[str]:
    """The errors of `errors` that the requester does not show yet (each deserves one Event)."""
    shown = reported_errors(requester)
    return [e for e in errors if e not in shown]


@dataclass
class RequesterWants:
    """What a pass's steps want changed on the requester's metadata; `desired_requester` adds the status."""

    settled: bool = False  # in line with its binding (snapshot.settled)
    bound_now: BoundNow | None = None  # the binding this pass made (the snapshot shows it unbound)
    finalizer: bool | None = None  # the requester finalizer set or dropped (None: as it is)
    gpus: list[str] | None = None  # recorded in its accelerators annotation
    unserved: bool = False  # no instance label: not served by the bound instance (any more)
    why: list[str] = field(default_factory=list)  # in words, for the write's log line

    def __bool__(self) -> bool:
        return bool(self.why)


def desired_requester(requester: pods.Pod, s: Snapshot, wants: RequesterWants, errors: list[str] | None) -> pods.Pod:
    """The whole requester a pass wants: its metadata as the steps asked, and its status showing `errors`
    (None: leave the status as it is). A status that already shows `errors` is left as it is, unless the
    metadata is settled (a settled requester always carries a status)."""
    pod = settled(requester, s, wants.bound_now) if wants.settled else own_metadata(requester)
    if wants.finalizer is not None:
        set_finalizer(pod, keys.REQUESTER_FINALIZER, wants.finalizer)
    if wants.gpus is not None:
        set_annotation(pod, keys.ACCELERATORS_ANNOTATION, ",".join(wants.gpus))
    if wants.unserved:
        set_label(pod, keys.INSTANCE_LABEL, None)
    if errors is not None and (wants.settled or reported_errors(requester) != errors):
        set_annotation(pod, keys.STATUS_ANNOTATION, status_json(errors))
    return pod
