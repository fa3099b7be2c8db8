"""The controllers' work queue: de-duplication, per-key serialization, back-off, delayed adds, and the one
contract every reconciler keeps with it (a Result per pass, each pass logged within its context)."""

import asyncio
import io
import json
import logging

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from api import log_format
from kube.workqueue import DONE, Problem, Result, Wait, WorkQueue, run_workers

# Back-off, requeue-after and delayed adds are timers of the event loop, whose clock here is a fake one that jumps to
# the next timer when nothing is ready (looptime): 0.2 s is 0.2 s of loop time, whatever else the machine is doing.
pytestmark = pytest.mark.looptime


async def test_a_key_added_twice_while_waiting_is_processed_once() -> None:
    queue: WorkQueue[str] = WorkQueue("test")
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert len(queue) == 2


async def test_a_key_added_while_processing_is_processed_again_afterwards_never_concurrently() -> None:
    queue: WorkQueue[str] = WorkQueue("test")
    running: set[str] = set()
    overlaps = 0
    calls = 0

    async def reconcile(key: str) -> Result:
        nonlocal overlaps, calls
        calls += 1
        overlaps += key in running
        running.add(key)
        if calls == 1:
            queue.add(key)  # a change arrives while the key is being processed
        await asyncio.sleep(0.01)
        running.discard(key)
        return DONE

    queue.add("a")
    workers = asyncio.create_task(run_workers(queue, reconcile, workers=4))
    await asyncio.sleep(0.1)
    queue.shutdown()
    await workers
    assert (calls, overlaps) == (2, 0)


async def test_failures_back_off_exponentially_and_success_resets() -> None:
    queue: WorkQueue[str] = WorkQueue("test", base_delay=0.01, max_delay=0.04)
    assert [queue.add_rate_limited("k") for _ in range(4)] == [0.01, 0.02, 0.04, 0.04]
    queue.forget("k")
    assert queue.add_rate_limited("k") == 0.01


async def test_failed_keys_are_retried_and_requeue_after_is_honoured() -> None:
    queue: WorkQueue[str] = WorkQueue("test", base_delay=0.01)
    seen: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def reconcile(key: str) -> Result:
        seen.append((key, loop.time() - start))
        if key == "flaky" and len([k for k, _ in seen if k == "flaky"]) < 3:
            raise RuntimeError("not yet")
        if key == "later" and len([k for k, _ in seen if k == "later"]) == 1:
            return Wait(0.2, "later")
        return DONE

    queue.add("flaky")
    queue.add("later")
    workers = asyncio.create_task(run_workers(queue, reconcile, workers=2))
    await asyncio.sleep(0.4)
    queue.shutdown()
    await workers
    assert [k for k, _ in seen].count("flaky") == 3
    later = [t for k, t in seen if k == "later"]
    assert len(later) == 2
    assert later[1] - later[0] == pytest.approx(0.2)


async def test_an_earlier_schedule_wins() -> None:
    queue: WorkQueue[str] = WorkQueue("test")
    queue.add_after("k", 0.05)
    queue.add_after("k", 5)
    await asyncio.sleep(0.1)
    assert len(queue) == 1
    queue.shutdown()
    assert await queue.get() is None


async def passes_of(results: dict[str, list[Result]], within_s: float = 0.3) -> dict[str, int]:
    """Run the workers on a queue holding each key of `results` once, the key's passes returning its results in
    turn (then Done); how many passes each key had within `within_s`."""
    queue: WorkQueue[str] = WorkQueue("test", base_delay=0.01)
    passes = dict.fromkeys(results, 0)

    async def reconcile(key: str) -> Result:
        passes[key] += 1
        left = results[key]
        return left.pop(0) if left else DONE

    for key in results:
        queue.add(key)
    workers = asyncio.create_task(run_workers(queue, reconcile, workers=2))
    await asyncio.sleep(within_s)
    queue.shutdown()
    await workers
    return passes


async def test_each_result_tells_the_queue_what_to_do_next() -> None:
    passes = await passes_of(
        {
            "done": [DONE],
            "wait": [Wait(0.05, "a Pod to start")],
            "wait-for-an-event": [Wait(None, "a watch event")],
            "back-off": [Problem.of("a launcher does not answer"), Problem.of("still not")],
            "terminal": [Problem.of("its InferenceServerConfig does not exist", retry=False)],
        }
    )
    assert passes == {
        "done": 1,  # not queued again: the next change brings the key
        "wait": 2,  # looked at again after the wait
        "wait-for-an-event": 1,
        "back-off": 3,  # retried with back-off until it ends otherwise
        "terminal": 1,  # not retried: only a change of some object settles it
    }


async def test_a_terminal_problem_forgets_the_back_off_of_earlier_failures() -> None:
    queue: WorkQueue[str] = WorkQueue("test", base_delay=0.01)
    outcomes: list[Result] = [Problem.of("flaky"), Problem.of("flaky"), Problem.of("needs a change", retry=False)]

    async def reconcile(key: str) -> Result:
        return outcomes.pop(0)

    queue.add("k")
    workers = asyncio.create_task(run_workers(queue, reconcile, workers=1))
    await asyncio.sleep(0.2)
    queue.shutdown()
    await workers
    assert (outcomes, queue.retries("k")) == ([], 0)


@pytest.mark.parametrize(
    ("failure", "level", "traceback"),
    [
        (KeyError("a bug"), "WARNING", "KeyError: 'a bug'"),  # a bug: loud at once
        (ApiException(status=409, reason="Conflict"), "INFO", None),  # a write that met a newer version: quiet
    ],
)
async def test_a_failed_pass_is_logged_within_its_context(
    lines: io.StringIO, failure: Exception, level: str, traceback: str | None
) -> None:
    queue: WorkQueue[str] = WorkQueue("test", base_delay=0.01)
    in_pass: list[str] = []

    async def reconcile(key: str) -> Result:
        logging.getLogger("controller.test").info("looking at %s", key)
        in_pass.append(log_format.context_fields()[log_format.PASS_FIELD])
        raise failure

    queue.add("req-1")
    workers = asyncio.create_task(run_workers(queue, reconcile, 1, lambda key: {log_format.REQUESTER_FIELD: key}))
    await asyncio.sleep(0.005)
    queue.shutdown()
    await workers
    found = [json.loads(line) for line in lines.getvalue().splitlines()]
    looked, failed = found[0], next(r for r in found if "failed" in r["msg"])
    assert failed["level"] == level
    if traceback is not None:
        assert traceback in failed["exception"]
    assert failed["requester"] == looked["requester"] == "req-1"
    assert failed["pass_id"] == looked["pass_id"] == in_pass[0]
