"""FMA's own end-to-end checks (its `test/e2e/test-cases.sh`, launcher mode), reproduced case by case and run against
FMA's released controllers and against ours on the same cluster (issue 46 item 3).

FMA's script checks observable facts in one sequence, each case starting from what the last left; so does this
test, once per controller set, with our launcher serving stand-in model servers (vLLM's HTTP surface, sleep and
wake) and our requester (its SPI open: FMA's controller sends no token). Each step names FMA's case. Left out:
FMA's admission-policy script (`validate.sh`: the policies, not the controllers; ours are tested in
e2e/test_admission_policies.py) and its kind-specific waits. FMA's `sleep 30` after its controller's restart is 10 s
here: long enough for a restarted controller to have acted on every launcher (it lists them at once).
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from api.crds import GROUP, VERSION, LauncherPopulationPolicy
from controller import pods
from e2e.chart import DUAL_PODS
from e2e.cluster.cluster import LoopbackCluster
from e2e.dualpods_env import DualPodsEnv, Obj, installed
from e2e.fma_controllers import OPEN_SPI, FmaControllers, under_fma
from e2e.swaps import open_listing
from e2e.waiting import wait_for, wait_pod_gone

RS, RS2 = "rs", "rs2"
TEST_LABEL = "e2e-test.fma.llm-d.ai/isc-label"
TEST_ANNOTATION = "e2e-test.fma.llm-d.ai/isc-annotation"
TEMPLATE_LABEL = "from-launcher-config"  # what e2e/dualpods_env.py's LauncherConfigs put on their launchers
# FMA's own bounds: a requester Ready within 300 s (its first), 30 s after its controller's restart.
READY_S, READY_AFTER_RESTART_S = 300, 30
SETTLE_S = 10


@dataclass
class ControllerSet:
    """What the cases do differently with FMA's controllers and ours: how to restart the dual-pods controller, and
    how to call a launcher (ours carry the chart's token; FMA's controllers make launchers without one)."""

    env: DualPodsEnv
    fma: FmaControllers | None

    async def restart(self) -> None:
        if self.fma is None:
            await self.env.controllers.restart()
        else:
            await self.fma.kill(DUAL_PODS)
            self.fma.restart(DUAL_PODS)

    async def listing(self, launcher: Obj) -> dict[str, Any]:
        if self.fma is None:
            return dict(await self.env.instances(launcher))
        return await open_listing(launcher)

    async def delete_instance(self, launcher: Obj, instance_id: str) -> None:
        path = f"/v2/vllm/instances/{instance_id}"
        if self.fma is None:
            await self.env.launcher_api(launcher, "DELETE", path)
            return
        url = f"http://{launcher['status']['podIP']}:{keys.LAUNCHER_PORT}{path}"
        async with aiohttp.ClientSession() as http, http.delete(url) as response:
            assert response.status < 300, await response.text()

    async def metrics(self) -> str:
        return await (self.fma.metrics() if self.fma is not None else self.env.controllers.metrics())


@contextlib.asynccontextmanager
async def controller_set(
    which: str, cluster: LoopbackCluster, api: client.ApiClient, namespace: str, work_dir: Path
) -> AsyncIterator[ControllerSet]:
    if which == "fma":
        async with under_fma(cluster, api, namespace, work_dir, OPEN_SPI) as (env, fma):
            yield ControllerSet(env, fma)
    else:
        async with installed(cluster, api, namespace, work_dir, images=OPEN_SPI) as env:
            yield ControllerSet(env, None)


async def total_instances(controllers: ControllerSet, launcher: Obj) -> int:
    return int((await controllers.listing(launcher))["total_instances"])


async def served(env: DualPodsEnv, replica_set: str = RS) -> tuple[Obj, Obj]:
    """The set's one Ready, bound requester and its launcher."""
    requester = await env.ready_requester(replica_set, within=READY_S)
    return requester, await env.launcher_of(requester)


async def unbind(env: DualPodsEnv) -> None:
    """Scale the set to 0; its requester gone and its launcher unbound."""
    await env.scale(RS, 0)
    await env.wait_gone(RS)
    await env.wait_launchers_unbound(within=60)


