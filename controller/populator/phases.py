"""What state each launcher Pod is in, for `fma_launcher_pod_count` and for stuck detection.

A launcher is bound while its `requester` annotation names a requester; otherwise it is stale when
its template hash is not its LauncherConfig's current one; otherwise it is stuck when it has not
become Ready within a threshold — since creation while unscheduled (`stuck_scheduling`), since the
PodScheduled transition once scheduled (`stuck_starting`, so time in the scheduler queue is not
blamed on start-up) — and plain unbound before that.
"""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from api import keys
from controller import pods
from controller.launcher_template import Pod


class LauncherPodPhase(StrEnum):
    BOUND = "bound"
    UNBOUND = "unbound"
    STUCK_SCHEDULING = "stuck_scheduling"
    STUCK_STARTING = "stuck_starting"
    STALE = "stale"


STUCK = frozenset({LauncherPodPhase.STUCK_SCHEDULING, LauncherPodPhase.STUCK_STARTING})


@dataclass(frozen=True)
class Thresholds:
    """Seconds a launcher on the current template may take before it counts as stuck."""

    scheduling: float
    starting: float


def template_hash(pod: Pod) -> str | None:
    hash_: str | None = pod["metadata"].get("annotations", {}).get(keys.LAUNCHER_TEMPLATE_HASH_ANNOTATION)
    return hash_


def scheduled_at(pod: Pod) -> str | None:
    """When the scheduler placed the launcher (its True PodScheduled condition's transition), None until then."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    placed = next((c for c in conditions if c.get("type") == "PodScheduled" and c.get("status") == "True"), None)
    return str(placed["lastTransitionTime"]) if placed is not None and placed.get("lastTransitionTime") else None


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


def phase_of(
    pod: Pod, current_hash: str | None, thresholds: Thresholds, now: datetime
) -> tuple[LauncherPodPhase, datetime | None]:
    """The launcher's phase and, while it may still become stuck, when it will (None otherwise).

    `current_hash` is None while the LauncherConfig is missing or malformed: every unbound launcher
    is then stale.
    """
    if pods.binding(pod) is not None:  # the authoritative record of a binding
        return LauncherPodPhase.BOUND, None
    if current_hash is None or template_hash(pod) != current_hash:
        return LauncherPodPhase.STALE, None
    if pods.is_ready(pod):
        return LauncherPodPhase.UNBOUND, None
    scheduled = scheduled_at(pod)
    if scheduled is not None:
        since, threshold, stuck = _time(scheduled), thresholds.starting, LauncherPodPhase.STUCK_STARTING
    else:
        since, threshold, stuck = (
            _time(pod["metadata"]["creationTimestamp"]),
            thresholds.scheduling,
            LauncherPodPhase.STUCK_SCHEDULING,
        )
    due = since + timedelta(seconds=threshold)
    return (stuck, None) if now >= due else (LauncherPodPhase.UNBOUND, due)


def tally(
    launchers: Iterable[Pod], current_hash: str | None, thresholds: Thresholds, now: datetime
) -> tuple[Counter[LauncherPodPhase], datetime | None]:
    """Launchers per phase, and the earliest moment one of them (not deleting) becomes stuck."""
    counts: Counter[LauncherPodPhase] = Counter()
    earliest: datetime | None = None
    for pod in launchers:
        phase, due = phase_of(pod, current_hash, thresholds, now)
        counts[phase] += 1
        if due is not None and not pods.is_deleting(pod) and (earliest is None or due < earliest):
            earliest = due
    return counts, earliest
