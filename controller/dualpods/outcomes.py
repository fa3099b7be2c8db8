"""What a step returns: the work queue's `Result` (kube/workqueue.py), read as a phase's step reads it.
Exceptions are left for the unexpected; a pass treats those it expects (a launcher or an API server that does
not answer, a conflict) as transient: a back-off.

- `Done`: the step made its change (or had none to make); the event that change causes brings the next pass.
- `Wait(after_s, why)`: not yet; look again after `after_s` seconds (None: an event will bring the pass), and
  `why` says what is awaited, which becomes the requester's status error if the wait outlasts its phase's
  budget.
- `Problem(errors, retry)`: something the user must see in the requester's status; `retry` says whether
  trying again (with the queue's back-off) can help, or only a change to some watched object can (terminal:
  the requester is looked at again when that object changes).

A phase's `TimeBudget` bounds how long a standing trouble stays out of the requester's status: a wait, or a
transient failure retried again and again (say, a launcher that does not answer), becomes a status error and
an Event once it has stood `seconds` (and, for failures, `retries` failed passes).
"""

from dataclasses import dataclass

from kube.workqueue import DONE, Done, Problem, Result, Wait, sooner

__all__ = ["DONE", "Done", "Problem", "StepResult", "TimeBudget", "Wait", "sooner"]

StepResult = Result


@dataclass(frozen=True)
class TimeBudget:
    """How long a phase's trouble may stand before the user is told: a wait after `seconds`, a transient
    failure after `seconds` and `retries` failed passes (so one hiccup retried at once is never reported)."""

    seconds: float = 120.0
    retries: int = 5
