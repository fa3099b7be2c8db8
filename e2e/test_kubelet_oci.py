"""The loopback kubelet's OCI runtime (e2e/kubelet/oci.py): a Pod whose image is in local container storage
runs as a real container (podman + runc), with what the process runtime gives a container: the Pod's
address on the host network, its environment, volumes, service-account files and GPU variables, probes,
restarts, grace periods, logs, and removal with the Pod and with the kubelet.

The image is the Debian base `make images` builds its images on (it has python3); real components'
images run in e2e/test_real_images.py.
"""

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from kubernetes_asyncio import client

from e2e.cluster.cluster import LoopbackCluster
from e2e.kubelet import oci
from e2e.kubelet.config import KubeletConfig
from e2e.kubelet.logs import container_log
from e2e.test_loopback_cluster import get_json, is_running_and_ready, pod_manifest, wait_pod
from e2e.waiting import wait_pod_gone
from scripts.images import rootfs, tools

PORT = 8080
# An HTTP server on the Pod's address: /env answers its environment and what its mounts hold; SIGTERM is
# logged and ends it, unless IGNORE_TERM is set (then the grace period's SIGKILL does).
SERVER = f"""
import http.server, json, os, pathlib, signal, sys
def on_term(number, frame):
    print("got signal", number, flush=True)
    if not os.environ.get("IGNORE_TERM"):
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        token = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
        pathlib.Path("/scratch/written").write_text("yes")
        try:
            pathlib.Path("/written").write_text("yes")
            root_writable = True
        except OSError:
            root_writable = False
        status = {{k: v for k, v in (line.split(":", 1) for line in open("/proc/self/status")) if k.startswith("Cap")}}
        body = json.dumps({{"env": dict(os.environ), "uid": os.getuid(), "token": token.is_file(),
                           "config": pathlib.Path("/config/greeting").read_text(), "root_writable": root_writable,
                           "no_new_privs": open("/proc/self/status").read().count("NoNewPrivs:\t1"),
                           "effective_caps": status["CapEff"].strip()}}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
print("serving on", os.environ["POD_IP"], flush=True)
http.server.HTTPServer((os.environ["POD_IP"], {PORT}), Handler).serve_forever()
"""


@pytest.fixture(scope="module")
def image() -> str:
    """The Debian base image in local storage (made with mmdebstrap, cached, on first use)."""
    tools.ensure_installed()
    return rootfs.ensure_base()


def require_oci(cluster: LoopbackCluster) -> None:
    """The session's kubelet found podman when it started (`make test` builds the images first)."""
    kubelet_log = cluster.state_dir / "logs" / "kubelet.log"
    assert oci.enabled_in(kubelet_log), "podman was not installed when the kubelet started: run `make images`"


def server_container(image: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "web",
        "image": image,
        "command": ["python3", "-c", SERVER],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}},
            *extra.pop("env", []),
        ],
        "readinessProbe": {"httpGet": {"path": "/env", "port": PORT}, "periodSeconds": 1},
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}, {"name": "config", "mountPath": "/config"}],
        **extra,
    }


def server_pod(name: str, image: str, **extra: Any) -> dict[str, Any]:
    volumes = [{"name": "scratch", "emptyDir": {}}, {"name": "config", "configMap": {"name": "settings"}}]
    return pod_manifest(name, server_container(image, **extra), volumes=volumes)


def containers_of(uid: str) -> list[str]:
    listed = tools.output(["podman", "ps", "--all", "--format=json", f"--filter=label=io.kubernetes.pod.uid={uid}"])
    return [c["Names"][0] for c in json.loads(listed or "[]")]


async def test_a_pod_from_a_local_image_runs_as_a_real_container(
    api: client.ApiClient, namespace: str, cluster: LoopbackCluster, image: str
) -> None:
    require_oci(cluster)
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map(namespace, {"metadata": {"name": "settings"}, "data": {"greeting": "hi"}})
    manifest = server_pod("real", image, resources={"limits": {"nvidia.com/gpu": "1"}})
    await core.create_namespaced_pod(namespace, manifest)
    pod = await wait_pod(core, namespace, "real", "to be Ready", is_running_and_ready, within=60)

    status = pod.status.container_statuses[0]
    assert status.container_id.startswith(oci.CONTAINER_ID_SCHEME), status.container_id
    assert containers_of(pod.metadata.uid) == [status.container_id.removeprefix(oci.CONTAINER_ID_SCHEME)]
    answer = await get_json(f"http://{pod.status.pod_ip}:{PORT}/env")
    env = answer["env"]
    assert env["POD_IP"] == pod.status.pod_ip != "127.0.0.1", "it binds its Pod's own loopback address"
    assert env["GREETING"] == "hi", "env from a ConfigMap"
    assert answer["config"] == "hi", "a ConfigMap volume"
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-"), "the GPU the kubelet assigned"
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["HOSTNAME"] == "real"
    assert env["PATH"] == rootfs.PATH, "the image's own PATH, not the kubelet's"
    assert answer["token"], "the service-account token is mounted"
    assert "serving on" in cluster.container_log(pod, "web"), "its output is the kubelet's container log"

    await core.delete_namespaced_pod("real", namespace)
    await wait_pod_gone(core, namespace, "real")
    assert containers_of(pod.metadata.uid) == [], "the container is removed with its Pod"
    assert "got signal 15" in cluster.container_log(pod, "web"), "it was stopped with SIGTERM"


