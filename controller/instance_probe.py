"""What an instance of a launcher without dualpods' extensions says about itself, on its own port.

FMA's launcher reports neither readiness nor sleep (it only starts, lists and stops processes), so both
controllers' launcher views (controller.launcher_views) learn them from the instance, as FMA's controller
does: it serves once vLLM's `/health` answers 200, and vLLM's dev-mode `GET /is_sleeping` says whether it
sleeps. The instance's port is the `inference-port` annotation the dual-pods controller (FMA's too) puts on
every instance it creates.
"""

from api.keys import INSTANCE_INFERENCE_PORT
from api.launcher import InstanceState
from controller.http import HttpCaller, HttpError, Purpose


def instance_port(state: InstanceState) -> int | None:
    try:
        return int((state.annotations or {})[INSTANCE_INFERENCE_PORT])
    except (KeyError, ValueError):
        return None


async def is_sleeping(http: HttpCaller, pod_ip: str, port: int, requester: str = "") -> bool:
    """vLLM's `GET /is_sleeping`."""
    url = f"http://{pod_ip}:{port}/is_sleeping"
    body = await http.expect_ok(Purpose.QUERY_SLEEPING, "GET", url, requester=requester)
    if not isinstance(body, dict) or not isinstance(body.get("is_sleeping"), bool):
        raise HttpError(Purpose.QUERY_SLEEPING, url, None, ValueError(f"unexpected answer {body!r}"))
    return bool(body["is_sleeping"])


class InstanceProbe:
    """The launcher views' InstanceProber over HTTP."""

    def __init__(self, http: HttpCaller) -> None:
        self._http = http

    async def serving_asleep(self, pod_ip: str, state: InstanceState) -> bool | None:
        """Whether the instance sleeps, once its /health answers 200 (None before, or without a port)."""
        port = instance_port(state)
        if port is None:
            return None
        try:
            reply = await self._http.call(Purpose.GET_INSTANCE_HEALTH, "GET", f"http://{pod_ip}:{port}/health")
        except HttpError:
            return None  # not listening yet
        return await is_sleeping(self._http, pod_ip, port) if reply.ok else None
