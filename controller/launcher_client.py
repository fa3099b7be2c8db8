"""The launcher REST API as both controllers use it (FMA's launcher client, plus E1 and E14).

`offers_extensions` reads the launcher's index (`GET /`, FMA's too) to tell a launcher that serves dualpods'
sleep and wake routes from one that speaks only FMA's API (FMA's own, or ours with `--fma-only`).
Errors are told apart by the launcher's machine-readable `reason` (api.launcher.ErrorReason); a
launcher that sends none (FMA's) is understood from its status code and message instead.
"""

from collections.abc import AsyncIterator
from typing import Any

from api.keys import LAUNCHER_PORT
from api.launcher import (
    INSTANCES_PATH,
    SLEEP_ROUTE,
    WAKE_ROUTE,
    WATCH_SILENCE_TIMEOUT_S,
    AllInstancesState,
    ErrorReason,
    Index,
    InstanceState,
    VllmConfig,
    WatchEvent,
)
from api.token_file import TokenFile
from controller.http import HttpCaller, HttpError, Purpose, Reply
from kube.listwatch import Expired, lines


def launcher_url(pod_ip: str) -> str:
    return f"http://{pod_ip}:{LAUNCHER_PORT}"


def _bearer(token: str | None) -> dict[str, str] | None:
    return {"Authorization": f"Bearer {token}"} if token else None


def error_reason(err: HttpError) -> ErrorReason | None:
    """Why the launcher refused: its `reason`, or for a launcher without reasons what its answer implies."""
    reply = err.reply
    if reply is None:
        return None
    if reply.reason is not None:
        try:
            return ErrorReason(reply.reason)
        except ValueError:
            return None
    text = str(reply.body).lower()
    if reply.status == 409 and "already exists" in text:
        return ErrorReason.ALREADY_EXISTS
    return {404: ErrorReason.NOT_FOUND, 410: ErrorReason.REVISION_GONE}.get(reply.status)


class LauncherClient:
    def __init__(self, http: HttpCaller, token: TokenFile | None) -> None:
        self._http = http
        self._token = token  # re-read when its file changes: a rotated Secret needs no restart

    def _url(self, pod_ip: str, path: str = "") -> str:
        return f"{launcher_url(pod_ip)}{INSTANCES_PATH}{path}"

    async def _call(self, purpose: Purpose, method: str, url: str, **kwargs: Any) -> Any:
        try:
            return await self._http.expect_ok(purpose, method, url, headers=self.headers, **kwargs)
        except HttpError as err:
            # Refused before anything was done: a launcher whose kubelet has not yet seen a rotated token.
            previous = self._token.previous() if self._token else None
            if err.reply is None or err.reply.status != 401 or previous is None:
                raise
            return await self._http.expect_ok(purpose, method, url, headers=_bearer(previous), **kwargs)

    @property
    def headers(self) -> dict[str, str] | None:
        return _bearer(self._token.current()) if self._token else None

    async def offers_extensions(self, pod_ip: str) -> bool:
        """Whether the launcher's index lists dualpods' sleep and wake routes (E1)."""
        body = await self._call(Purpose.GET_INDEX, "GET", launcher_url(pod_ip) + "/")
        return {SLEEP_ROUTE, WAKE_ROUTE} <= Index.model_validate(body).endpoints.keys()

    async def list_instances(self, pod_ip: str, isc_name: str = "") -> AllInstancesState:
        body = await self._call(Purpose.LIST_INSTANCES, "GET", self._url(pod_ip), isc_name=isc_name)
        return AllInstancesState.model_validate(body)

    async def events(self, pod_ip: str, since: int) -> AsyncIterator[WatchEvent]:
        """The watch stream from revision `since`; Expired when the launcher answers 410 or the stream is
        silent (no event, no heartbeat) for WATCH_SILENCE_TIMEOUT_S."""
        url = self._url(pod_ip, f"/watch?since={since}")
        async with self._http.stream("watch", url, self.headers) as response:
            if response.status == 410:
                raise Expired(f"the launcher does not hold revision {since}")
            if response.status != 200:
                raise HttpError("watch", url, Reply(response.status, (await response.text())[:300]))
            seen = False
            try:
                async for line in lines(response.content, WATCH_SILENCE_TIMEOUT_S):
                    seen = True
                    if line.strip():
                        yield WatchEvent.model_validate_json(line)
            except TimeoutError:
                raise Expired(f"the watch stream was silent for {WATCH_SILENCE_TIMEOUT_S:.0f} s") from None
        if not seen:
            raise ConnectionError("the launcher ended the watch stream at once")

    async def create_instance(
        self, pod_ip: str, instance_id: str, config: VllmConfig, isc_name: str, requester: str
    ) -> InstanceState:
        body = await self._call(
            Purpose.CREATE_INSTANCE,
            "PUT",
            self._url(pod_ip, f"/{instance_id}"),
            body=config.model_dump(exclude_none=True),
            isc_name=isc_name,
            requester=requester,
        )
        return InstanceState.model_validate(body)

    async def delete_instance(self, pod_ip: str, instance_id: str, isc_name: str = "", requester: str = "") -> None:
        """Delete an instance; one that is already gone counts as deleted."""
        try:
            await self._call(
                Purpose.DELETE_INSTANCE,
                "DELETE",
                self._url(pod_ip, f"/{instance_id}"),
                isc_name=isc_name,
                requester=requester,
            )
        except HttpError as err:
            if error_reason(err) is not ErrorReason.NOT_FOUND:
                raise

    async def sleep(self, pod_ip: str, instance_id: str, isc_name: str, requester: str) -> None:
        await self._call(
            Purpose.SLEEP,
            "POST",
            self._url(pod_ip, f"/{instance_id}/sleep?level=1"),
            isc_name=isc_name,
            requester=requester,
        )

    async def wake(self, pod_ip: str, instance_id: str, isc_name: str, requester: str) -> None:
        await self._call(
            Purpose.WAKE, "POST", self._url(pod_ip, f"/{instance_id}/wake_up"), isc_name=isc_name, requester=requester
        )
