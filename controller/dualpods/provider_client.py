"""vLLM's own sleep routes on a direct provider (no launcher stands in front of it): what FMA's controller calls.

They are vLLM's development-mode endpoints, so a direct provider runs with `VLLM_SERVER_DEV_MODE=1`.
"""

from .http import HttpCaller, HttpError


class ProviderClient:
    def __init__(self, http: HttpCaller) -> None:
        self._http = http

    async def is_sleeping(self, pod_ip: str, port: int, requester: str) -> bool:
        url = f"http://{pod_ip}:{port}/is_sleeping"
        body = await self._http.expect_ok("is_sleeping", "GET", url, requester=requester)
        if not isinstance(body, dict) or not isinstance(body.get("is_sleeping"), bool):
            raise HttpError("is_sleeping", url, None, ValueError(f"unexpected answer {body!r}"))
        return bool(body["is_sleeping"])

    async def sleep(self, pod_ip: str, port: int, requester: str) -> None:
        await self._http.expect_ok("sleep", "POST", f"http://{pod_ip}:{port}/sleep?level=1", requester=requester)

    async def wake(self, pod_ip: str, port: int, requester: str) -> None:
        await self._http.expect_ok("wake", "POST", f"http://{pod_ip}:{port}/wake_up", requester=requester)
