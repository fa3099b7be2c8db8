"""The controllers' work queue: de-duplication, per-key serialization, back-off, delayed adds."""

import asyncio

from controller.workqueue import WorkQueue, run_workers


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

    async def reconcile(key: str) -> None:
        nonlocal overlaps, calls
        calls += 1
        overlaps += key in running
        running.add(key)
        if calls == 1:
            queue.add(key)  # a change arrives while the key is being processed
        await asyncio.sleep(0.01)
        running.discard(key)

    queue.add("a")
    workers = asyncio.ensure_future(run_workers(queue, reconcile, workers=4))
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

    async def reconcile(key: str) -> float | None:
        seen.append((key, loop.time() - start))
        if key == "flaky" and len([k for k, _ in seen if k == "flaky"]) < 3:
            raise RuntimeError("not yet")
        if key == "later" and len([k for k, _ in seen if k == "later"]) == 1:
            return 0.2
        return None

    queue.add("flaky")
    queue.add("later")
    workers = asyncio.ensure_future(run_workers(queue, reconcile, workers=2))
    await asyncio.sleep(0.4)
    queue.shutdown()
    await workers
    assert [k for k, _ in seen].count("flaky") == 3
    later = [t for k, t in seen if k == "later"]
    assert len(later) == 2
    assert later[1] - later[0] >= 0.19


async def test_an_earlier_schedule_wins() -> None:
    queue: WorkQueue[str] = WorkQueue("test")
    queue.add_after("k", 0.05)
    queue.add_after("k", 5)
    await asyncio.sleep(0.1)
    assert len(queue) == 1
    queue.shutdown()
    assert await queue.get() is None
