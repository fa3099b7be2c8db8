"""First light of the dual-pods controller: cold start, unbind with sleep, hot start."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from api import keys
from e2e.cluster.cluster import LoopbackCluster
from e2e.dualpods_env import DualPodsEnv
from e2e.waiting import wait_for


@pytest.fixture
async def env(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> AsyncIterator[DualPodsEnv]:
    environment = DualPodsEnv(cluster, api, namespace, tmp_path)
    await environment.setup()
    environment.controller.start()
    yield environment
    environment.teardown()


async def test_cold_then_hot(env: DualPodsEnv) -> None:
    await env.create_launcher_config("lc", max_instances=2, launcher_args=["--stand-in"])
    await env.create_isc("isc-a", "lc", port=8005, options="--model tiny-a")
    node = (await env.cluster.kubelet.nodes())[0]
    gpu = sorted(node.gpus)[0]
    await env.create_requesters("rs", "isc-a", node=node.name, gpu=gpu)
    requester = await env.ready_requester("rs")
    launcher = await env.launcher_of(requester)
    assert launcher["metadata"]["labels"][keys.DUAL_LABEL] == requester["metadata"]["name"]
    listing = await env.instances(launcher)
    assert listing["total_instances"] == 1

    await env.scale("rs", 0)
    await env.wait_gone("rs")

    async def unbound() -> bool:
        pod = await env.core.read_namespaced_pod(launcher["metadata"]["name"], env.namespace)
        return keys.REQUESTER_ANNOTATION not in (pod.metadata.annotations or {})

    await wait_for(unbound, what="the launcher unbound")
    assert (await env.instances(launcher))["instances"][0]["sleeping"] is True

    await env.scale("rs", 1)
    again = await env.ready_requester("rs")
    assert again["metadata"]["labels"][keys.DUAL_LABEL] == launcher["metadata"]["name"]
