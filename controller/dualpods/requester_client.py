"""The requester's SPI as the dual-pods controller uses it (FMA's contract, and E15's credential).

Calls that change the requester carry the controller's token for that requester (`requester_tokens`);
reads go without, as FMA's do. A refusal (401/403) is a RequesterError saying why, which the
reconciler reports in the requester's status.
"""

from typing import Any

from api.keys import ADMIN_PORT_ANNOTATION, DEFAULT_ADMIN_PORT
from api.requester import (
    ACCELERATORS_PATH,
    BECOME_READY_PATH,
    BECOME_UNREADY_PATH,
    MEMORY_USAGE_PATH,
    PROXY_CONFIG_PATH,
)
from controller import pods
from controller.dualpods.requester_tokens import RequesterTokens, TokenUnavailable
from controller.http import HttpCaller, HttpError, Purpose, Reply


class RequesterError(Exception):
    """The requester answered, but not usefully; the message is fit for its status."""


def admin_port(requester: pods.Pod) -> int:
    """The SPI's port: the `admin-port` annotation, 8081 when it is absent or empty (as FMA)."""
    given = pods.annotations(requester).get(ADMIN_PORT_ANNOTATION, "").strip()
    if not given:
        return DEFAULT_ADMIN_PORT
    if not given.isascii() or not given.isdigit() or not 1 <= int(given) <= 65535:
        raise RequesterError(f"the annotation {ADMIN_PORT_ANNOTATION}={given!r} is not a TCP port (1-65535)")
    return int(given)


def _namespace(requester: pods.Pod) -> str:
    return str(pods.meta(requester).get("namespace", ""))


def _refusal(reply: Reply) -> str:
    """The requester's own words for a refusal: its JSON `detail`, else the body."""
    body = reply.body
    return str(body.get("detail", body)) if isinstance(body, dict) else str(body)


class RequesterClient:
    def __init__(self, http: HttpCaller, tokens: RequesterTokens | None = None) -> None:
        """Without `tokens`, writes carry no credential (a requester running `--spi-auth none`, or FMA's)."""
        self._http = http
        self._tokens = tokens

    @staticmethod
    def _url(requester: pods.Pod, path: str) -> str:
        return f"http://{pods.pod_ip(requester)}:{admin_port(requester)}{path}"

    async def _credential(self, requester: pods.Pod) -> dict[str, str] | None:
        if self._tokens is None:
            return None
        try:
            return await self._tokens.headers(_namespace(requester), pods.name(requester))
        except TokenUnavailable as err:
            raise RequesterError(f"no token to call the requester with: {err}") from None

    async def _change(self, purpose: Purpose, method: str, requester: pods.Pod, path: str, isc_name: str,
                      body: Any = None) -> Reply:  # fmt: skip
        """A state-changing call with the controller's token; a 401/403 is a RequesterError."""
        reply = await self._http.call(purpose, method, self._url(requester, path), body=body,
                                      headers=await self._credential(requester), isc_name=isc_name,
                                      requester=pods.name(requester))  # fmt: skip
        if reply.status in (401, 403):
            if self._tokens is not None:
                self._tokens.forget(_namespace(requester), pods.name(requester))
            raise RequesterError(f"the requester refused the controller's {purpose} call ({reply.status}): "
                                 f"{_refusal(reply)}")  # fmt: skip
        return reply

    async def gpu_uuids(self, requester: pods.Pod, isc_name: str) -> list[str]:
        url = self._url(requester, ACCELERATORS_PATH)
        reply = await self._http.call(
            Purpose.GET_GPU_UUIDS, "GET", url, isc_name=isc_name, requester=pods.name(requester)
        )
        if not reply.ok:
            raise RequesterError(f"the requester's GPU query failed: {reply.status} {_refusal(reply)}")
        if not isinstance(reply.body, list) or not all(isinstance(u, str) for u in reply.body):
            raise RequesterError(f"the requester's GPU query answered {reply.body!r}, not a list of UUIDs")
        return list(reply.body)

    async def memory_usage(self, requester: pods.Pod, isc_name: str) -> dict[str, int]:
        """MiB in use on each of the requester's GPUs."""
        url = self._url(requester, MEMORY_USAGE_PATH)
        body: Any = await self._http.expect_ok(
            Purpose.GET_ACCEL_MEMORY_USAGE, "GET", url, isc_name=isc_name, requester=pods.name(requester)
        )
        return {str(k): int(v) for k, v in body.items()}

    async def configure_proxy(self, requester: pods.Pod, address: str, port: int, isc_name: str) -> None:
        """Point the requester's request proxy (E7) at its provider; a requester without a proxy (FMA's
        own, 0.6) answers 404 and is left as it is."""
        body = {"address": address, "port": port}
        reply = await self._change(Purpose.CONFIGURE_PROXY, "PUT", requester, PROXY_CONFIG_PATH, isc_name, body)
        if reply.status in (404, 405):
            return
        if not reply.ok:
            raise RequesterError(f"the requester's proxy refused its provider {address}:{port}: {_refusal(reply)}")

    async def relay_readiness(self, requester: pods.Pod, ready: bool, isc_name: str) -> None:
        path, purpose = (
            (BECOME_READY_PATH, Purpose.RELAY_READY) if ready else (BECOME_UNREADY_PATH, Purpose.RELAY_UNREADY)
        )
        try:
            reply = await self._change(purpose, "POST", requester, path, isc_name)
        except HttpError as err:
            raise RequesterError(f"relaying readiness to the requester failed: {err}") from None
        if not reply.ok:
            raise RequesterError(f"relaying readiness to the requester failed: {reply.status} {_refusal(reply)}")
