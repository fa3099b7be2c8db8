"""One model thread fed by one queue: generation, adapter changes, sleep and wake never overlap.

Requests are admitted at the door — refused with 429 when too many already wait, held while the
engine sleeps (up to `sleep_wait_timeout`, then 503) — and queued; a single worker runs them one at
a time on the model thread, so the event loop stays free for `/health` and `/metrics`. The `n`
sequences of a request are decoded as one batch; separate requests are not batched together.

Sleep follows vLLM: the door closes first, then `mode=abort` (vLLM's default) aborts the running
and queued requests (they end with finish_reason "abort") while `mode=wait` lets them finish; only
then do the weights move. Waking reopens the door once every slept tag is awake.
"""

import asyncio
import contextlib
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Generic, Literal, TypeVar

from api.openai_errors import ApiError

from .generation import Delta, SamplingParams, generate
from .lora import Adapter, AdapterSlots
from .model import ModelHolder
from .sleep import HostCopy, SleepManager
from .text import TextCodec

log = logging.getLogger("transformers_runtime")
T = TypeVar("T")
SleepMode = Literal["abort", "wait"]
RETRY_AFTER_S = 1


class Job(ABC):
    """Work for the model thread: `run` executes there and returns its outcome, which `deliver` hands to
    the waiter back on the loop (after the engine has counted the job as finished, so a client that
    gets its answer never sees it still counted as running); `abandon` runs on the loop when it never will."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._aborted = threading.Event()

    def abort(self) -> None:
        """Stop as soon as possible (between two tokens), or never start; a finished job ignores it."""
        self._aborted.set()

    @property
    def aborted(self) -> bool:
        return self._aborted.is_set()

    @abstractmethod
    def run(self) -> object: ...

    @abstractmethod
    def deliver(self, outcome: object) -> None: ...

    @abstractmethod
    def abandon(self) -> None: ...


@dataclass(frozen=True)
class _Returned(Generic[T]):
    value: T


@dataclass(frozen=True)
class _Raised:
    error: Exception


class CallJob(Job, Generic[T]):
    """A function to call on the model thread, its result (or exception) delivered to `result()`."""

    def __init__(self, function: Callable[[], T]) -> None:
        super().__init__()
        self._function = function
        self._future: asyncio.Future[T] = self._loop.create_future()

    def run(self) -> _Returned[T] | _Raised:
        try:
            return _Returned(self._function())
        except Exception as error:
            return _Raised(error)

    def deliver(self, outcome: object) -> None:
        if isinstance(outcome, _Raised):
            self._reject(outcome.error)
        elif isinstance(outcome, _Returned) and not self._future.done():  # done: the waiter went away
            self._future.set_result(outcome.value)

    def _reject(self, error: Exception) -> None:
        if not self._future.done():
            self._future.set_exception(error)

    def abandon(self) -> None:
        self._reject(ApiError(503, "The request was aborted: the engine was put to sleep or is shutting down."))

    async def result(self) -> T:
        return await self._future


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    max_tokens: int


@dataclass(frozen=True)
class Failed:
    message: str


class Done:
    """The last event of a generation job."""


@dataclass(frozen=True)
class ModelContext:
    """What a generation job uses on the model thread."""

    holder: ModelHolder
    codec: TextCodec
    slots: AdapterSlots


class GenerationJob(Job):
    """Every prompt's n sequences; their deltas, then `Done` (or `Failed`), arrive through `events()`."""

    def __init__(
        self, context: ModelContext, prompts: list[Prompt], params: SamplingParams, adapter: Adapter | None
    ) -> None:
        super().__init__()
        self._context = context
        self.prompts = prompts
        self.params = params
        self._adapter = adapter
        self._events: asyncio.Queue[Delta | Failed | Done] = asyncio.Queue()

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.params.n

    def _post(self, event: Delta | Failed | Done) -> None:
        self._loop.call_soon_threadsafe(self._events.put_nowait, event)

    def run(self) -> Failed | Done:
        """Posts each delta as it is made; the last event (`Done` or `Failed`) is the outcome."""
        try:
            model = self._context.holder.module
            self._context.slots.activate(model, self._adapter)
            for number, prompt in enumerate(self.prompts):
                generate(
                    model,
                    self._context.codec,
                    prompt.token_ids,
                    prompt.max_tokens,
                    self.params,
                    self._post,
                    self._aborted.is_set,
                    index_base=number * self.params.n,
                )
        except ApiError as error:  # e.g. the adapter could not be attached again
            return Failed(error.message)
        except Exception as error:
            log.exception("generation failed")
            return Failed(f"{type(error).__name__}: {error}")
        return Done()

    def deliver(self, outcome: object) -> None:
        assert isinstance(outcome, Failed | Done)
        self._events.put_nowait(outcome)

    def abandon(self) -> None:
        for index in range(self.choices):
            self._events.put_nowait(Delta(index, "", "abort"))
        self._events.put_nowait(Done())

    async def events(self) -> AsyncIterator[Delta | Failed | Done]:
        while True:
            event = await self._events.get()
            yield event
            if not isinstance(event, Delta):
                return


