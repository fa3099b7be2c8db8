"""The launcher REST API as the dual-pods controller uses it (FMA's launcher client, plus E1)."""

from typing import Any

from api.keys import LAUNCHER_PORT
from api.launcher import INSTANCES_PATH, AllInstancesState, InstanceState, VllmConfig

from .http import HttpCaller, HttpError
from .metrics import Purpose


def launcher_url(pod_ip: str) -> str:
    return f"http://{pod_ip}:{LAUNCHER_PORT}"


class LauncherClient:
    def __init__(self, http: HttpCaller, token: str | None) -> None:
        self._http = http
        self._headers = {"Authorization": f"Bearer {token}"} if token else None

    def _url(self, pod_ip: str, path: str = "") -> str:
        return f"{launcher_url(pod_ip)}{INSTANCES_PATH}{path}"

    async def _call(self, purpose: Purpose, method: str, url: str, **kwargs: Any) -> Any:
        return await self._http.expect_ok(purpose, method, url, headers=self._headers, **kwargs)

    @property
    def headers(self) -> dict[str, str] | None:
        return self._headers

    async def list_instances(self, pod_ip: str, isc_name: str = "") -> AllInstancesState:
        body = await self._call(Purpose.LIST_INSTANCES, "GET", self._url(pod_ip), isc_name=isc_name)
        return AllInstancesState.model_validate(body)

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
            if err.reply is None or err.reply.status != 404:
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
