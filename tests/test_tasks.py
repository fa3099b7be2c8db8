"""`api.tasks.first_to_finish`: the first contender decides, the others are cancelled before it returns."""

import asyncio

import pytest

from api.tasks import first_to_finish


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


async def test_cancelling_the_race_cancels_every_contender() -> None:
    cancelled: list[str] = []
    race = asyncio.create_task(first_to_finish(_forever(cancelled, "a"), _forever(cancelled, "b")))
    await asyncio.sleep(0.01)
    race.cancel()
    with pytest.raises(asyncio.CancelledError):
        await race
    assert sorted(cancelled) == ["a", "b"]
