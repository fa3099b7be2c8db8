"""What a call to the API server can fail with that a retry may cure: a refusal (ApiException) or no
answer at all (the API server is restarting: refused connections, resets, timeouts). Every kubelet task
catches these, so the loopback kubelet rides out an API-server outage as a real kubelet does."""

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

UNREACHABLE: tuple[type[BaseException], ...] = (aiohttp.ClientError, OSError, TimeoutError)
API_ERRORS: tuple[type[BaseException], ...] = (ApiException, *UNREACHABLE)


def describe(error: BaseException) -> str:
    return f"API error {error.status}: {error.reason}" if isinstance(error, ApiException) else repr(error)
