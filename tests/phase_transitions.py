"""The transition recorder: every pass the unit tests run (`Harness.reconcile`, which `Harness.drive` repeats) is
checked against the phase table's declared edges (controller/dualpods/phases.py).

The phase is observed right before the pass and right after it, before the test changes anything, so a change
between the two is one the pass's step brought about: a change the table does not declare fails the test that
made it, at once (removing a declared edge that a test crosses fails the suite). At the end of the session
tests/conftest.py lists the declared edges no test crossed, so the drawing's arrows are what passes really do.
"""

from collections import Counter
from dataclasses import dataclass, field
from typing import TypedDict

from controller.dualpods.phases import Phase, edges


class UndeclaredTransition(AssertionError):
    """A pass led from one phase to another that the phase table does not declare."""


class Exported(TypedDict):
    """A recorder's findings as plain values: what a pytest-xdist worker hands its controller (execnet
    carries nothing else)."""

    passes: int
    seen: list[tuple[str, str, int]]
    tests_by_phase: dict[str, list[str]]


@dataclass
class TransitionRecorder:
    declared: set[tuple[Phase, Phase]]
    seen: Counter[tuple[Phase, Phase]] = field(default_factory=Counter)
    passes: int = 0  # passes recorded, so a session that drove none lists nothing
    test: str = ""  # the running test (set by tests/conftest.py)
    tests_by_phase: dict[Phase, set[str]] = field(default_factory=dict)  # the step tests of each phase, by runs

    def record(self, requester: str, before: Phase, after: Phase) -> None:
        """A pass of `requester` ran `before`'s step and left it in phase `after`."""
        self.passes += 1
        self.tests_by_phase.setdefault(before, set()).add(self.test)
        if before is after:
            return
        if (before, after) not in self.declared:
            raise UndeclaredTransition(
                f"requester {requester}: {before.value} → {after.value} is not declared in the phase table "
                f"(add {after.name} to the leads_to of {before.name}'s row, if the step really brings it about)"
            )
        self.seen[(before, after)] += 1

    def exported(self) -> Exported:
        return {
            "passes": self.passes,
            "seen": [(before.value, after.value, count) for (before, after), count in self.seen.items()],
            "tests_by_phase": {phase.value: sorted(tests) for phase, tests in self.tests_by_phase.items()},
        }

    def merge(self, other: Exported) -> None:
        """Add a worker's findings, so that the controller lists what the whole session exercised."""
        self.passes += other["passes"]
        for before, after, count in other["seen"]:
            self.seen[(Phase(before), Phase(after))] += count
        for phase, tests in other["tests_by_phase"].items():
            self.tests_by_phase.setdefault(Phase(phase), set()).update(tests)

    def unseen(self) -> list[tuple[Phase, Phase]]:
        """The declared edges no recorded pass exercised, in the table's order."""
        order = {phase: i for i, phase in enumerate(Phase)}
        return sorted(self.declared - set(self.seen), key=lambda e: (order[e[0]], order[e[1]]))


RECORDER = TransitionRecorder(edges())
