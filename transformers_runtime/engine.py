"""One model thread fed by one queue: generation, adapter changes, sleep and wake never overlap.

Requests are admitted at the door — refused with 429 when too many already wait, held while the
engine sleeps (up to `sleep_wait_timeout`, then 503) — and queued. The worker takes them in order
on the model thread, so the event loop stays free for `/health` and `/metrics`. Generation requests
run as one continuous batch (batch.py): between two decoding steps, the requests at the head of the
queue join the running batch while they use the batch's LoRA adapter (or none, like it) and their
sequences fit in `max_num_seqs`. The first request that does not — another adapter, or a call such
as a LoRA load — waits until the batch has drained and then runs, so nothing queued behind a busy
batch starves, and the order of the queue is kept across adapters.

Sleep follows vLLM: the door closes first, then `mode=abort` (vLLM's default) aborts the running
and queued requests (they end with finish_reason "abort") while `mode=wait` lets them finish; only
then do the weights move. Waking reopens the door once every slept tag is awake.
"""

import asyncio
import contextlib
import logging
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

from api.openai_errors import ApiError
from api.tasks import Background
from api.vllm_surface.bodies import SleepMode

from .batch import Batch, Prompt
from .generation import Delta
from .lora import Adapter, AdapterSlots
from .model import ModelHolder
from .sampling import SamplingParams
from .sleep import HostCopy, SleepManager
from .text import TextCodec

log = logging.getLogger("transformers_runtime")
T = TypeVar("T")
RETRY_AFTER_S = 1
CLOSE_GRACE_S = 1.0


