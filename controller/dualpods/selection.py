"""Which launcher serves a requester, and which instances must go to make room (FMA's P1/P2/P3).

P1: a launcher already holding the wanted instance (a hot start). P2: a launcher with room and no
instance on the wanted port. P3: reclaim — delete every instance on the wanted port and the least
recently used others until the launcher has room; the plan with the fewest victims wins, then the one
whose victims were used longest ago. Recency is the instance's revision: the launcher bumps it on
every change, so a lower revision was touched less recently, and that order survives restarts.

Equally good launchers (the spares of a Node, all empty) are ranked by a hash of the requester and the
launcher (rendezvous hashing): the same requester always gets the same one, so two passes over the same
cache agree, while requesters that arrive together spread over them instead of all claiming the first
name and losing the bind write to each other (409 conflicts, one retried pass each).
"""

import hashlib
from collections.abc import Collection
from dataclasses import dataclass

from api.launcher import InstanceState
from controller.instance_probe import instance_port


@dataclass(frozen=True)
class Candidate:
    """An unbound launcher whose instances are known; `running` excludes stopped instances."""

    name: str
    running: list[InstanceState]


@dataclass(frozen=True)
class Plan:
    launcher: str
    priority: str  # "P1", "P2" or "P3"
    victims: list[str]  # instance IDs to delete before binding
    oldest_victim_revision: int = 0


def plan_for(
    candidate: Candidate, instance_id: str, port: int, max_instances: int, first: Collection[str] = ()
) -> Plan:
    """The plan for one launcher; among the instances to reclaim, those in `first` (sleepers a warm pool does
    not need: sleepers.first_to_go) go before the least recently used."""
    if any(state.instance_id == instance_id for state in candidate.running):
        return Plan(candidate.name, "P1", [])
    max_others = max_instances - 1
    conflicts = [s for s in candidate.running if instance_port(s) == port]
    others = sorted(
        (s for s in candidate.running if instance_port(s) != port),
        key=lambda s: (s.instance_id not in first, s.revision),
    )
    if not conflicts and len(candidate.running) <= max_others:
        return Plan(candidate.name, "P2", [])
    to_delete = max(len(candidate.running) - max_others, 1)
    victims = conflicts + others[: max(0, to_delete - len(conflicts))]
    return Plan(
        candidate.name,
        "P3",
        [v.instance_id for v in victims],
        oldest_victim_revision=min(v.revision for v in victims),
    )


def choose(
    candidates: list[Candidate],
    instance_id: str,
    port: int,
    max_instances: int,
    requester: str,
    first: Collection[str] = (),
) -> Plan | None:
    """The best plan over all candidates for `requester` (its UID: ties are spread by it), or None when
    there is no candidate."""
    plans = [plan_for(c, instance_id, port, max_instances, first) for c in candidates]
    if not plans:
        return None
    return min(
        plans,
        key=lambda p: (
            p.priority,
            len(p.victims),
            p.oldest_victim_revision,
            len(next(c.running for c in candidates if c.name == p.launcher)),
            tie_rank(requester, p.launcher),
            p.launcher,
        ),
    )


def tie_rank(requester: str, launcher: str) -> bytes:
    """The requester's own order of equally good launchers: stable, and different for each requester."""
    return hashlib.blake2b(f"{requester}/{launcher}".encode(), digest_size=8).digest()
