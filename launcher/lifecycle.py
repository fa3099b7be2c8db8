"""An instance's life cycle: its phases, the transitions between them and the watch event each publishes.

One table (`TRANSITIONS`) says which moves exist; `event_of` refuses any other (`IllegalTransition`), so
an instance's `ready`, `sleeping` and `status` are what its phase says, never a set of flags that could
disagree: a stopped (and then deleted) instance that was asleep is in a phase of its own, since its state
still says it sleeps. From any phase, an event leads to one phase at most (`after`). The wire format is the
launcher's API's (`api.launcher`): the phase itself is not on it.
docs/architecture.md draws the table (`mermaid`).

A stop a DELETE causes is not published: the DELETED event that follows reports it (as FMA's launcher
does); the instance manager, which runs the DELETE, holds that event back.
"""

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from api.launcher import EventType, InstanceStatus


class Phase(StrEnum):
    NEW = "new"  # forked, not yet announced
    STARTING = "starting"  # its server does not answer /health yet
    AWAKE = "awake"  # serving
    ASLEEP = "asleep"  # ready, its weights offloaded or discarded
    STOPPED = "stopped"  # its server exited (or was killed)
    STOPPED_ASLEEP = "stopped_asleep"  # its server exited while it was asleep
    DELETED = "deleted"  # removed from the launcher
    DELETED_ASLEEP = "deleted_asleep"  # removed from the launcher, stopped while asleep


TRANSITIONS: Final[Mapping[tuple[Phase, Phase], EventType]] = {
    (Phase.NEW, Phase.STARTING): EventType.CREATED,
    (Phase.STARTING, Phase.AWAKE): EventType.READY,
    (Phase.AWAKE, Phase.ASLEEP): EventType.SLEEPING,
    (Phase.ASLEEP, Phase.AWAKE): EventType.AWAKE,
    (Phase.STARTING, Phase.STOPPED): EventType.STOPPED,
    (Phase.AWAKE, Phase.STOPPED): EventType.STOPPED,
    (Phase.ASLEEP, Phase.STOPPED_ASLEEP): EventType.STOPPED,
    (Phase.STOPPED, Phase.DELETED): EventType.DELETED,
    (Phase.STOPPED_ASLEEP, Phase.DELETED_ASLEEP): EventType.DELETED,
}
FIRST: Final = Phase.NEW
RUNNING: Final = frozenset({Phase.NEW, Phase.STARTING, Phase.AWAKE, Phase.ASLEEP})  # its server process lives
READY: Final = frozenset({Phase.AWAKE, Phase.ASLEEP})  # its server answered /health
SLEEPING: Final = frozenset({Phase.ASLEEP, Phase.STOPPED_ASLEEP, Phase.DELETED_ASLEEP})  # its state says it sleeps


class IllegalTransition(Exception):
    """A move the table does not declare: a bug in the launcher, never a client's error."""


def event_of(current: Phase, to: Phase) -> EventType:
    """The event the move `current` → `to` publishes."""
    event = TRANSITIONS.get((current, to))
    if event is None:
        raise IllegalTransition(f"an instance cannot go from {current} to {to}")
    return event


def after(current: Phase, event: EventType) -> Phase:
    """The phase `event` leads to from `current` (IllegalTransition if none): where a stop or a deletion goes
    depends on whether the instance was asleep."""
    targets = [target for (source, target), published in TRANSITIONS.items() if (source, published) == (current, event)]
    if not targets:
        raise IllegalTransition(f"an instance cannot publish {event} from {current}")
    (target,) = targets
    return target


def status_of(phase: Phase) -> InstanceStatus:
    return InstanceStatus.RUNNING if phase in RUNNING else InstanceStatus.STOPPED


def mermaid() -> str:
    """The life cycle as a Mermaid diagram, from TRANSITIONS: each arrow labelled with the event it publishes."""
    lines = ["stateDiagram-v2", f"    [*] --> {FIRST}"]
    lines += [f"    {source} --> {target}: {event}" for (source, target), event in TRANSITIONS.items()]
    lines += [f"    {phase} --> [*]" for phase in Phase if not any(source is phase for source, _ in TRANSITIONS)]
    return "\n".join(lines)
