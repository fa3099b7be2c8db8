"""Dual pods on Nodes whose GPUs come through DRA or CDI, beside device-plugin Nodes (issue 24).

The session's cluster has two device-plugin Nodes; each test adds one Node of another kind for itself.
On a DRA Node (NVIDIA's driver played by the loopback kubelet: no `nvidia.com/gpu`, a ResourceSlice), a
LauncherPopulationPolicy selecting by the driver's devices puts a launcher that sees the Node's GPUs through
an admin-access claim; a requester asking for two GPUs through one ResourceClaim is bound to that launcher,
its instance pinned to exactly the two devices the scheduler allocated, while a device-plugin requester is
served on another Node; a second DRA requester gets neither GPU while the first holds them. On a CDI-style
device-plugin Node (`NVIDIA_VISIBLE_DEVICES=void`), the requester reports the injected GPU and swaps work.
Launchers run stand-in model servers.
"""

from collections.abc import AsyncIterator

import pytest

from api import keys
from api.keys import HOSTNAME_LABEL as HOSTNAME
from controller import pods
from e2e.actuation import release
from e2e.cluster.cluster import LoopbackCluster
from e2e.dra import DRA_NODES, added_node, allow_admin_access, create_claim_template
from e2e.dualpods_env import DualPodsEnv, Obj
from e2e.kubelet.control import NodeInfo
from e2e.kubelet.dra import DRIVER, device_name
from e2e.waiting import wait_for

PORTS = {"model-a": 8005, "model-b": 8006}
DRA_PORTS = {"dra-a": 8007, "dra-b": 8008}
READY_S = 120


# Requested before `env`, so that the Node outlives the controllers' teardown of the requesters.
@pytest.fixture
async def dra_node(cluster: LoopbackCluster) -> AsyncIterator[NodeInfo]:
    async with added_node(cluster, "dra-node-2", "dra") as node:
        yield node


@pytest.fixture
async def cdi_node(cluster: LoopbackCluster) -> AsyncIterator[NodeInfo]:
    async with added_node(cluster, "cdi-node-2", "device-plugin-cdi") as node:
        yield node


@pytest.fixture
async def stand_in_env(env: DualPodsEnv) -> DualPodsEnv:
    """A LauncherConfig of stand-in model servers and an ISC per model."""
    await env.create_launcher_config("lc", max_instances=2, launcher_args=["--stand-in"])
    for isc, port in PORTS.items():
        await env.create_isc(isc, "lc", port=port, options=f"--model {isc}")
    return env


async def instance_gpus(env: DualPodsEnv, requester: Obj) -> list[str]:
    """The GPUs of the launcher instance `requester` is bound to."""
    listing = await env.instances(await env.launcher_of(requester))
    (serving,) = [i for i in listing["instances"] if not i.get("sleeping")]
    return sorted(serving["gpu_uuids"])


def accelerators(requester: Obj) -> list[str]:
    return sorted(pods.annotations(requester)[keys.ACCELERATORS_ANNOTATION].split(","))


