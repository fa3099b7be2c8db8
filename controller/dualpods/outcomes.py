"""What a step returns: Done, Wait or Problem. Exceptions are left for the unexpected (a launcher or an API
server that does not answer, a conflict); the pass treats those as transient and retries with back-off.

- `Done`: the step made its change (or had none to make); the event that change causes brings the next pass.
- `Wait(after_s, why)`: not yet; look again after `after_s` seconds (None: an event will bring the pass), and
  `why` says what is awaited, which becomes the requester's status error if the wait outlasts its phase's
  budget.
- `Problem(errors, retry)`: something the user must see in the requester's status; `retry` says whether
  trying again (with the queue's back-off) can help, or only a change to some object can.

A phase's `Budget` bounds how long a standing trouble stays out of the requester's status: a wait, or a
transient failure retried again and again (say, a launcher that does not answer), becomes a status error and
an Event once it has stood `seconds` (and, for failures, `retries` failed passes).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Done:
    pass


@dataclass(frozen=True)
class Wait:
    after_s: float | None
    why: str


@dataclass(frozen=True)
class Problem:
    errors: tuple[str, ...]
    retry: bool = True

    @classmethod
    def of(cls, *errors: str, retry: bool = True) -> "Problem":
        return cls(errors, retry)


StepResult = Done | Wait | Problem
DONE = Done()


def sooner(a: Done | Wait, b: Done | Wait) -> Done | Wait:
    """The result of a step `a` followed by a part `b`: the sooner of their waits, for the reason of the first
    that waits (Done when neither does)."""
    if not isinstance(a, Wait):
        return b
    if not isinstance(b, Wait) or b.after_s is None:
        return a
    return Wait(b.after_s if a.after_s is None else min(a.after_s, b.after_s), a.why)


@dataclass(frozen=True)
class Budget:
    """How long a phase's trouble may stand before the user is told: a wait after `seconds`, a transient
    failure after `seconds` and `retries` failed passes (so one hiccup retried at once is never reported)."""

    seconds: float = 120.0
    retries: int = 5
