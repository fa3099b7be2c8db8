"""Structured concurrency helpers shared by the components (one async dialect: TaskGroup, never a dangling task).

`first_to_finish` is the race several components run: "do this until that happens", "whichever watcher
reaches a verdict first". Its tasks live in a TaskGroup, so none outlives the call.
"""

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def first_to_finish(*contenders: Awaitable[T]) -> T:
    """Runs `contenders` concurrently; the first to finish decides: its result is returned, or its exception
    raised as it is (not in an ExceptionGroup). The others are cancelled and awaited before this returns."""
    winner: asyncio.Future[T] = asyncio.get_running_loop().create_future()

    async def contend(contender: Awaitable[T]) -> None:
        try:
            result = await contender
        except Exception as err:  # the race's outcome, not the group's failure
            if not winner.done():
                winner.set_exception(err)
        else:
            if not winner.done():
                winner.set_result(result)

    async with asyncio.TaskGroup() as group:
        running = [group.create_task(contend(contender)) for contender in contenders]
        try:
            await asyncio.wait([winner])  # not `await winner`: the group would wrap its exception in a group
        finally:
            for task in running:
                task.cancel()
    return winner.result()