async def test_restarts_probes_and_grace_as_the_process_runtime(
    api: client.ApiClient, namespace: str, cluster: LoopbackCluster, image: str
) -> None:
    """A failing exec liveness probe (run in the container) restarts it; a container ignoring SIGTERM is
    killed when the grace period ends, and its exit code says so."""
    require_oci(cluster)
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map(namespace, {"metadata": {"name": "settings"}, "data": {"greeting": "hi"}})
    liveness = {"exec": {"command": ["test", "-e", "/scratch/alive"]}, "periodSeconds": 1, "failureThreshold": 2}
    manifest = server_pod(
        "restarting",
        image,
        env=[{"name": "IGNORE_TERM", "value": "1"}],
        livenessProbe=liveness,
    )
    manifest["spec"]["terminationGracePeriodSeconds"] = 2

    def restarted(pod: client.V1Pod) -> bool:
        statuses = pod.status.container_statuses or []
        return bool(statuses) and statuses[0].restart_count >= 1

    await core.create_namespaced_pod(namespace, manifest)
    pod = await wait_pod(core, namespace, "restarting", "to be restarted by its liveness probe", restarted, within=60)
    last = pod.status.container_statuses[0].last_state.terminated
    assert last.exit_code == 128 + signal.SIGKILL, "SIGTERM was ignored, SIGKILL ended it after the grace period"
    assert (last.finished_at - last.started_at).total_seconds() >= 2
    logs_dir = KubeletConfig.load(cluster.kubelet_dir / "config.yaml").logs_dir
    meta = pod.metadata
    first_run = container_log(logs_dir, meta.namespace, meta.name, meta.uid, "web", restart=0).read_text()
    assert "got signal 15" in first_run
    events = await core.list_namespaced_event(namespace)
    assert any(e.reason == "Unhealthy" and "Liveness" in e.message for e in events.items)
    await core.delete_namespaced_pod("restarting", namespace, grace_period_seconds=0)


RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


async def test_the_pods_security_context_is_applied(
    api: client.ApiClient, namespace: str, cluster: LoopbackCluster, image: str
) -> None:
    """Pod Security "restricted", as the chart's Pods ask for it: the user, a read-only root (volumes stay
    writable), no capabilities, no privilege escalation; runAsNonRoot refuses an image that would run as root."""
    require_oci(cluster)
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map(namespace, {"metadata": {"name": "settings"}, "data": {"greeting": "hi"}})
    await core.create_namespaced_pod(namespace, server_pod("restricted", image, securityContext=RESTRICTED))
    pod = await wait_pod(core, namespace, "restricted", "to be Ready", is_running_and_ready, within=60)
    answer = await get_json(f"http://{pod.status.pod_ip}:{PORT}/env")
    assert answer["uid"] == 65532
    assert answer["root_writable"] is False, "readOnlyRootFilesystem"
    assert answer["no_new_privs"] == 1, "allowPrivilegeEscalation: false"
    assert int(answer["effective_caps"], 16) == 0, "capabilities drop ALL"

    as_root = server_pod("as-root", image, securityContext={"runAsNonRoot": True})
    await core.create_namespaced_pod(namespace, as_root)

    def refused(pod: client.V1Pod) -> bool:
        waiting = pod.status.container_statuses and pod.status.container_statuses[0].state.waiting
        return bool(waiting) and waiting.reason == "CreateContainerConfigError" and "root" in waiting.message

    await wait_pod(core, namespace, "as-root", "to be refused: its image runs as root", refused, within=60)
    for name in ("restricted", "as-root"):
        await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def test_containers_never_outlive_their_kubelet(tmp_path: Any, image: str) -> None:
    """A kubelet killed with SIGKILL leaves no container: its watchdog removes them."""
    owner = f"test-{os.getpid()}"
    name = f"dualpods-{owner}-orphan"
    code = (
        "import subprocess, sys, time; from e2e.kubelet import oci; oci.start_watchdog(sys.argv[1]);"
        "subprocess.run(['podman', 'run', '-d', '--name', sys.argv[2], f'--label={oci.OWNER_LABEL}={sys.argv[1]}',"
        "*oci.MACHINE_FLAGS, sys.argv[3], 'sleep', '600'], check=True, stdout=subprocess.DEVNULL);"
        "print('started', flush=True); time.sleep(600)"
    )
    kubelet = subprocess.Popen([sys.executable, "-c", code, owner, name, image], stdout=subprocess.PIPE, text=True)
    try:
        assert kubelet.stdout is not None
        assert kubelet.stdout.readline().strip() == "started"
        assert tools.output(["podman", "ps", "--format={{.Names}}", f"--filter=name={name}"]).strip() == name
        kubelet.send_signal(signal.SIGKILL)
        kubelet.wait()
        deadline = time.monotonic() + 20
        while tools.output(["podman", "ps", "--all", "--format={{.Names}}", f"--filter=name={name}"]).strip():
            assert time.monotonic() < deadline, "the container outlived its kubelet"
            time.sleep(0.2)
    finally:
        kubelet.kill()
        oci.remove_owned(owner)
