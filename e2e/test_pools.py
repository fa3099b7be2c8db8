"""Warm pools (E23) on the loopback cluster, with stand-in launchers (cheap instances that start at once): a pool that
cannot be filled says so in its ISC's status and an Event, fills once a GPU frees, and yields its copy to a requester
that needs the room. Real vLLM pools, hot first starts and drains are in e2e/test_pools_vllm.py.

The pool selects the first GPU Node only (its hostname label); that Node has 2 GPUs and the policy keeps 2 launchers
on each Node. Requesters of another model pin its GPUs (as FMA's tests pin them)."""

from typing import Any

from api import keys
from controller import pods
from e2e.dualpods_env import DualPodsEnv
from e2e.pools import pool_status
from e2e.waiting import wait_for

POOLED, BUSY = "pooled", "busy"
WITHIN_S = 120


async def _until_pool(env: DualPodsEnv, reason: str, ready: int) -> dict[str, Any]:
    async def reached() -> dict[str, Any]:
        pool, condition = await pool_status(env, POOLED)
        return condition if condition.get("reason") == reason and pool.get("ready") == ready else {}

    return await wait_for(reached, what=f"the pool {reason} with {ready} ready", within=WITHIN_S, interval=0.5)


async def _events(env: DualPodsEnv, reason: str) -> list[str]:
    listed = await env.core.list_namespaced_event(env.namespace, field_selector=f"involvedObject.name={POOLED}")
    return [e.message for e in listed.items if e.reason == reason]


async def _copies(env: DualPodsEnv) -> list[tuple[str, dict[str, Any]]]:
    """(launcher, instance) of every instance of the pooled ISC, as the launchers list them."""
    found = []
    for launcher in await env.launchers():
        for instance in (await env.instances(launcher))["instances"]:
            if (instance.get("annotations") or {}).get(keys.INSTANCE_ISC_NAME) == POOLED:
                found.append((pods.name(launcher), instance))
    return found


async def test_an_unfillable_pool_says_why_fills_when_a_gpu_frees_and_yields_to_a_requester(env: DualPodsEnv) -> None:
    node = (await env.cluster.kubelet.nodes())[0]
    gpu0, gpu1 = sorted(node.gpus)[:2]
    await env.create_launcher_config("lc", max_instances=2, launcher_args=["--stand-in"])
    await env.create_population_policy("two-per-node", "lc", count=2)
    await env.create_isc(BUSY, "lc", port=8005, options=f"--model {BUSY}")
    for name, gpu in (("busy-0", gpu0), ("busy-1", gpu1)):
        await env.create_requesters(name, BUSY, node=node.name, gpu=gpu)
        await env.ready_requester(name)

    pool = {"sleepers": 1, "nodeSelector": {"matchLabels": {keys.HOSTNAME_LABEL: node.name}}}
    await env.create_isc(POOLED, "lc", port=8006, options=f"--model {POOLED}", warm_pool=pool)
    condition = await _until_pool(env, "NoIdleGPU", ready=0)
    assert condition["status"] == "False"
    assert (await pool_status(env, POOLED))[0]["declared"] == 1
    assert await wait_for(lambda: _events(env, "PoolUnfillable"), what="a PoolUnfillable Event", within=30)
    assert not await _copies(env), "no copy while every GPU of its Node serves"

    await env.scale("busy-1", 0)  # its instance sleeps; its GPU is idle
    await env.wait_gone("busy-1")
    condition = await _until_pool(env, "Filled", ready=1)
    assert condition["status"] == "True"
    assert await wait_for(lambda: _events(env, "PoolFilled"), what="a PoolFilled Event", within=30)
    ((holder, copy),) = await _copies(env)
    assert copy["sleeping"]
    assert copy["gpu_uuids"] == [gpu1]
    assert copy["annotations"][keys.INSTANCE_POOL] == POOLED

    # The launcher holding the copy also holds busy-1's sleeper: it is full (maxInstances 2). busy-1 comes back on its
    # GPU and goes again, so that the copy is now its least recently used instance; then a third model's requester
    # on that GPU needs the launcher's room, and the copy goes: a pool never keeps a requester out.
    await env.scale("busy-1", 1)
    assert pods.name(await env.launcher_of(await env.ready_requester("busy-1"))) == holder
    await env.scale("busy-1", 0)
    await env.wait_gone("busy-1")

    async def unbound() -> bool:
        return pods.binding(await env.pod(holder)) is None

    await wait_for(unbound, what=f"launcher {holder} unbound", within=60, interval=0.1)
    await env.create_isc("third", "lc", port=8007, options="--model third")
    await env.create_requesters("third", "third", node=node.name, gpu=gpu1)
    assert pods.name(await env.launcher_of(await env.ready_requester("third"))) == holder
    assert not await _copies(env), "the copy made room for the requester"
    await _until_pool(env, "NoIdleGPU", ready=0)
