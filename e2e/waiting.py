"""Waiting for a condition in a test, with a deadline and a failure message that says what was awaited."""

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


@overload
async def wait_for(
    check: Callable[[], Awaitable[T]], *, what: str, within: float = ..., interval: float = ...
) -> T: ...
@overload
async def wait_for(check: Callable[[], T], *, what: str, within: float = ..., interval: float = ...) -> T: ...


async def wait_for(
    check: Callable[[], Any],
    *,
    what: str,
    within: float = 30.0,
    interval: float = 0.2,
) -> Any:
    """Call `check` (sync or async) until it returns something truthy, and return that.

    An exception from `check` counts as "not yet" (an object may not exist yet); the last value and
    the last exception are in the TimeoutError raised after `within` seconds.
    """
    deadline = time.monotonic() + within
    last_value: object = None
    last_error: BaseException | None = None
    while True:
        try:
            result = check()
            value = await result if inspect.isawaitable(result) else result
            if value:
                return value
            last_value, last_error = value, None
        except Exception as error:
            last_error = error
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"timed out after {within:g} s waiting for {what}; last value {last_value!r}"
                + (f", last error {last_error!r}" if last_error else "")
            )
        await asyncio.sleep(interval)


async def wait_service_account(core: Any, namespace: str, name: str = "default", within: float = 60.0) -> None:
    """Until ServiceAccount `name` exists, so Pods that run as it are admitted (since Kubernetes 1.24 a Pod's token
    comes from the TokenRequest API when it starts; there is no token Secret to wait for)."""

    async def exists() -> bool:
        return bool(await core.read_namespaced_service_account(name, namespace))

    await wait_for(exists, what=f"the ServiceAccount {namespace}/{name}", within=within)


async def wait_pod_gone(core: Any, namespace: str, name: str, within: float = 30.0) -> None:
    """Until no Pod `name` exists in `namespace` (a field-selected list: no 404 to tell from other errors)."""

    async def gone() -> bool:
        return not (await core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}")).items

    await wait_for(gone, what=f"the Pod {namespace}/{name} gone", within=within)


async def cancel_while_waiting(task: "asyncio.Task[Any]", settle: float = 0.1, within: float = 2.0) -> None:
    """Cancel `task` once it has waited `settle` seconds; the cancellation must come back out of it (not be
    swallowed, as `asyncio.wait_for` could), within `within` seconds."""
    await asyncio.sleep(settle)
    assert not task.done(), "it should still be waiting"
    task.cancel()
    try:
        async with asyncio.timeout(within):
            await task
    except asyncio.CancelledError:
        pass
    assert task.cancelled(), "the cancellation was swallowed"
