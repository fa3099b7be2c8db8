"""FMA's launcher selection (P1 / P2 / P3, fma.md §2.7) as a pure planning step: `choose` and `plan_for`.

Recency is the instance's launcher `revision` (lower = used longer ago), so "least recently used" is
"lowest revision".
"""

import collections
from dataclasses import dataclass

import pytest

from api import keys
from api.launcher import InstanceState, InstanceStatus
from controller.dualpods.selection import Candidate, Plan, choose, plan_for
from controller.instance_probe import instance_port

WANTED = "Iwantedi"
PORT = 8005
REQUESTER = "2f0c5a8e-requester-uid"


def inst(instance_id: str, port: int | str | None = PORT, revision: int = 1) -> InstanceState:
    """A sleeping instance on `port` (None: no `inference-port` annotation at all)."""
    annotations = {keys.INSTANCE_ISC_NAME: "some-isc"}
    if port is not None:
        annotations[keys.INSTANCE_INFERENCE_PORT] = str(port)
    return InstanceState(
        status=InstanceStatus.RUNNING,
        instance_id=instance_id,
        revision=revision,
        options=f"--port {port}",
        annotations=annotations,
        ready=True,
        sleeping=True,
    )


def launcher(name: str, *instances: InstanceState) -> Candidate:
    return Candidate(name, list(instances))


@dataclass(frozen=True)
class Case:
    id: str
    candidates: list[Candidate]
    max_instances: int
    expected: Plan | None


CASES = [
    Case("no candidates: no plan (the caller creates a launcher)", [], 2, None),
    Case(
        "P1: the launcher holding the wanted instance wins over an empty one",
        [launcher("a-empty"), launcher("b-holder", inst(WANTED), inst("other", port=8006))],
        2,
        Plan("b-holder", "P1", []),
    ),
    Case(
        "P1 even when that launcher is at its cap: nothing new is created there",
        [launcher("a", inst(WANTED), inst("x", port=8006), inst("y", port=8007))],
        2,
        Plan("a", "P1", []),
    ),
    Case(
        "P2: room and no instance on the wanted port",
        [launcher("a", inst("x", port=8006))],
        2,
        Plan("a", "P2", []),
    ),
    Case(
        "P2 with maxInstances 1 on an empty launcher",
        [launcher("a")],
        1,
        Plan("a", "P2", []),
    ),
    Case(
        "P2 prefers the launcher with fewer instances",
        [launcher("a", inst("x", port=8006)), launcher("b")],
        3,
        Plan("b", "P2", []),
    ),
    Case(
        "P2 beats P3 on another launcher",
        [launcher("a", inst("conflict", port=PORT)), launcher("b", inst("x", port=8006))],
        2,
        Plan("b", "P2", []),
    ),
    Case(
        "P3: a port conflict is reclaimed even with room to spare",
        [launcher("a", inst("conflict", port=PORT, revision=9), inst("x", port=8006, revision=1))],
        3,
        Plan("a", "P3", ["conflict"], oldest_victim_revision=9),
    ),
    Case(
        "P3: at the cap, the least recently used (lowest revision) goes",
        [launcher("a", inst("new", port=8006, revision=7), inst("old", port=8007, revision=3))],
        2,
        Plan("a", "P3", ["old"], oldest_victim_revision=3),
    ),
    Case(
        "P3: over the cap, enough LRU instances go to leave room for one",
        [
            launcher(
                "a",
                inst("r5", port=8001, revision=5),
                inst("r2", port=8002, revision=2),
                inst("r9", port=8003, revision=9),
                inst("r4", port=8004, revision=4),
            )
        ],
        2,
        Plan("a", "P3", ["r2", "r4", "r5"], oldest_victim_revision=2),
    ),
    Case(
        "P3: a port conflict counts toward the instances that must go",
        [launcher("a", inst("conflict", port=PORT, revision=8), inst("x", port=8006, revision=1))],
        2,
        Plan("a", "P3", ["conflict"], oldest_victim_revision=8),
    ),
    Case(
        "P3: maxInstances 1 evicts the only instance",
        [launcher("a", inst("x", port=8006, revision=4))],
        1,
        Plan("a", "P3", ["x"], oldest_victim_revision=4),
    ),
    Case(
        "P3: fewest victims wins across launchers",
        [
            launcher(
                "a",
                inst("a1", port=8001, revision=1),
                inst("a2", port=8002, revision=2),
                inst("a3", port=8003, revision=3),
            ),
            launcher("b", inst("b1", port=8001, revision=8), inst("b2", port=8002, revision=9)),
        ],
        2,
        Plan("b", "P3", ["b1"], oldest_victim_revision=8),
    ),
    Case(
        "P3: equal victims, the older LRU victim wins",
        [
            launcher("a", inst("a1", port=8001, revision=6), inst("a2", port=8002, revision=7)),
            launcher("b", inst("b1", port=8001, revision=5), inst("b2", port=8002, revision=9)),
        ],
        2,
        Plan("b", "P3", ["b1"], oldest_victim_revision=5),
    ),
    Case(
        "an instance without a usable inference-port never counts as a port conflict",
        [launcher("a", inst("no-port", port=None), inst("bad-port", port="http"))],
        3,
        Plan("a", "P2", []),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_choose(case: Case) -> None:
    assert choose(case.candidates, WANTED, PORT, case.max_instances, REQUESTER) == case.expected


def test_plan_for_each_candidate_is_independent_of_the_others() -> None:
    holder = launcher("a", inst(WANTED))
    assert plan_for(holder, WANTED, PORT, 2) == Plan("a", "P1", [])
    assert plan_for(launcher("b", inst("x", port=PORT, revision=3)), WANTED, PORT, 2) == Plan(
        "b", "P3", ["x"], oldest_victim_revision=3
    )


def test_ties_are_the_same_for_one_requester_and_spread_over_requesters() -> None:
    """Deterministic: two workers (or two passes) looking at the same cache choose the same launcher for a
    requester, whatever the order of the cache; requesters arriving together spread over equal launchers."""
    candidates = [launcher(name) for name in "abcd"]
    chosen = choose(candidates, WANTED, PORT, 2, REQUESTER)
    assert chosen is not None
    assert chosen.priority == "P2"
    assert choose(list(reversed(candidates)), WANTED, PORT, 2, REQUESTER) == chosen
    spread = collections.Counter(
        plan.launcher for i in range(400) if (plan := choose(candidates, WANTED, PORT, 2, f"uid-{i}")) is not None
    )
    assert set(spread) == set("abcd")
    assert max(spread.values()) < 2 * min(spread.values())


def test_a_tie_never_beats_a_better_plan() -> None:
    """Emptier launchers first, whatever the hash says."""
    candidates = [launcher("a", inst("x", port=8006)), launcher("b")]
    for i in range(50):
        assert choose(candidates, WANTED, PORT, 3, f"uid-{i}") == Plan("b", "P2", [])


@pytest.mark.parametrize(
    ("port", "expected"),
    [(8005, 8005), ("8005", 8005), (None, None), ("", None), ("http", None), ("80.5", None)],
)
def test_instance_port(port: int | str | None, expected: int | None) -> None:
    assert instance_port(inst("x", port=port)) == expected


def test_instance_port_without_any_annotations() -> None:
    state = InstanceState(status=InstanceStatus.RUNNING, instance_id="x", revision=1, options="")
    assert instance_port(state) is None
