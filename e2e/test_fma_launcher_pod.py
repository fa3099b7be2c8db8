"""dualpods' launcher started the way FMA's controllers start it, in a Pod on the loopback cluster.

The Pod is what FMA 0.6.4's `pkg/controller/utils/pod-helper.go` makes of a LauncherConfig like FMA's own
e2e one (`test/e2e/mkobjs.sh`): the `inference-server` container runs FMA's command `python3 launcher.py
--mock-gpus --port 8001 --log-level info` in the image's /app, with FMA's required environment and probes
(liveness `/health`, readiness `GET /v2/vllm/instances`), and the injected sidecar `state-change-reflector`
runs `python3 /app/launcher_pod_notifier.py` from the same image, as a ServiceAccount that may get and patch
Pods. One thing differs, forced by the loopback cluster, where every Pod shares the host's network:
FMA's `--host 0.0.0.0` is left out (the image binds the Pod's own address; the notifier's
`LAUNCHER_BASE_URL=http://127.0.0.1:8001` reaches it there, e2e/kubelet/env.py). The launcher forks the stand-in runtime
(LAUNCHER_STAND_IN, an environment variable, so FMA's command line stays as it is).
"""

import hashlib
import json
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from api.keys import INFERENCE_SERVER_CONTAINER
from e2e.cluster.cluster import LoopbackCluster, pod_is_ready
from e2e.cluster.ports import free_port
from e2e.waiting import wait_for, wait_service_account

IMAGE = "dualpods/launcher:latest"
ACCOUNT = "testlauncher"
SIGNATURE = "dual-pods.llm-d.ai/vllm-instance-signature"
LAUNCHER_PORT = 8001


def field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def http_probe(path: str, initial: int, period: int, timeout: int, failures: int) -> dict[str, Any]:
    """pod-helper.go's probes of the launcher (initial delay, period, timeout, failure threshold)."""
    return {
        "httpGet": {"path": path, "port": LAUNCHER_PORT, "scheme": "HTTP"},
        "initialDelaySeconds": initial,
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "successThreshold": 1,
        "failureThreshold": failures,
    }


def fma_launcher_pod(name: str) -> dict[str, Any]:
    launcher = {
        "name": INFERENCE_SERVER_CONTAINER,
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/bash", "-c"],
        "args": [f"python3 launcher.py --mock-gpus --port {LAUNCHER_PORT} --log-level info"],
        "env": [
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("NAMESPACE", "metadata.namespace"),
            {"name": "LAUNCHER_STAND_IN", "value": "true"},
            # pod-helper.go's requiredEnvVars
            {"name": "PYTHONPATH", "value": "/app"},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
            {"name": "VLLM_SERVER_DEV_MODE", "value": "1"},
        ],
        "livenessProbe": http_probe("/health", 10, 20, 1, 3),
        "readinessProbe": http_probe("/v2/vllm/instances", 2, 5, 2, 3),
        "resources": {"limits": {"nvidia.com/gpu": "0"}, "requests": {"nvidia.com/gpu": "0"}},
    }
    notifier = {
        "name": "state-change-reflector",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["python3", "/app/launcher_pod_notifier.py"],
        "env": [
            {"name": "LAUNCHER_BASE_URL", "value": f"http://127.0.0.1:{LAUNCHER_PORT}"},
            field_env("POD_NAME", "metadata.name"),
            field_env("NAMESPACE", "metadata.namespace"),
        ],
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "128Mi"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/component": "launcher",
                "dual-pods.llm-d.ai/launcher-config-name": "fma",
                "dual-pods.llm-d.ai/sleeping": "true",
            },
        },
        "spec": {
            "serviceAccountName": ACCOUNT,
            "terminationGracePeriodSeconds": 10,
            "containers": [launcher, notifier],
        },
    }


async def notifier_account(api: client.ApiClient, namespace: str) -> None:
    """What FMA's e2e gives its launcher Pods: a ServiceAccount that may get and patch Pods (the notifier) and
    read the gpu-map ConfigMap (`--mock-gpus`)."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": ACCOUNT}})
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]},
             {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]  # fmt: skip
    await rbac.create_namespaced_role(namespace, {"metadata": {"name": ACCOUNT}, "rules": rules})
    await rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": ACCOUNT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACCOUNT},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}],
    })  # fmt: skip
    await wait_service_account(core, namespace, ACCOUNT)


def fma_signature(pairs: list[tuple[str, str]]) -> str:
    return hashlib.sha256(json.dumps(sorted(pairs), separators=(",", ":")).encode()).hexdigest()


async def test_fmas_command_and_notifier_make_a_ready_launcher_with_its_signature(
    api: client.ApiClient, namespace: str, cluster: LoopbackCluster
) -> None:
    core = client.CoreV1Api(api)
    await notifier_account(api, namespace)
    await core.create_namespaced_pod(namespace, fma_launcher_pod("fma-launcher"))

    async def ready() -> client.V1Pod | None:
        pod = await core.read_namespaced_pod("fma-launcher", namespace)
        return pod if pod_is_ready(pod) else None

    pod = await wait_for(ready, what="the launcher Pod to be Ready (FMA's readiness probe)", within=120)

    async def annotation() -> str | None:
        annotations = (await core.read_namespaced_pod("fma-launcher", namespace)).metadata.annotations or {}
        return annotations.get(SIGNATURE)

    async def signed(expected: str) -> bool:
        return await annotation() == expected

    await wait_for(lambda: signed(fma_signature([])), what="the notifier's signature of no instances", within=30)
    await cluster.kubelet.publish_gpu_map(namespace)  # FMA's mock GPUs: the node's entry of the gpu-map ConfigMap
    (node,) = [n for n in await cluster.kubelet.nodes() if n.name == pod.spec.node_name]
    url = f"http://{pod.status.pod_ip}:{LAUNCHER_PORT}/v2/vllm/instances"
    async with aiohttp.ClientSession() as http:
        body = {"options": f"--model tiny --port {free_port()}", "gpu_uuids": [sorted(node.gpus)[0]]}
        async with http.put(f"{url}/e2e", json=body) as response:
            assert response.status == 201, await response.text()
        await wait_for(lambda: signed(fma_signature([("e2e", "running")])),
                       what="the signature of the new instance", within=30)  # fmt: skip
        async with http.delete(f"{url}/e2e") as response:
            assert response.status == 200
    await wait_for(lambda: signed(fma_signature([])), what="the signature after the delete", within=30)

    notifier_log = cluster.container_log(pod, "state-change-reflector")
    assert "Inference-server container is ready; starting notifier polling" in notifier_log
    assert notifier_log.count("Published launcher state change") == 3, notifier_log
    launcher_log = cluster.container_log(pod, INFERENCE_SERVER_CONTAINER)
    assert f"GPUs come from ConfigMap {namespace}/gpu-map[{node.name}]" in launcher_log, launcher_log
