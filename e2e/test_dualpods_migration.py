"""Switching from FMA's controllers to ours keeps what FMA left (issue 13 items 3 and 5).

A user uninstalls FMA 0.6 and installs this chart. FMA's controllers leave behind the LauncherConfig,
InferenceServerConfig and LauncherPopulationPolicy, an unbound launcher Pod labelled and annotated as FMA's
populator and dual-pods controller leave it (its template hash and launcher-config-hash, no token volume,
FMA's probes and environment), and in it a sleeping instance with FMA's instance ID, put to sleep through
vLLM's own route as FMA's controller does. Our controllers must take all of it over: the launcher is not
replaced, and a new requester wakes the sleeper instead of starting a new instance.

The instance ID and the bytes FMA hashes for the launcher template come from FMA's own code paths
(tests/fma_hash_vectors.json, case "e2e-migration"; the namespace and the LauncherConfig's UID are filled in
here), so nothing of our hashing code decides what FMA left. The launcher is ours running the stand-in server
(an allowed test double: FMA's image cannot run here), and it reads its GPUs from the gpu-map with the
downward-API variables ours needs. FMA's notifier sidecar is left out: our launcher image does not carry FMA's
notifier yet (item 2).
"""

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from api import keys
from api.crds import GROUP, VERSION, InferenceServerConfig, LauncherConfig
from controller import pods
from controller.launcher_template import DOWNWARD_ENV
from e2e.cluster.cluster import LoopbackCluster, pod_is_ready
from e2e.dualpods_env import DualPodsEnv, Obj
from e2e.waiting import wait_for

RS = "migrated"
NODE = "gpu-node-1"
VECTORS = json.loads((Path(__file__).parents[1] / "tests" / "fma_hash_vectors.json").read_text())
[FMA_INSTANCE] = [c for c in VECTORS["instanceIDs"] if c["name"] == "e2e-migration"]
[FMA_TEMPLATE] = [c for c in VECTORS["launcherTemplates"] if c["name"] == "e2e-migration"]
PORT = FMA_INSTANCE["msc"]["port"]
OPTIONS = FMA_INSTANCE["msc"]["options"]
ROUTING = FMA_INSTANCE["msc"]["labels"]  # app.kubernetes.io/name: FMA lets it route; so must we
[GPU] = FMA_INSTANCE["gpus"]


def fma_hash(data: str) -> str:
    """FMA's encoding of a hash: SHA-256, standard base64 without padding."""
    return base64.b64encode(hashlib.sha256(data.encode()).digest()).decode().rstrip("=")


def fma_template_hash(lc: LauncherConfig) -> str:
    """The template hash FMA computes for this LauncherConfig: the bytes its code hashed for the same template,
    with this cluster's namespace and UID in place of the vector's placeholders."""
    hashed = FMA_TEMPLATE["templateJSON"].replace(
        '"namespace":"e2e-namespace"', f'"namespace":"{lc.metadata.namespace}"'
    )
    return fma_hash(hashed.replace('"uid":"e2e-uid"', f'"uid":"{lc.metadata.uid}"'))


async def _read(env: DualPodsEnv, kind: type[LauncherConfig] | type[InferenceServerConfig], name: str) -> Any:
    obj = await env.objects.get_namespaced_custom_object(GROUP, VERSION, env.namespace, kind.RESOURCE.plural, name)
    return kind.from_k8s(obj)


def _fma_launcher(lc: LauncherConfig, node: str) -> Obj:
    """The unbound launcher Pod FMA 0.6 leaves on `node` for `lc` (pod-helper.go, after unbinding)."""
    template_hash = fma_template_hash(lc)
    [template] = lc.spec.pod_template.spec["containers"]
    health = {"httpGet": {"path": "/health", "port": keys.LAUNCHER_PORT, "scheme": "HTTP"}}
    listing = {"httpGet": {"path": "/v2/vllm/instances", "port": keys.LAUNCHER_PORT, "scheme": "HTTP"}}
    container = {
        **template,
        "env": [
            {"name": "PYTHONPATH", "value": "/app"},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
            {"name": "VLLM_SERVER_DEV_MODE", "value": "1"},
            *({"name": n, "valueFrom": {"fieldRef": {"fieldPath": p}}} for n, p in DOWNWARD_ENV.items()),
        ],
        "livenessProbe": {**health, "initialDelaySeconds": 10, "periodSeconds": 20, "failureThreshold": 3},
        "readinessProbe": {**listing, "initialDelaySeconds": 2, "periodSeconds": 5, "failureThreshold": 3},
    }
    name = lc.metadata.name
    return {
        "metadata": {
            "generateName": f"launcher-{name}-",
            "labels": {
                **lc.spec.pod_template.metadata.labels,
                keys.COMPONENT_LABEL: keys.LAUNCHER_COMPONENT,
                keys.LAUNCHER_CONFIG_NAME_LABEL: name,
                keys.SLEEPING_LABEL: "true",
                keys.NODE_NAME_LABEL: node,
            },
            "annotations": {
                keys.LAUNCHER_TEMPLATE_HASH_ANNOTATION: template_hash,
                keys.LAUNCHER_CONFIG_HASH_ANNOTATION: fma_hash(f"{template_hash};node={node}"),
            },
            "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "LauncherConfig", "name": name,
                                 "uid": lc.metadata.uid, "controller": False, "blockOwnerDeletion": False}],
        },
        "spec": {**lc.spec.pod_template.spec, "containers": [container],
                 "nodeSelector": {"kubernetes.io/hostname": node}},
    }  # fmt: skip


