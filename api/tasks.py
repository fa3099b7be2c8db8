"""Structured concurrency helpers shared by the components (one async dialect: TaskGroup, never a dangling task).

`first_to_finish` is the race several components run: "do this until that happens", "whichever watcher
reaches a verdict first". Its tasks live in a TaskGroup, so none outlives the call. `Background` owns the tasks
that cannot live in one caller's TaskGroup because nobody waits for them where they start (a clean-up after an
answer went out, a removal a synchronous method asks for): it keeps each alive until it ends, logs a failure,
and lets its owner wait for them all.
"""

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

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
            if winner.done():  # read even when the caller was cancelled: asyncio warns of an exception never read
                winner.exception()
    return winner.result()


class Background:
    """Tasks started now and awaited later, all together: each is held until it ends (the event loop keeps only
    weak references to tasks), and a failure is logged when it happens."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self, coroutine: Coroutine[Any, Any, T], name: str | None = None) -> "asyncio.Task[T]":
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: "asyncio.Task[Any]") -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("background task %s failed", task.get_name(), exc_info=error)

    def cancel(self) -> None:
        """Cancel what still runs (its end is logged as it comes, if a failure)."""
        for task in self._tasks:
            task.cancel()

    async def wait(self) -> None:
        """Until every task started so far has ended (their failures were logged, not raised here)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self) -> None:
        """Cancel what still runs, and wait until all of it has ended (an owner's shutdown)."""
        self.cancel()
        await self.wait()