async def rescale(env: DualPodsEnv, isc: str | None = None) -> None:
    """Scale the set to 0 (its launcher unbound), point it at `isc`, and scale it to 1."""
    await unbind(env)
    if isc is not None:
        await env.set_requester_isc(RS, isc)
    await env.scale(RS, 1)


def accelerators(requester: Obj) -> str:
    return pods.annotations(requester).get(keys.ACCELERATORS_ANNOTATION, "")


@pytest.mark.parametrize("which", ["fma", "ours"])
async def test_fmas_launcher_mode_cases(
    which: str, cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    async with controller_set(which, cluster, api, namespace, tmp_path) as controllers:
        await cases(controllers)


async def cases(controllers: ControllerSet) -> None:
    env = controllers.env
    # GPU probe: a Pod asking for two GPUs runs; its Node is the test Node.
    await env.core.create_namespaced_pod(env.namespace, {
        "metadata": {"name": "gpu-probe"},
        "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10.2",
                                 "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
    })  # fmt: skip
    probe = await wait_for(lambda: _running(env, "gpu-probe"), what="the GPU probe Running", within=60)
    testnode = pods.node_name(probe)
    assert testnode
    await env.delete_pod("gpu-probe")
    await wait_pod_gone(env.core, env.namespace, "gpu-probe", within=60)

    # Basic: the population policy's launchers, one per GPU Node; a requester served by one of them, which carries
    # the ISC's and the template's metadata.
    await env.create_launcher_config("lc", max_instances=2, launcher_args=["--stand-in"], restricted=False)
    for isc, port in (("isc", 8005), ("isc2", 8006), ("isc3", 8007)):
        await env.create_isc(isc, "lc", port=port, options=f"--model {isc}", labels={TEST_LABEL: "test-value"},
                             annotations={TEST_ANNOTATION: "test-value"})  # fmt: skip
    await env.create_population_policy("lpp", "lc", count=1)
    gpu_nodes = len(await env.cluster.kubelet.nodes())
    await wait_for(lambda: _launchers_at_least(env, gpu_nodes), what=f"{gpu_nodes} launchers", within=60)
    await env.create_requesters(RS, "isc", node=testnode)
    req1, launcher1 = await served(env)
    assert [pods.name(p) for p in await env.pods() if pods.labels(p).get(keys.DUAL_LABEL) == pods.name(req1)] == [
        pods.name(launcher1)
    ]
    assert pods.labels(launcher1).get(keys.DUAL_LABEL) == pods.name(req1)
    assert pods.is_ready(launcher1)
    assert pods.labels(launcher1).get(TEST_LABEL) == "test-value"
    assert pods.annotations(launcher1).get(TEST_ANNOTATION) == "test-value"
    assert TEMPLATE_LABEL in pods.labels(launcher1)
    pinned = accelerators(req1)
    assert pinned, "no accelerators recorded"

    # LPP keys: two counts for one LauncherConfig are refused.
    duplicate = {"launcherConfigName": "lc", "launcherCount": 1}
    with pytest.raises(ApiException) as refused:
        await env.objects.create_namespaced_custom_object(GROUP, VERSION, env.namespace,
            LauncherPopulationPolicy.RESOURCE.plural, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "LauncherPopulationPolicy", "metadata": {"name": "dup"},
                "spec": {"enhancedNodeSelector": {"labelSelector": {"matchLabels": {"nvidia.com/gpu.present": "true"}}},
                         "countForLauncher": [duplicate, {**duplicate, "launcherCount": 2}]},
            })  # fmt: skip
    assert refused.value.status == 422

    # Collision: a second requester of the same ISC on the test Node gets another launcher and another GPU.
    await env.create_requesters(RS2, "isc", node=testnode)
    req2, launcher2 = await served(env, RS2)
    assert pods.name(launcher2) != pods.name(launcher1)
    assert accelerators(req2) != pinned
    await env.apps.delete_namespaced_replica_set(RS2, env.namespace)
    await env.wait_gone(RS2)
    await env.delete_pod(pods.name(launcher2))

    # Wake-up: unbound, launcher 1 keeps its template's metadata and loses the ISC's; pinned to req1's GPU, the next
    # requester is bound to launcher 1 again, with the ISC's metadata back.
    await unbind(env)
    launcher1 = await env.pod(pods.name(launcher1))
    assert not pods.labels(launcher1).get(keys.DUAL_LABEL)
    assert TEST_LABEL not in pods.labels(launcher1)
    assert TEST_ANNOTATION not in pods.annotations(launcher1)
    assert TEMPLATE_LABEL in pods.labels(launcher1)
    await env.pin_requesters(RS, testnode, pinned)
    await env.scale(RS, 1)
    requester, launcher = await served(env)
    assert pods.name(launcher) == pods.name(launcher1)
    assert pods.labels(launcher).get(TEST_LABEL) == "test-value"
    assert accelerators(requester) == pinned

    # Two instances, switching: isc2 and back to isc, each on launcher 1 and the pinned GPU.
    for isc in ("isc2", "isc"):
        await rescale(env, isc)
        requester, launcher = await served(env)
        assert pods.name(launcher) == pods.name(launcher1), isc
        assert accelerators(requester) == pinned, isc

    # Instance cap (maxInstances 2): a third ISC replaces a sleeper; no new launcher.
    await unbind(env)
    assert await total_instances(controllers, launcher1) == 2
    launchers = {pods.name(p) for p in await env.launchers() if not pods.is_deleting(p)}
    await env.set_requester_isc(RS, "isc3")
    await env.scale(RS, 1)
    requester, launcher = await served(env)
    assert pods.name(launcher) == pods.name(launcher1)
    assert {pods.name(p) for p in await env.launchers() if not pods.is_deleting(p)} == launchers
    assert await total_instances(controllers, launcher1) == 2

    # The dual-pods controller restarted: nothing changes; a requester is then served within 30 s.
    await unbind(env)
    await controllers.restart()
    await asyncio.sleep(SETTLE_S)
    assert {pods.name(p) for p in await env.launchers() if not pods.is_deleting(p)} == launchers
    assert await total_instances(controllers, launcher1) == 2
    await env.set_requester_isc(RS, "isc2")
    await env.scale(RS, 1)
    requester = await env.ready_requester(RS, within=READY_AFTER_RESTART_S)
    assert pods.name(await env.launcher_of(requester)) == pods.name(launcher1)

    # An obsolete sleeper: isc3 changed, its sleeping instance goes.
    await env.patch_isc("isc3", {"options": "--model isc3 --served-model-name other"})
    await wait_for(lambda: _total_is(controllers, launcher1, 1), what="isc3's sleeper deleted", within=60)

    # An obsolete awake instance: isc2 changed while served; at the unbinding it goes instead of sleeping.
    await env.patch_isc("isc2", {"options": "--model isc2 --served-model-name other"})
    await env.scale(RS, 0)
    await env.wait_gone(RS)
    await wait_for(lambda: _total_is(controllers, launcher1, 0), what="isc2's instance deleted", within=60)
    await env.patch_isc("isc2", {"options": "--model isc2"})

    # An unbound launcher deleted: the next requester is served by a new one, on the pinned GPU.
    await env.delete_pod(pods.name(launcher1))
    await wait_pod_gone(env.core, env.namespace, pods.name(launcher1), within=60)
    await env.scale(RS, 1)
    requester, launcher = await served(env)
    assert pods.name(launcher) != pods.name(launcher1)
    assert accelerators(requester) == pinned

    # A stopped instance: its requester is deleted, and the set's next one is served by the same launcher.
    [running] = [i for i in (await controllers.listing(launcher))["instances"] if i["status"] == "running"]
    await controllers.delete_instance(launcher, running["instance_id"])
    await wait_pod_gone(env.core, env.namespace, pods.name(requester), within=60)  # deleted by the controller
    requester, again = await served(env)
    assert pods.name(again) == pods.name(launcher)
    assert accelerators(requester) == pinned

    # The end: the dual-pods controller's metrics are scraped.
    assert "# TYPE" in await controllers.metrics()


async def _running(env: DualPodsEnv, name: str) -> Obj:
    pod = await env.pod(name)
    return pod if pod.get("status", {}).get("phase") == "Running" else {}


async def _launchers_at_least(env: DualPodsEnv, count: int) -> bool:
    launchers = [p for p in await env.launchers() if not pods.is_deleting(p)]
    return len(launchers) >= count and any(pods.is_ready(p) for p in launchers)


async def _total_is(controllers: ControllerSet, launcher: Obj, count: int) -> bool:
    return await total_instances(controllers, launcher) == count


pytestmark = pytest.mark.timeout(1200)