class Queued(ABC):
    """Anything the queue holds: it can be aborted before or while it runs, and abandoned if it never will."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._aborted = threading.Event()

    def abort(self) -> None:
        """Stop as soon as possible (between two tokens), or never start; a finished one ignores it."""
        self._aborted.set()

    @property
    def aborted(self) -> bool:
        return self._aborted.is_set()

    @abstractmethod
    def abandon(self) -> None:
        """Answer the waiter on the loop: it will never run."""


class Job(Queued):
    """Work for the model thread, alone: `run` executes there and returns its outcome, which `deliver` hands to
    the waiter back on the loop (after the engine has counted the job as finished, so a client that
    gets its answer never sees it still counted as running)."""

    @abstractmethod
    def run(self) -> object: ...

    @abstractmethod
    def deliver(self, outcome: object) -> None: ...


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


class GenerationJob(Queued):
    """Every prompt's n sequences, run in a batch; deltas, then `Done` (or `Failed`), arrive through `events()`."""

    def __init__(self, prompts: list[Prompt], params: SamplingParams, adapter: Adapter | None) -> None:
        super().__init__()
        self.prompts = prompts
        self.params = params
        self.adapter = adapter
        self._events: asyncio.Queue[Delta | Failed | Done] = asyncio.Queue()
        self._stepped: list[Delta] = []  # posted during the running step, not yet flushed

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.params.n

    def post(self, delta: Delta) -> None:
        """A delta from the model thread, during a step; `flush` hands it over once the step is over.

        One hand-over per step, not one wake-up of the loop per delta: the model thread waits for the
        loop between two steps, so the fewer callbacks the loop has to run, the sooner the next step starts.
        """
        self._stepped.append(delta)

    def flush(self) -> None:
        """On the loop, between two steps: the deltas of the last step to `events()`."""
        for delta in self._stepped:
            self._events.put_nowait(delta)
        self._stepped.clear()

    def deliver(self, outcome: Failed | Done) -> None:
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

    def __init__(
        self,
        sleep: SleepManager,
        max_waiting: int,
        sleep_wait_timeout: float,
        context: ModelContext | None = None,
        max_num_seqs: int = 1,
    ) -> None:
        self._sleep = sleep
        self._context = context
        self.max_waiting = max_waiting
        self.max_num_seqs = max_num_seqs
        self.sleep_wait_timeout = sleep_wait_timeout
        self.waiting = 0  # admitted or held, not started
        self.running = 0
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="model")
        self._queue: deque[Queued] = deque()
        self._queued = asyncio.Event()  # set while the queue is not empty
        self._idle = asyncio.Event()  # set while nothing is queued or running
        self._idle.set()
        self._open = asyncio.Event()  # the door: set while awake
        self._open.set()
        self._closed = False
        self._transition = asyncio.Lock()  # one sleep or wake at a time
        self._current: list[Queued] = []  # what runs on the model thread now
        self._worker: asyncio.Task[None] | None = None
        self._background = Background()  # host copies being freed after a wake answered

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

    async def submit(self, job: Queued) -> None:
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
        self._queue.append(job)
        self._queued.set()
        self._idle.clear()

    async def _admission(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.sleep_wait_timeout
        while not self._open.is_set():
            try:
                async with asyncio.timeout_at(deadline):
                    await self._open.wait()
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

    def _take(self) -> Queued:
        job = self._queue.popleft()
        self.waiting -= 1
        if not self._queue:
            self._queued.clear()
        return job

    async def _work(self) -> None:
        while True:
            await self._queued.wait()
            job = self._take()
            try:
                if job.aborted:
                    job.abandon()
                elif isinstance(job, GenerationJob):
                    await self._run_batch(job)
                else:
                    assert isinstance(job, Job)
                    await self._run_alone(job)
            finally:
                if not self._queue:
                    self._idle.set()

    async def _run_alone(self, job: Job) -> None:
        self._current = [job]
        self.running += 1
        try:
            outcome = await self.in_thread(job.run)
        finally:
            self.running -= 1
            self._current = []
        job.deliver(outcome)

    def _joiners(self, batch: Batch, adapter: Adapter | None) -> list[GenerationJob]:
        """The generation requests at the head of the queue that can join `batch` now (see the module's docstring)."""
        joining: list[GenerationJob] = []
        rows = batch.rows
        while self._queue and (batch.joinable or not rows):
            head = self._queue[0]
            if not isinstance(head, GenerationJob) or head.adapter != adapter:
                break
            if not head.aborted and rows + head.choices > self.max_num_seqs:
                break
            self._take()
            if head.aborted:
                head.abandon()
                continue
            joining.append(head)
            rows += head.choices
        return joining

    async def _run_batch(self, first: GenerationJob) -> None:
        """Run `first` and everything that joins it, step by step, until the batch has drained."""
        assert self._context is not None, "an engine without a model context takes no generation requests"
        context = self._context
        adapter = first.adapter

        def start() -> Batch:
            model = context.holder.module
            context.slots.activate(model, adapter)
            return Batch(model, context.codec)

        joining = [first]
        self._current = [first]
        self.running += 1
        try:
            batch = await self.in_thread(start)
            while joining or self._current:
                finished = await self.in_thread(partial(batch.step, joining))
                for job in self._current:
                    assert isinstance(job, GenerationJob)
                    job.flush()
                for request in finished:
                    assert isinstance(request, GenerationJob)
                    self._current.remove(request)
                    self.running -= 1
                    request.deliver(Done())
                joining = self._joiners(batch, adapter)
                self._current += joining
                self.running += len(joining)
        except Exception as error:
            if isinstance(error, ApiError):  # e.g. the adapter could not be attached again
                failure = Failed(error.message)
            else:
                log.exception("generation failed")
                failure = Failed(f"{type(error).__name__}: {error}")
            for job in self._current:
                assert isinstance(job, GenerationJob)
                job.flush()
                job.deliver(failure)
        finally:
            self.running -= len(self._current)
            self._current = []

    def _abort_all(self) -> None:
        for job in self._current:
            job.abort()
        while self._queue:
            job = self._take()
            job.abort()
            job.abandon()

    async def sleep(self, level: int, mode: SleepMode) -> None:
        """Close the door, abort or finish what is queued (`mode`), then sleep at `level` on the model thread."""
        async with self._transition:
            self._open.clear()
            try:
                if mode == "abort":
                    self._abort_all()
                await self._idle.wait()
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
        self._background.start(asyncio.to_thread(host.release), name="release host copy")

    async def close(self) -> None:
        """Abort everything, release held requests with 503, and wait for the model thread to stop."""
        self._closed = True
        self._open.set()
        self._abort_all()
        with contextlib.suppress(TimeoutError):  # aborted sequences end within a step: let them say so
            async with asyncio.timeout(CLOSE_GRACE_S):
                await self._idle.wait()
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        await asyncio.to_thread(self._thread.shutdown, True, cancel_futures=True)
        await self._background.wait()
