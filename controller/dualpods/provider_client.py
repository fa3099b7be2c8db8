"""A model server's own routes: vLLM's sleep routes on a direct provider (no launcher stands in front of it,
what FMA's controller calls) and on an instance of a launcher that speaks only FMA's API, its `/health` for
such an instance's readiness, and the LoRA routes on any model server (E8).

The sleep routes are vLLM's development-mode endpoints, so a direct provider runs with
`VLLM_SERVER_DEV_MODE=1`; runtime LoRA updates need `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`.
"""

from api.launcher import InstanceState
from controller.dualpods.selection import instance_port
from controller.http import HttpCaller, HttpError, Purpose


class ProviderClient:
    def __init__(self, http: HttpCaller) -> None:
        self._http = http

    async def is_sleeping(self, pod_ip: str, port: int, requester: str) -> bool:
        url = f"http://{pod_ip}:{port}/is_sleeping"
        body = await self._http.expect_ok(Purpose.QUERY_SLEEPING, "GET", url, requester=requester)
        if not isinstance(body, dict) or not isinstance(body.get("is_sleeping"), bool):
            raise HttpError(Purpose.QUERY_SLEEPING, url, None, ValueError(f"unexpected answer {body!r}"))
        return bool(body["is_sleeping"])

    async def serving_asleep(self, pod_ip: str, state: InstanceState) -> bool | None:
        """Whether a launcher's instance sleeps, once its /health answers 200 (None before, or without a port)."""
        port = instance_port(state)
        if port is None:
            return None
        try:
            reply = await self._http.call(Purpose.GET_INSTANCE_HEALTH, "GET", f"http://{pod_ip}:{port}/health")
        except HttpError:
            return None  # not listening yet
        return await self.is_sleeping(pod_ip, port, "") if reply.ok else None

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
