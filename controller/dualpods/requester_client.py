"""The requester's SPI as the dual-pods controller uses it (FMA's contract)."""

from typing import Any

from api.keys import ADMIN_PORT_ANNOTATION, DEFAULT_ADMIN_PORT
from controller import pods

from .http import HttpCaller, HttpError
from .metrics import Purpose


class RequesterError(Exception):
    """The requester answered, but not usefully; the message is fit for its status."""


class RequesterClient:
    def __init__(self, http: HttpCaller) -> None:
        self._http = http

    @staticmethod
    def _url(requester: pods.Pod, path: str) -> str:
        port = pods.annotations(requester).get(ADMIN_PORT_ANNOTATION, str(DEFAULT_ADMIN_PORT))
        return f"http://{pods.pod_ip(requester)}:{port}{path}"

    async def gpu_uuids(self, requester: pods.Pod, isc_name: str) -> list[str]:
        url = self._url(requester, "/v1/dual-pods/accelerators")
        reply = await self._http.call(
            Purpose.GET_GPU_UUIDS, "GET", url, isc_name=isc_name, requester=pods.name(requester)
        )
        if not reply.ok:
            raise RequesterError(f"the requester's GPU query failed: {reply.status} {reply.body}")
        if not isinstance(reply.body, list) or not all(isinstance(u, str) for u in reply.body):
            raise RequesterError(f"the requester's GPU query answered {reply.body!r}, not a list of UUIDs")
        return list(reply.body)

    async def memory_usage(self, requester: pods.Pod, isc_name: str) -> dict[str, int]:
        """MiB in use on each of the requester's GPUs."""
        url = self._url(requester, "/v1/dual-pods/accelerator-memory-usage")
        body: Any = await self._http.expect_ok(
            Purpose.GET_ACCEL_MEMORY_USAGE, "GET", url, isc_name=isc_name, requester=pods.name(requester)
        )
        return {str(k): int(v) for k, v in body.items()}

    async def configure_proxy(self, requester: pods.Pod, address: str, port: int, isc_name: str) -> None:
        """Point the requester's request proxy (E7) at its provider; a requester without a proxy (FMA's
        own, 0.6) answers 404 and is left as it is."""
        url = self._url(requester, "/v1/proxy/config")
        body = {"address": address, "port": port}
        reply = await self._http.call(Purpose.CONFIGURE_PROXY, "PUT", url, body=body, isc_name=isc_name,
                                      requester=pods.name(requester))  # fmt: skip
        if reply.status in (404, 405):
            return
        if not reply.ok:
            raise RequesterError(f"the requester's proxy refused its provider {address}:{port}: {reply.body}")

    async def relay_readiness(self, requester: pods.Pod, ready: bool, isc_name: str) -> None:
        path, purpose = (
            ("/v1/become-ready", Purpose.RELAY_READY) if ready else ("/v1/become-unready", Purpose.RELAY_UNREADY)
        )
        try:
            await self._http.expect_ok(purpose, "POST", self._url(requester, path), isc_name=isc_name,
                                       requester=pods.name(requester))  # fmt: skip
        except HttpError as err:
            raise RequesterError(f"relaying readiness to the requester failed: {err}") from None