class Engine:
    """The door, the queue and the model thread of one server (see the module's docstring)."""

    def __init__(self, sleep: SleepManager, max_waiting: int, sleep_wait_timeout: float) -> None:
        self._sleep = sleep
        self.max_waiting = max_waiting
        self.sleep_wait_timeout = sleep_wait_timeout
        self.waiting = 0  # admitted or held, not started
        self.running = 0
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="model")
        self._queue: asyncio.Queue[Job] = asyncio.Queue()
        self._open = asyncio.Event()  # the door: set while awake
        self._open.set()
        self._closed = False
        self._transition = asyncio.Lock()  # one sleep or wake at a time
        self._current: Job | None = None
        self._worker: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    @property
    def is_sleeping(self) -> bool:
        return self._sleep.is_sleeping

    @property
    def sleep_level(self) -> int | None:
        return self._sleep.level

    def start(self) -> None:
        self._worker = asyncio.create_task(self._work(), name="model-worker")

    async def in_thread(self, function: Callable[[], T]) -> T:
        """Run `function` on the model thread (callers make sure no job runs there meanwhile)."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, function)

    async def submit(self, job: Job) -> None:
        """Queue `job` for the model thread: 429 when too many wait, held while asleep (503 after the timeout)."""
        if self.waiting >= self.max_waiting:
            raise ApiError(
                429,
                f"Too many requests are waiting ({self.waiting}); retry later.",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        self.waiting += 1
        try:
            await self._admission()
        except BaseException:
            self.waiting -= 1
            raise
        self._queue.put_nowait(job)

    async def _admission(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.sleep_wait_timeout
        while not self._open.is_set():
            try:
                await asyncio.wait_for(self._open.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise ApiError(
                    503,
                    f"The model is asleep and was not woken within {self.sleep_wait_timeout:g} s; retry later.",
                ) from None
        if self._closed:
            raise ApiError(503, "The server is shutting down.")

    async def call(self, function: Callable[[], T]) -> T:
        """`function` on the model thread, queued like a request (so it waits while asleep)."""
        job = CallJob(function)
        await self.submit(job)
        return await job.result()

    async def _work(self) -> None:
        while True:
            job = await self._queue.get()
            self.waiting -= 1
            try:
                if job.aborted:
                    job.abandon()
                    continue
                self._current = job
                self.running += 1
                try:
                    outcome = await self.in_thread(job.run)
                finally:
                    self.running -= 1
                    self._current = None
                job.deliver(outcome)
            finally:
                self._queue.task_done()

    def _abort_all(self) -> None:
        if self._current is not None:
            self._current.abort()
        while not self._queue.empty():
            job = self._queue.get_nowait()
            self.waiting -= 1
            job.abort()
            job.abandon()
            self._queue.task_done()

    async def sleep(self, level: int, mode: SleepMode) -> None:
        """Close the door, abort or finish what is queued (`mode`), then sleep at `level` on the model thread."""
        async with self._transition:
            self._open.clear()
            try:
                if mode == "abort":
                    self._abort_all()
                await self._queue.join()
                await self.in_thread(partial(self._sleep.sleep, level))
            finally:
                if not self._sleep.is_sleeping and not self._closed:
                    self._open.set()

    async def wake_up(self, tags: Collection[str] | None) -> bool:
        """Wake `tags` (all by default); True, and the door open, once nothing sleeps any more."""
        async with self._transition:
            if not self._sleep.is_sleeping:  # nothing to do: do not wait behind a running generation
                return True
            awake = await self.in_thread(partial(self._sleep.wake, tags))
            retired = self._sleep.take_retired()
            if retired is not None:
                self._release_later(retired)
            if awake and not self._closed:
                self._open.set()
            return awake

    def _release_later(self, host: HostCopy) -> None:
        """Unpin and free the host copy after answering: the wake's latency is the copy, not the cleanup."""
        task = asyncio.create_task(asyncio.to_thread(host.release))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """Abort everything, release held requests with 503, and wait for the model thread to stop."""
        self._closed = True
        self._open.set()
        self._abort_all()
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        await asyncio.to_thread(self._thread.shutdown, True, cancel_futures=True)
        await asyncio.gather(*self._background)