async def unschedulable(env: DualPodsEnv, replica_set: str) -> bool:
    found = await env.requesters(replica_set)
    conditions = [c for p in found for c in p["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
    return len(found) == 1 and [c["status"] for c in conditions] == ["False"]


async def bound_event(env: DualPodsEnv, requester: Obj) -> str:
    """The message of the requester's Bound Event."""
    selector = f"involvedObject.name={pods.name(requester)},reason=Bound"

    async def found() -> list[str]:
        events = await env.core.list_namespaced_event(env.namespace, field_selector=selector)
        return [str(e.message) for e in events.items]

    return (await wait_for(found, what="the Bound Event"))[0]


async def ready_launchers_of(env: DualPodsEnv, config: str) -> list[Obj]:
    return [
        p
        for p in await env.launchers()
        if pods.labels(p).get(keys.LAUNCHER_CONFIG_NAME_LABEL) == config and pods.is_ready(p)
    ]


async def test_dra_and_device_plugin_requesters_side_by_side(dra_node: NodeInfo, stand_in_env: DualPodsEnv) -> None:
    env = stand_in_env
    await allow_admin_access(env.api, env.namespace)
    await create_claim_template(env.api, env.namespace, "all-gpus", None)
    await create_claim_template(env.api, env.namespace, "two-gpus", 2)
    await create_claim_template(env.api, env.namespace, "one-gpu", 1)
    await env.create_launcher_config("lc-dra", max_instances=2, launcher_args=["--stand-in"], claim_template="all-gpus")
    for isc, port in DRA_PORTS.items():
        await env.create_isc(isc, "lc-dra", port=port, options=f"--model {isc}")
    dra_gpus = sorted(dra_node.gpus)

    # Selected by the devices NVIDIA's driver publishes for it (it has no nvidia.com/gpu), the DRA Node and no
    # other gets a launcher, which sees the Node's GPUs through its admin-access claim.
    await env.create_population_policy("dra-nodes", "lc-dra", 1, selector=DRA_NODES)
    (populated,) = await wait_for(
        lambda: ready_launchers_of(env, "lc-dra"), what="the DRA Node's launcher", within=READY_S
    )
    assert populated["spec"]["nodeName"] == dra_node.name

    # One claim for two GPUs: both GPUs of the DRA Node, and an instance of that launcher pinned to exactly those.
    await env.create_requesters("dra", "dra-a", node=dra_node.name, claim_template="two-gpus")
    requester = await env.ready_requester("dra", within=READY_S)
    assert requester["spec"]["nodeName"] == dra_node.name
    assert accelerators(requester) == dra_gpus
    assert await instance_gpus(env, requester) == dra_gpus
    assert pods.name(await env.launcher_of(requester)) == pods.name(populated)
    # The requester's Event names the devices, as `kubectl get resourceslices` and its claim show them.
    devices = [f"{DRIVER}/{dra_node.name}/{device_name(i)} ({u})" for u, i in dra_node.gpus.items()]
    message = await bound_event(env, requester)
    assert all(d in message for d in devices), message

    # A device-plugin requester in the same cluster is served on a device-plugin Node.
    plugin_node: NodeInfo = next(n for n in await env.cluster.kubelet.nodes() if n.name != dra_node.name)
    await env.create_requesters("plugin", "model-b", node=plugin_node.name)
    plugin = await env.ready_requester("plugin", within=READY_S)
    (plugin_gpu,) = accelerators(plugin)
    assert plugin_gpu in plugin_node.gpus
    assert await instance_gpus(env, plugin) == [plugin_gpu]

    # No GPU is left on the DRA Node: a second DRA requester is not scheduled while the first holds both.
    await env.create_requesters("dra-second", "dra-b", node=dra_node.name, claim_template="one-gpu")
    await wait_for(lambda: unschedulable(env, "dra-second"), what="the second DRA requester unschedulable")
    await env.scale("dra", 0)  # its claim goes with it (the plugin requester stays bound)
    await env.wait_gone("dra", within=READY_S)
    second = await env.ready_requester("dra-second", within=READY_S)
    (second_gpu,) = accelerators(second)
    assert second_gpu in dra_gpus
    assert await instance_gpus(env, second) == [second_gpu]


async def test_cdi_node_requester_reports_the_injected_gpu_and_swaps(
    cdi_node: NodeInfo, stand_in_env: DualPodsEnv
) -> None:
    env = stand_in_env
    # A launcher kept on the CDI Node while unbound, so that its sleeping instances are woken again.
    await env.create_population_policy(
        "cdi-node", "lc", 1, {"labelSelector": {"matchLabels": {HOSTNAME: cdi_node.name}}}
    )
    await env.create_requesters("cdi", "model-a", node=cdi_node.name)
    requester = await env.ready_requester("cdi", within=READY_S)
    (gpu,) = accelerators(requester)
    assert gpu in cdi_node.gpus
    launcher = await env.launcher_of(requester)
    first = await env.instances(launcher)
    assert await instance_gpus(env, requester) == [gpu]

    # A -> B -> A on the same GPU; A is woken on its launcher, not made again.
    for isc in ("model-b", "model-a"):
        await release(env, "cdi")
        await env.set_requester_isc("cdi", isc)
        await env.scale("cdi", 1)
        requester = await env.ready_requester("cdi", within=READY_S)
        assert accelerators(requester) == [gpu]
        assert await instance_gpus(env, requester) == [gpu]
    assert pods.name(await env.launcher_of(requester)) == pods.name(launcher)
    (model_a,) = [i for i in first["instances"] if not i.get("sleeping")]
    now = {i["instance_id"]: i for i in (await env.instances(launcher))["instances"]}
    assert model_a["instance_id"] in now
    assert not now[model_a["instance_id"]].get("sleeping")
