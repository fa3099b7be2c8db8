"""Steps return outcomes (controller/dualpods/outcomes.py), and each phase has a budget (phases.py): a wait or
a transient failure that stands past it becomes the requester's status error and an ActuationProblem Event;
a pass counts in dualpods_passes_total by phase and result."""

from collections.abc import AsyncIterator

import pytest

from controller import pods
from controller.dualpods.outcomes import DONE, Wait, sooner
from controller.dualpods.phases import LAUNCHER_START_BUDGET, ROW, Phase
from controller.http import HttpError
from tests.results import again, backs_off
from tests.test_dualpods_fakes import (
    LAUNCHER,
    REQ,
    Harness,
    harness,
    isc_obj,
    lc_obj,
    node_obj,
    status_errors,
)
from tests.test_dualpods_phases import setup_creating, setup_launcher_starting


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with harness() as made:
        made.put(node_obj(), isc_obj(), lc_obj())
        yield made


def age_trouble(h: Harness, seconds: float) -> None:
    """Make the requester's standing trouble `seconds` older (as if that long had passed)."""
    uid = pods.uid(h.pod(REQ))
    trouble = h.reconciler.memory.troubles[uid]
    h.reconciler.memory.troubles[uid] = trouble._replace(since=trouble.since - seconds)


def problems(h: Harness) -> list[str]:
    return [c.detail[2] for c in h.journal.of("event") if c.detail[1] == "ActuationProblem"]


async def test_a_launcher_that_never_answers_becomes_a_status_error_and_an_event_within_its_budget(
    h: Harness,
) -> None:
    setup_launcher_starting(h)
    after_s = again(await h.reconcile())
    assert after_s is not None
    assert after_s <= LAUNCHER_START_BUDGET.seconds
    assert h.metric("dualpods_passes_total", phase="launcher-starting", result="wait") == 1
    assert problems(h) == []
    age_trouble(h, LAUNCHER_START_BUDGET.seconds)
    await h.reconcile()
    why = (
        f"launcher {LAUNCHER} does not answer (it is not Ready, or its instances cannot be listed) "
        f"(for more than {LAUNCHER_START_BUDGET.seconds:.0f} s)"
    )
    assert status_errors(h.pod(REQ)) == [why]
    assert problems(h) == [why]
    await h.reconcile()  # the problem stands: no second Event, no second write
    assert problems(h) == [why]


async def test_a_transient_failure_is_retried_and_reported_only_past_its_budget(h: Harness) -> None:
    setup_creating(h)
    h.launchers.refusal = HttpError("create_instance", "http://127.0.1.1:8001/v2/vllm/instances/x", None,
                                    TimeoutError())  # fmt: skip
    budget = ROW[Phase.CREATING].budget
    for _ in range(budget.retries):
        assert backs_off(await h.reconcile())
    assert problems(h) == []  # retried, but not for long yet
    age_trouble(h, budget.seconds)
    assert backs_off(await h.reconcile())  # still retried with back-off, and now reported
    (error,) = status_errors(h.pod(REQ)) or []
    assert error.startswith("creating: create_instance: ")
    assert error.endswith(f"(for more than {budget.seconds:.0f} s)")
    assert problems(h) == [error]
    assert h.metric("dualpods_passes_total", phase="creating", result="error") == budget.retries + 1
    h.launchers.refusal = None
    await h.reconcile()  # the launcher answers again: the error is gone from the status
    assert status_errors(h.pod(REQ)) is None


def test_a_step_and_a_relay_wait_for_the_sooner_time_for_the_steps_reason() -> None:
    step, relay = Wait(None, "launcher l does not answer"), Wait(10.0, "requester r does not show it is not ready")
    assert sooner(step, relay) == Wait(10.0, "launcher l does not answer")
    assert sooner(step, DONE) == step
    assert sooner(DONE, relay) == relay
    assert sooner(DONE, DONE) == DONE
    assert sooner(Wait(3.0, "a"), Wait(5.0, "b")) == Wait(3.0, "a")
