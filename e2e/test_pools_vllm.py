"""A warm pool with real vLLM on the CPU (issue 45): 2 Nodes x 2 GPUs served by NVIDIA's DRA driver (the loopback
kubelet plays it), a launcher on each; a tiny model, never served before, declares a pool of one sleeping copy and
opts in to placement. Its first requester is hot: placed on the copy's GPU and served by the copy, woken. Released,
and the Node holding the model's sleepers drained (`kubectl drain`, as a node-pool upgrade runs it), the pool is
rebuilt on the other Node, and the next first requester is hot again, there.

Hot is judged by what happened (the copy woken, no instance made), not by the clock: on this shared 2-core machine a
wake's time depends on the load. Each hot start's time (requester start -> told ready) is printed, and bounded only by
HOT_WITHIN_S, below which a start cannot have loaded a model (e2e/actuation.py)."""

from collections.abc import AsyncIterator
from typing import Any

import pytest

from api import keys
from controller import pods
from e2e.actuation import HOT_WITHIN_S, VLLM_READY_S, actuate, release_one
from e2e.cluster.cluster import LoopbackCluster
from e2e.crds import run_kubectl
from e2e.dra import DRA_NODES, added_nodes, allow_admin_access, create_claim_template
from e2e.dualpods_env import DualPodsEnv
from e2e.kubelet.control import NodeInfo
from e2e.pools import pool_status
from e2e.tiny_model import ensure_tiny_model
from e2e.waiting import wait_for

MODEL = "pooled"
PLACED = {keys.PLACEMENT_ANNOTATION: keys.PLACEMENT_PREFER_SLEEPER}


@pytest.fixture
async def dra_nodes(cluster: LoopbackCluster) -> AsyncIterator[list[NodeInfo]]:
    async with added_nodes(cluster, "pool-dra", "dra") as nodes:
        yield nodes


async def _copies(env: DualPodsEnv) -> dict[str, tuple[str, dict[str, Any]]]:
    """Instance ID -> (Node, instance) of every sleeping instance of the model, as its Ready launchers list them."""
    found = {}
    for launcher in [pod for pod in await env.launchers() if pods.is_ready(pod)]:
        for instance in await env.sleepers(launcher):
            if (instance.get("annotations") or {}).get(keys.INSTANCE_ISC_NAME) == MODEL:
                found[instance["instance_id"]] = (launcher["spec"]["nodeName"], instance)
    return found


async def _pool_filled_on(env: DualPodsEnv, nodes: set[str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Wait until the ISC's status says its pool is filled and every sleeping copy is on `nodes`; the copies."""

    async def filled() -> dict[str, tuple[str, dict[str, Any]]]:
        pool, condition = await pool_status(env, MODEL)
        if condition.get("reason") != "Filled" or pool.get("ready", 0) < 1:
            return {}
        copies = await _copies(env)
        return copies if copies and {node for node, _ in copies.values()} <= nodes else {}

    return await wait_for(filled, what=f"the pool filled on {sorted(nodes)}", within=VLLM_READY_S, interval=0.5)


async def _first_start_is_hot(env: DualPodsEnv, copies: dict[str, tuple[str, dict[str, Any]]]) -> str:
    """Scale the model to 1: it must be served by one of `copies`, woken; the Node it ran on."""
    actuation = await actuate(env, MODEL, within=VLLM_READY_S)
    (requester,) = await env.requesters(MODEL)
    launcher = await env.launcher_of(requester)
    served = pods.annotations(launcher)[keys.INSTANCE_ID_ANNOTATION]
    assert served in copies, f"the first requester started on {served}, not on a copy of the pool: {sorted(copies)}"
    assert actuation.total < HOT_WITHIN_S
    print(f"a first start on the pool's copy, told ready in {actuation.total:.2f} s")
    node: str = launcher["spec"]["nodeName"]
    return node


async def test_a_pools_first_requester_is_hot_and_after_a_drain_the_pool_is_rebuilt_and_hot_again(
    dra_nodes: list[NodeInfo], env: DualPodsEnv, cluster: LoopbackCluster
) -> None:
    await allow_admin_access(env.api, env.namespace)
    await create_claim_template(env.api, env.namespace, "all-gpus", None)
    await create_claim_template(env.api, env.namespace, "one-gpu", 1)
    await env.create_launcher_config("lc", max_instances=2, launcher_args=[], claim_template="all-gpus")
    options = f"--model {ensure_tiny_model(45)} --served-model-name {MODEL} --max-model-len 256"
    await env.create_isc(MODEL, "lc", port=8005, options=options, isc_annotations=PLACED, warm_pool={"sleepers": 1})
    await env.create_requesters(MODEL, MODEL, replicas=0, claim_template="one-gpu")
    await env.create_population_policy("one-per-node", "lc", count=1, selector=DRA_NODES)
    names = {node.name for node in dra_nodes}

    first = await _first_start_is_hot(env, await _pool_filled_on(env, names))
    await release_one(env, MODEL)
    try:
        code, _, err = await run_kubectl(
            cluster, "drain", first, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=300s"
        )
        assert code == 0, f"kubectl drain failed: {err}"
        (other,) = names - {first}
        second = await _first_start_is_hot(env, await _pool_filled_on(env, {other}))
        assert second == other
    finally:
        await run_kubectl(cluster, "uncordon", first)
