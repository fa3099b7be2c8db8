"""What a call to the API server can fail with that a retry may cure: a refusal (ApiException) or no
answer at all (the API server is restarting: refused connections, resets, timeouts). Every kubelet task
catches these, so the loopback kubelet rides out an API-server outage as a real kubelet does."""

from collections.abc import Awaitable
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from controller.informer import decode

UNREACHABLE: tuple[type[BaseException], ...] = (aiohttp.ClientError, OSError, TimeoutError)
API_ERRORS: tuple[type[BaseException], ...] = (ApiException, *UNREACHABLE)


def describe(error: BaseException) -> str:
    return f"API error {error.status}: {error.reason}" if isinstance(error, ApiException) else repr(error)


async def answer_of(call: Awaitable[Any]) -> dict[str, Any]:
    """The JSON answer of a client call made with `_preload_content=False`, or its refusal as ApiException. The
    kubelet reads one or two fields of what it writes (a version, a token); decoding the whole answer into the
    client's models cost it more CPU than sending the request."""
    answer: aiohttp.ClientResponse = await call
    async with answer:
        if answer.status >= 300:
            raise ApiException(status=answer.status, reason=await answer.text())
        decoded: dict[str, Any] = decode(await answer.read())
        return decoded
