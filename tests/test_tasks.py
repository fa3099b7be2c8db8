"""`api.tasks`: `first_to_finish` (the first contender decides, the others are cancelled before it returns) and
`Background` (tasks held until they end, failures logged)."""

import asyncio
import contextlib
import gc
import logging

import pytest

from api.tasks import Background, first_to_finish


async def _forever(cancelled: list[str], name: str) -> str:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        cancelled.append(name)
        raise
    return name


async def _after(delay: float, value: str) -> str:
    await asyncio.sleep(delay)
    return value


async def test_the_first_result_wins_and_the_others_are_cancelled_before_it_returns() -> None:
    cancelled: list[str] = []
    assert await first_to_finish(_forever(cancelled, "slow"), _after(0.01, "fast")) == "fast"
    assert cancelled == ["slow"]


async def test_the_first_exception_is_raised_as_it_is() -> None:
    cancelled: list[str] = []

    async def fail() -> str:
        raise LookupError("first")

    with pytest.raises(LookupError, match="first"):
        await first_to_finish(_forever(cancelled, "other"), fail())
    assert cancelled == ["other"]


async def test_a_later_failure_does_not_replace_the_winner() -> None:
    async def fail_later() -> str:
        await asyncio.sleep(0.02)
        raise LookupError("late")

    assert await first_to_finish(_after(0, "early"), fail_later()) == "early"


def test_a_race_decided_by_a_failure_as_its_caller_is_cancelled_leaves_no_unretrieved_exception() -> None:
    """The launcher's DELETE: an instance's end decides a race (InstanceExited) as the one waiting on it is
    cancelled. asyncio complained, once the race was collected, that its exception was never retrieved."""
    complaints: list[str] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, context: complaints.append(context["message"]))

        async def cancel_the_caller_and_fail() -> str:
            await asyncio.sleep(0)
            race.cancel()
            raise LookupError("decided")

        race = asyncio.create_task(first_to_finish(_forever([], "other"), cancel_the_caller_and_fail()))
        with contextlib.suppress(asyncio.CancelledError):
            await race
        assert race.cancelled()

    asyncio.run(scenario())  # a loop of its own: the race and its frames go with it
    gc.collect()
    assert complaints == []


async def test_cancelling_the_race_cancels_every_contender() -> None:
    cancelled: list[str] = []
    race = asyncio.create_task(first_to_finish(_forever(cancelled, "a"), _forever(cancelled, "b")))
    await asyncio.sleep(0.01)
    race.cancel()
    with pytest.raises(asyncio.CancelledError):
        await race
    assert sorted(cancelled) == ["a", "b"]


async def test_background_holds_its_tasks_until_they_end_and_logs_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    background = Background()
    release = asyncio.Event()

    async def fail() -> None:
        await release.wait()
        raise RuntimeError("the copy could not be freed")

    task = background.start(fail(), name="free the copy")
    release.set()
    with caplog.at_level(logging.ERROR, logger="api.tasks"):
        await background.wait()
    assert task.done()
    assert [(r.getMessage(), str(r.exc_info[1]) if r.exc_info else "") for r in caplog.records] == [
        ("background task free the copy failed", "the copy could not be freed")
    ]


async def test_background_cancel_cancels_what_still_runs() -> None:
    background = Background()
    cancelled: list[str] = []
    task = background.start(_forever(cancelled, "supervisor"))
    await asyncio.sleep(0)
    background.cancel()
    await background.wait()
    assert task.cancelled()
    assert cancelled == ["supervisor"]


async def test_background_stop_cancels_what_still_runs_and_returns_once_it_ended() -> None:
    background = Background()
    cancelled: list[str] = []
    tasks = [background.start(_forever(cancelled, name)) for name in ("heartbeat", "pod sync")]
    await asyncio.sleep(0)
    await background.stop()
    assert all(task.cancelled() for task in tasks)
    assert sorted(cancelled) == ["heartbeat", "pod sync"]
