"""Client of the kubelet's control endpoint (see `control.py`), for tests and the cluster CLI."""

import aiohttp

from e2e.kubelet.config import GpuMode
from e2e.kubelet.control import NodeInfo


class ControlError(RuntimeError):
    """The kubelet refused a control request; carries its explanation."""


class KubeletControl:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    async def _call(self, method: str, path: str, body: dict[str, int | str] | None = None) -> object:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
            session.request(method, self.url + path, json=body) as response,
        ):
            payload = await response.json()
            if response.status >= 400:
                raise ControlError(f"{method} {path}: HTTP {response.status}: {payload.get('error')}")
            return payload

    async def nodes(self) -> list[NodeInfo]:
        payload = await self._call("GET", "/nodes")
        assert isinstance(payload, dict)
        return [NodeInfo.model_validate(n) for n in payload["nodes"]]

    async def add_node(self, name: str, gpus: int = 2, gpu_mode: GpuMode = "device-plugin") -> NodeInfo:
        body: dict[str, int | str] = {"gpus": gpus, "gpuMode": gpu_mode}
        return NodeInfo.model_validate(await self._call("PUT", f"/nodes/{name}", body))

    async def lose_node(self, name: str) -> None:
        await self._call("DELETE", f"/nodes/{name}")

    async def publish_gpu_map(self, namespace: str) -> None:
        await self._call("PUT", f"/gpu-map/{namespace}")