async def _launcher_ready(env: DualPodsEnv, name: str) -> Obj:
    async def ready() -> Obj:
        pod = await env.core.read_namespaced_pod(name, env.namespace)
        return env.api.sanitize_for_serialization(pod) if pod_is_ready(pod) else {}

    ready_pod: Obj = await wait_for(ready, what=f"launcher {name} Ready", within=120)
    return ready_pod


async def _sleeping_fma_instance(launcher: Obj, isc: InferenceServerConfig) -> dict[str, Any]:
    """Create the instance as FMA's controller does (its ID, its VllmConfig), wait for the server to answer, and
    put it to sleep through vLLM's own route, as FMA's controller does; returns the launcher's view of it."""
    ip, wanted = launcher["status"]["podIP"], FMA_INSTANCE["id"]
    notes = {keys.INSTANCE_ISC_NAME: isc.metadata.name, keys.INSTANCE_INFERENCE_PORT: str(PORT)}
    config = {"options": f"{OPTIONS} --port {PORT}", "gpu_uuids": [GPU], "annotations": notes}
    async with aiohttp.ClientSession() as http:
        async with http.put(f"http://{ip}:{keys.LAUNCHER_PORT}/v2/vllm/instances/{wanted}", json=config) as created:
            assert created.status == 201, await created.text()

        async def serving() -> bool:
            try:
                async with http.get(f"http://{ip}:{PORT}/health") as health:
                    return health.status == 200
            except aiohttp.ClientError:
                return False

        await wait_for(serving, what="the FMA-made instance serving", within=60)
        async with http.post(f"http://{ip}:{PORT}/sleep?level=1") as slept:
            assert slept.status == 200, await slept.text()
        async with http.get(f"http://{ip}:{keys.LAUNCHER_PORT}/v2/vllm/instances/{wanted}") as state:
            instance: dict[str, Any] = await state.json()
    assert instance["sleeping"], "the launcher sees the sleep done through vLLM's route"
    return instance


async def test_fmas_launcher_and_sleeping_instance_are_adopted_and_woken(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    env = DualPodsEnv(cluster, api, namespace, tmp_path)
    try:
        await env.setup()
        # What FMA's users created, and what FMA's controllers left.
        # As FMA's e2e writes it, without a securityContext: the template the vector's hash was made from.
        await env.create_launcher_config("lc", max_instances=2, launcher_args=["--stand-in"], restricted=False)
        await env.create_isc("isc", "lc", port=PORT, options=OPTIONS, labels=ROUTING)
        await env.create_population_policy("keep-one", "lc", count=1)
        lc, isc = await _read(env, LauncherConfig, "lc"), await _read(env, InferenceServerConfig, "isc")
        assert lc.spec.pod_template.to_k8s() == FMA_TEMPLATE["lc"]["spec"]["podTemplate"], "the vector's template"
        assert GPU in {gpu for n in await cluster.kubelet.nodes() if n.name == NODE for gpu in n.gpus}
        made = await env.core.create_namespaced_pod(namespace, _fma_launcher(lc, NODE))
        launcher = await _launcher_ready(env, made.metadata.name)
        before = await _sleeping_fma_instance(launcher, isc)

        await env.controllers.install()
        await env.create_requesters(RS, "isc", node=NODE, gpu=GPU)
        requester = await env.ready_requester(RS)

        bound = await env.launcher_of(requester)
        assert bound["metadata"]["name"] == made.metadata.name, "FMA's launcher is bound, not a new one"
        assert pods.labels(requester)[keys.INSTANCE_LABEL] == before["instance_id"]
        listing = await env.instances(bound)
        [instance] = listing["instances"]
        assert instance["instance_id"] == before["instance_id"]
        assert instance["process"]["pid"] == before["process"]["pid"], "woken, not started anew"
        assert not instance["sleeping"]
        assert pods.labels(bound)["app.kubernetes.io/name"] == "chat", "the ISC's routing label is applied"
        same_node = [p for p in await env.launchers() if p["spec"].get("nodeName") == NODE]
        assert [p["metadata"]["name"] for p in same_node] == [made.metadata.name], "the populator kept it as current"
        assert (
            pods.annotations(bound)[keys.LAUNCHER_TEMPLATE_HASH_ANNOTATION]
            == (launcher["metadata"]["annotations"][keys.LAUNCHER_TEMPLATE_HASH_ANNOTATION])
        )
    finally:
        await env.teardown()
