"""A model server's own routes: vLLM's sleep routes on a direct provider (no launcher stands in front of it,
what FMA's controller calls) and on an instance of a launcher that speaks only FMA's API, and the LoRA
routes on any model server (E8).

The sleep routes are vLLM's development-mode endpoints, so a direct provider runs with
`VLLM_SERVER_DEV_MODE=1`; runtime LoRA updates need `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`.
"""

from controller import instance_probe
from controller.http import HttpCaller, Purpose


class ProviderClient:
    def __init__(self, http: HttpCaller) -> None:
        self._http = http

    async def is_sleeping(self, pod_ip: str, port: int, requester: str) -> bool:
        return await instance_probe.is_sleeping(self._http, pod_ip, port, requester)

    async def sleep(self, pod_ip: str, port: int, requester: str) -> None:
        await self._http.expect_ok(Purpose.SLEEP, "POST", f"http://{pod_ip}:{port}/sleep?level=1", requester=requester)

    async def wake(self, pod_ip: str, port: int, requester: str) -> None:
        await self._http.expect_ok(Purpose.WAKE, "POST", f"http://{pod_ip}:{port}/wake_up", requester=requester)

    async def lora_adapters(self, pod_ip: str, port: int, requester: str) -> set[str]:
        """The adapters the server serves: the models it lists with a parent model."""
        url = f"http://{pod_ip}:{port}/v1/models"
        body = await self._http.expect_ok(Purpose.LIST_MODELS, "GET", url, requester=requester)
        models = body.get("data") if isinstance(body, dict) else None
        return {str(m["id"]) for m in models or [] if isinstance(m, dict) and m.get("parent")}

    async def load_lora(self, pod_ip: str, port: int, name: str, path: str, requester: str) -> None:
        body = {"lora_name": name, "lora_path": path}
        url = f"http://{pod_ip}:{port}/v1/load_lora_adapter"
        await self._http.expect_ok(Purpose.LOAD_LORA_ADAPTER, "POST", url, body=body, requester=requester)

    async def unload_lora(self, pod_ip: str, port: int, name: str, requester: str) -> None:
        url = f"http://{pod_ip}:{port}/v1/unload_lora_adapter"
        await self._http.expect_ok(
            Purpose.UNLOAD_LORA_ADAPTER, "POST", url, body={"lora_name": name}, requester=requester
        )
