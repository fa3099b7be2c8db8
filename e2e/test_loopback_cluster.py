"""The loopback cluster end to end: real API server, scheduler and controller-manager, our kubelet."""

import asyncio
import ipaddress
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api.keys import GPU_MAP_CONFIGMAP
from e2e.cluster.cluster import LoopbackCluster, node_is_ready
from e2e.kubelet.objects import ObjectWatches
from e2e.waiting import wait_for, wait_service_account

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
HTTP_PORT = 8080
# Mount points missing on the host are created there (empty) by the kubelet; tests keep theirs in one place.
MOUNTS = "/run/dualpods-e2e"
POD_IP_ENV = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def assert_loopback(address: str) -> None:
    assert ipaddress.ip_address(address) in LOOPBACK, f"{address} is not a loopback address"


def http_container(name: str = "web", *, args: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    """The test HTTP server on the Pod's own address, Ready when /healthz answers."""
    return {
        "name": name,
        "image": "dualpods/test-http:v1",
        "args": ["--host", "$(POD_IP)", "--port", str(HTTP_PORT), *args],
        "env": [POD_IP_ENV, *extra.pop("env", [])],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": HTTP_PORT}, "periodSeconds": 1},
        **extra,
    }


def python_container(code: str, name: str = "main", **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "python:3.11-slim", "command": ["python3", "-c", code], **extra}


def pod_manifest(name: str, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    metadata = spec.pop("metadata", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **metadata},
        "spec": {"containers": list(containers), "terminationGracePeriodSeconds": 5, **spec},
    }


def deployment_manifest(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [http_container()], "terminationGracePeriodSeconds": 2},
            },
        },
    }


def container_pid(pod: client.V1Pod) -> int:
    """The host PID behind a running container (its containerID is loopback://<pid>)."""
    return int(pod.status.container_statuses[0].container_id.removeprefix("loopback://"))


async def get_json(url: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        response.raise_for_status()
        return json.loads(await response.text())


async def pod_env(pod: client.V1Pod) -> dict[str, str]:
    env: dict[str, str] = await get_json(f"http://{pod.status.pod_ip}:{HTTP_PORT}/env")
    return env


def is_running_and_ready(pod: client.V1Pod) -> bool:
    conditions = {c.type: c.status for c in pod.status.conditions or []}
    return pod.status.phase == "Running" and conditions.get("Ready") == "True"


async def wait_pod(core: client.CoreV1Api, namespace: str, name: str, what: str, check: Any, within: float = 30) -> Any:
    async def probe() -> Any:
        pod = await core.read_namespaced_pod(name, namespace)
        return pod if check(pod) else None

    return await wait_for(probe, what=f"pod {name} {what}", within=within)


async def test_nodes_are_ready_loopback_gpu_nodes(api: client.ApiClient, cluster: LoopbackCluster) -> None:
    core = client.CoreV1Api(api)
    nodes = {n.metadata.name: n for n in (await core.list_node()).items}
    assert sorted(nodes) == ["gpu-node-1", "gpu-node-2"]
    addresses = set()
    for name, node in nodes.items():
        assert node_is_ready(node), f"{name} is not Ready and untainted: {node.status.conditions} {node.spec.taints}"
        assert node.status.allocatable["nvidia.com/gpu"] == "2"
        assert node.status.capacity["nvidia.com/gpu"] == "2"
        assert node.metadata.labels["kubernetes.io/hostname"] == name
        assert node.metadata.labels["nvidia.com/gpu.present"] == "true"
        for address in node.status.addresses:
            if address.type == "InternalIP":
                assert_loopback(address.address)
                addresses.add(address.address)
    assert len(addresses) == 2, "each Node has its own loopback address"

    leases = client.CoordinationV1Api(api)
    for name in nodes:
        lease = await leases.read_namespaced_lease(name, "kube-node-lease")
        age = time.time() - lease.spec.renew_time.timestamp()
        assert lease.spec.holder_identity == name
        # A correctness bound: renewed every few seconds, a lease older than 30 s is near its 40 s expiry, when the
        # Node would turn NotReady.
        assert age < 30, f"lease of {name} renewed {age:.0f} s ago"

    published = await core.read_namespaced_config_map(GPU_MAP_CONFIGMAP, "default")
    gpu_map = {node: json.loads(value) for node, value in published.data.items()}
    assert sorted(gpu_map) == sorted(nodes)
    all_uuids = [u for mapping in gpu_map.values() for u in mapping]
    assert len(set(all_uuids)) == 4
    assert all(u.startswith("GPU-") and len(u) == 40 for u in all_uuids)
    assert all(sorted(mapping.values()) == [0, 1] for mapping in gpu_map.values())
    assert {n.name: n.gpus for n in await cluster.kubelet.nodes()} == gpu_map


async def test_gpu_map_is_published_on_request(api: client.ApiClient, namespace: str, cluster: LoopbackCluster) -> None:
    core = client.CoreV1Api(api)
    with pytest.raises(ApiException) as missing:
        await core.read_namespaced_config_map(GPU_MAP_CONFIGMAP, namespace)
    assert missing.value.status == 404
    await cluster.kubelet.publish_gpu_map(namespace)
    published = await core.read_namespaced_config_map(GPU_MAP_CONFIGMAP, namespace)
    assert sorted(published.data) == ["gpu-node-1", "gpu-node-2"]


async def test_deployment_of_http_servers_becomes_available(api: client.ApiClient, namespace: str) -> None:
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    manifest = deployment_manifest("web", replicas=2)
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["env"] += [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "GREETING", "value": "hello $(POD_NAME) $$(POD_NAME) $(UNDEFINED)"},
    ]
    await apps.create_namespaced_deployment(namespace, manifest)

    async def available() -> bool:
        deployment = await apps.read_namespaced_deployment("web", namespace)
        conditions = {c.type: c.status for c in deployment.status.conditions or []}
        return conditions.get("Available") == "True" and deployment.status.available_replicas == 2

    await wait_for(available, what="the Deployment to become Available with 2 replicas", within=60)
    pods = (await core.list_namespaced_pod(namespace, label_selector="app=web")).items
    assert len(pods) == 2
    assert all(is_running_and_ready(p) for p in pods)
    assert len({p.status.pod_ip for p in pods}) == 2, "every Pod has its own address"
    for pod in pods:
        assert_loopback(pod.status.pod_ip)
        assert_loopback(pod.status.host_ip)
        assert [a.ip for a in pod.status.pod_ips] == [pod.status.pod_ip]
        status = pod.status.container_statuses[0]
        assert status.ready
        assert status.started
        assert status.state.running.started_at is not None
        env = await pod_env(pod)
        assert env["POD_NAME"] == pod.metadata.name
        assert env["POD_NAMESPACE"] == namespace
        assert env["POD_UID"] == pod.metadata.uid
        assert env["NODE_NAME"] == pod.spec.node_name
        assert env["POD_IP"] == pod.status.pod_ip
        assert env["GREETING"] == f"hello {pod.metadata.name} $(POD_NAME) $(UNDEFINED)"
        assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
        assert "NVIDIA_VISIBLE_DEVICES" not in env, "no GPU was requested"
        hostname_url = f"http://{pod.status.pod_ip}:{HTTP_PORT}/hostname"
        async with aiohttp.ClientSession() as session, session.get(hostname_url) as response:
            assert await response.text() == pod.metadata.name


async def test_gpus_are_never_shared(api: client.ApiClient, namespace: str, cluster: LoopbackCluster) -> None:
    core = client.CoreV1Api(api)
    gpu_map = {n.name: n.gpus for n in await cluster.kubelet.nodes()}

    def gpu_pod(name: str, node: str, gpus: int) -> dict[str, Any]:
        container = http_container(resources={"limits": {"nvidia.com/gpu": str(gpus)}})
        return pod_manifest(name, container, nodeSelector={"kubernetes.io/hostname": node})

    await core.create_namespaced_pod(namespace, gpu_pod("first", "gpu-node-1", 2))
    first = await wait_pod(core, namespace, "first", "to run", is_running_and_ready)
    assert sorted((await pod_env(first))["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(gpu_map["gpu-node-1"])

    await core.create_namespaced_pod(namespace, gpu_pod("second", "gpu-node-1", 2))

    def unschedulable(pod: client.V1Pod) -> bool:
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in pod.status.conditions or [])

    await wait_pod(core, namespace, "second", "to be Unschedulable", unschedulable)
    await asyncio.sleep(2)
    second = await core.read_namespaced_pod("second", namespace)
    assert second.status.phase == "Pending"
    assert not second.spec.node_name

    # Two single-GPU Pods on the other Node get one GPU each, never the same.
    for name in ("left", "right"):
        await core.create_namespaced_pod(namespace, gpu_pod(name, "gpu-node-2", 1))
    halves = [await wait_pod(core, namespace, n, "to run", is_running_and_ready) for n in ("left", "right")]
    devices = [(await pod_env(p))["NVIDIA_VISIBLE_DEVICES"] for p in halves]
    assert sorted(devices) == sorted(gpu_map["gpu-node-2"])

    await core.delete_namespaced_pod("first", namespace)
    second = await wait_pod(core, namespace, "second", "to run once the GPUs are free", is_running_and_ready)
    assert sorted((await pod_env(second))["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(gpu_map["gpu-node-1"])


# PID 1 and a child of it (the same program, with an argument), each saying when SIGTERM reaches it.
SIGTERM_REPORTER = """
import signal, subprocess, sys, time
who = "child" if sys.argv[1:] == ["child"] else "pid 1"
def report(*_):
    print(f"{who} got SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, report)
if who == "pid 1":
    subprocess.Popen([sys.executable, "-c", PROGRAM, "child"])
else:
    print("child up", flush=True)
time.sleep(3600)
"""


async def test_sigterm_reaches_the_containers_pid_1_alone(
    api: client.ApiClient, namespace: str, cluster: LoopbackCluster
) -> None:
    """As a container runtime sends it: PID 1 hears of it and decides for what it started (here it exits, and the
    kernel kills the rest of its PID namespace), so a child never gets SIGTERM from the kubelet."""
    core = client.CoreV1Api(api)
    code = f"PROGRAM = {SIGTERM_REPORTER!r}\nexec(PROGRAM)"
    held = {"finalizers": ["dualpods.test/hold"]}  # its status stays readable once it stopped
    await core.create_namespaced_pod(namespace, pod_manifest("pid1", python_container(code), metadata=held))
    pod = await wait_pod(core, namespace, "pid1", "to run", is_running_and_ready)
    await wait_for(lambda: "child up" in cluster.container_log(pod, "main"), what="the child up", within=60)
    await core.delete_namespaced_pod("pid1", namespace)

    def terminated(pod: client.V1Pod) -> bool:
        return pod.status.container_statuses[0].state.terminated is not None

    pod = await wait_pod(core, namespace, "pid1", "to report its container terminated", terminated)
    log = cluster.container_log(pod, "main")
    await core.patch_namespaced_pod("pid1", namespace, {"metadata": {"finalizers": None}})
    assert "pid 1 got SIGTERM" in log, log
    assert "child got SIGTERM" not in log, log


@pytest.mark.parametrize(("ignore_sigterm", "exit_code"), [(False, 0), (True, 137)])
async def test_deleted_pod_stops_within_grace_and_waits_for_its_finalizer(
    api: client.ApiClient, namespace: str, cluster: LoopbackCluster, ignore_sigterm: bool, exit_code: int
) -> None:
    core = client.CoreV1Api(api)
    grace = 2
    args = ("--ignore-sigterm",) if ignore_sigterm else ()
    pre_stop = {"preStop": {"exec": {"command": ["sh", "-c", "echo pre-stop hook ran >> /proc/1/fd/1"]}}}
    manifest = pod_manifest(
        "held",
        http_container(args=args, lifecycle=pre_stop),
        terminationGracePeriodSeconds=grace,
        metadata={"finalizers": ["dualpods.test/hold"]},
    )
    await core.create_namespaced_pod(namespace, manifest)
    pod = await wait_pod(core, namespace, "held", "to run", is_running_and_ready)
    pid = container_pid(pod)
    assert psutil.pid_exists(pid)

    started = time.monotonic()
    await core.delete_namespaced_pod("held", namespace)

    def terminated(pod: client.V1Pod) -> bool:
        return pod.status.container_statuses[0].state.terminated is not None

    pod = await wait_pod(core, namespace, "held", "to report its container terminated", terminated)
    stopped_after = time.monotonic() - started
    assert pod.metadata.deletion_timestamp is not None
    assert pod.status.container_statuses[0].state.terminated.exit_code == exit_code
    assert not psutil.pid_exists(pid), "the container's process is gone"
    log = cluster.container_log(pod, "web")
    assert "pre-stop hook ran" in log
    assert "got signal 15" in log, "SIGTERM came first"
    assert log.index("pre-stop hook ran") < log.index("got signal 15"), "the preStop hook runs before SIGTERM"
    if ignore_sigterm:
        assert stopped_after >= grace, f"SIGKILL came {stopped_after:.1f} s after SIGTERM, before the grace period"

    await asyncio.sleep(2)
    held = await core.read_namespaced_pod("held", namespace)
    assert held.metadata.deletion_timestamp is not None, "the finalizer keeps the Pod Terminating"

    await core.patch_namespaced_pod("held", namespace, {"metadata": {"finalizers": None}})

    async def gone() -> bool:
        try:
            await core.read_namespaced_pod("held", namespace)
        except ApiException as error:
            return error.status == 404
        return False

    await wait_for(gone, what="the Pod to disappear once its finalizer is removed")


async def test_crashing_container_restarts_with_back_off(api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api)
    crash = python_container("import sys; print('crashing'); sys.exit(3)")
    await core.create_namespaced_pod(namespace, pod_manifest("crasher", crash))

    def restarted_twice(pod: client.V1Pod) -> bool:
        status = (pod.status.container_statuses or [None])[0]
        return status is not None and status.restart_count >= 2

    pod = await wait_pod(core, namespace, "crasher", "to restart twice", restarted_twice)
    status = pod.status.container_statuses[0]
    assert status.last_state.terminated.exit_code == 3
    assert status.last_state.terminated.reason == "Error"
    assert pod.status.phase == "Running"
    await wait_pod(
        core,
        namespace,
        "crasher",
        "to wait in CrashLoopBackOff",
        lambda p: (
            (p.status.container_statuses[0].state.waiting or client.V1ContainerStateWaiting()).reason
            == "CrashLoopBackOff"
        ),
    )


@pytest.mark.parametrize(
    ("policy", "code", "phase", "restarts"),
    [("Never", 3, "Failed", 0), ("OnFailure", 0, "Succeeded", 0), ("Never", 0, "Succeeded", 0)],
)
async def test_restart_policy_decides_the_end(
    api: client.ApiClient, namespace: str, policy: str, code: int, phase: str, restarts: int
) -> None:
    core = client.CoreV1Api(api)
    manifest = pod_manifest("once", python_container(f"raise SystemExit({code})"), restartPolicy=policy)
    await core.create_namespaced_pod(namespace, manifest)
    pod = await wait_pod(core, namespace, "once", f"to end {phase}", lambda p: p.status.phase == phase)
    status = pod.status.container_statuses[0]
    assert status.state.terminated.exit_code == code
    assert status.restart_count == restarts


async def test_probes_run_inside_the_container(api: client.ApiClient, namespace: str) -> None:
    """The exec liveness probe sees the container's own emptyDir mount; its failure restarts the container."""
    core = client.CoreV1Api(api)
    code = (
        f"import os, time; open('{MOUNTS}/scratch/healthy', 'w').close();"
        f"time.sleep(2); os.remove('{MOUNTS}/scratch/healthy'); time.sleep(60)"
    )
    liveness = {
        "exec": {"command": ["test", "-f", f"{MOUNTS}/scratch/healthy"]},
        "periodSeconds": 1,
        "failureThreshold": 2,
    }
    startup = {"exec": {"command": ["test", "-f", f"{MOUNTS}/scratch/healthy"]}, "periodSeconds": 1}
    container = python_container(
        code,
        livenessProbe=liveness,
        startupProbe=startup,
        volumeMounts=[{"name": "scratch", "mountPath": f"{MOUNTS}/scratch"}],
    )
    scratch = [{"name": "scratch", "emptyDir": {}}]
    # Python as PID 1 ignores SIGTERM, so the liveness kill waits out the whole (short) grace period.
    flaky = pod_manifest("flaky", container, volumes=scratch, terminationGracePeriodSeconds=1)
    await core.create_namespaced_pod(namespace, flaky)
    tcp = http_container(readinessProbe={"tcpSocket": {"port": HTTP_PORT}, "periodSeconds": 1})
    await core.create_namespaced_pod(namespace, pod_manifest("tcp", tcp))

    pod = await wait_pod(core, namespace, "flaky", "to be started", lambda p: p.status.container_statuses[0].started)
    assert not Path(f"{MOUNTS}/scratch/healthy").exists(), "the emptyDir is mounted only inside the container"
    pod = await wait_pod(
        core,
        namespace,
        "flaky",
        "to be restarted by its liveness probe",
        lambda p: p.status.container_statuses[0].restart_count >= 1,
    )
    assert pod.status.container_statuses[0].last_state.terminated.exit_code == 137
    await wait_pod(core, namespace, "tcp", "to be Ready through its tcpSocket probe", is_running_and_ready)


async def test_in_cluster_config_uses_the_pods_service_account(
    api: client.ApiClient, namespace: str, cluster: LoopbackCluster
) -> None:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    for account in ("reader", "nobody"):
        await core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    await rbac.create_namespaced_role(
        namespace,
        {"metadata": {"name": "pod-reader"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]},
    )
    await rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )

    env = [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
    for account in ("reader", "nobody"):
        await wait_service_account(core, namespace, account)
        container = {"name": "whoami", "image": "dualpods/test-whoami", "env": env}
        manifest = pod_manifest(f"as-{account}", container, serviceAccountName=account, restartPolicy="Never")
        await core.create_namespaced_pod(namespace, manifest)

    reports = {}
    for account in ("reader", "nobody"):
        pod = await wait_pod(core, namespace, f"as-{account}", "to finish", lambda p: p.status.phase == "Succeeded")
        reports[account] = json.loads(cluster.container_log(pod, "whoami").strip().splitlines()[-1])
    assert reports["reader"]["status"] == 200
    assert reports["reader"]["pods"] == ["as-nobody", "as-reader"]
    assert reports["nobody"]["status"] == 403
    for report in reports.values():
        assert report["host"].startswith("https://127.0.0.1:")
    assert not Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists(), "the token is mounted privately"


async def test_volumes_and_configuration_errors(
    api: client.ApiClient, namespace: str, cluster: LoopbackCluster
) -> None:
    """ConfigMap, Secret, downwardAPI and emptyDir volumes appear at their mount paths; what cannot work
    (a missing key, an unsupported volume type) is reported on the Pod while the kubelet carries on."""
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map(namespace, {"metadata": {"name": "settings"}, "data": {"mode": "fast"}})
    await core.create_namespaced_secret(
        namespace, {"metadata": {"name": "creds"}, "stringData": {"password": "s3cr3t"}}
    )
    code = (
        "import json, pathlib; r = lambda p: pathlib.Path(p).read_text();"
        f"print(json.dumps({{'mode': r('{MOUNTS}/app/renamed'), 'password': r('{MOUNTS}/creds/password'),"
        f" 'label': r('{MOUNTS}/info/team'), 'writable': pathlib.Path('{MOUNTS}/work').is_dir()}}))"
    )
    mounts = [
        {"name": "settings", "mountPath": f"{MOUNTS}/app", "readOnly": True},
        {"name": "creds", "mountPath": f"{MOUNTS}/creds"},
        {"name": "info", "mountPath": f"{MOUNTS}/info"},
        {"name": "scratch", "mountPath": f"{MOUNTS}/work"},
    ]
    volumes = [
        {"name": "settings", "configMap": {"name": "settings", "items": [{"key": "mode", "path": "renamed"}]}},
        {"name": "creds", "secret": {"secretName": "creds"}},
        {
            "name": "info",
            "downwardAPI": {"items": [{"path": "team", "fieldRef": {"fieldPath": "metadata.labels['team']"}}]},
        },
        {"name": "scratch", "emptyDir": {}},
    ]
    manifest = pod_manifest(
        "reader",
        python_container(code, volumeMounts=mounts),
        volumes=volumes,
        restartPolicy="Never",
        metadata={"labels": {"team": "blue"}},
    )
    await core.create_namespaced_pod(namespace, manifest)

    unsupported = pod_manifest(
        "claims",
        python_container("print('never runs')", volumeMounts=[{"name": "data", "mountPath": f"{MOUNTS}/data"}]),
        volumes=[{"name": "data", "nfs": {"server": "127.0.0.1", "path": "/exports"}}],
    )
    await core.create_namespaced_pod(namespace, unsupported)
    missing_key = python_container(
        "import os; print(os.environ['LEVEL'])",
        env=[{"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}}}],
    )
    await core.create_namespaced_pod(namespace, pod_manifest("late-key", missing_key, restartPolicy="Never"))

    pod = await wait_pod(core, namespace, "reader", "to succeed", lambda p: p.status.phase == "Succeeded")
    report = json.loads(cluster.container_log(pod, "main"))
    assert report == {"mode": "fast", "password": "s3cr3t", "label": "blue", "writable": True}

    async def failed_mount() -> bool:
        events = await core.list_namespaced_event(namespace, field_selector="involvedObject.name=claims")
        return any(e.reason == "FailedMount" and "type nfs is not supported" in e.message for e in events.items)

    await wait_for(failed_mount, what="a FailedMount event naming the unsupported volume type")
    assert (await core.read_namespaced_pod("claims", namespace)).status.phase == "Pending"

    def config_error(pod: client.V1Pod) -> bool:
        waiting = pod.status.container_statuses and pod.status.container_statuses[0].state.waiting
        return bool(waiting) and waiting.reason == "CreateContainerConfigError" and "level" in waiting.message

    await wait_pod(core, namespace, "late-key", "to wait for its missing key", config_error)
    await core.patch_namespaced_config_map("settings", namespace, {"data": {"level": "7"}})
    pod = await wait_pod(
        core, namespace, "late-key", "to run once the key exists", lambda p: p.status.phase == "Succeeded", within=40
    )
    assert cluster.container_log(pod, "main").strip() == "7"


async def test_the_config_maps_and_secrets_of_a_nodes_pods_are_watched_while_a_pod_uses_them(
    api: client.ApiClient, namespace: str
) -> None:
    """The kubelet's cache of ConfigMaps and Secrets: a first read waits for its watch's list, a change and an
    object created after the first read reach later reads, and a watch stops when the last Pod using it ends."""
    core = client.CoreV1Api(api)
    objects = ObjectWatches(core)
    first, second = objects.fetch_for("uid-first"), objects.fetch_for("uid-second")
    await core.create_namespaced_config_map(namespace, {"metadata": {"name": "settings"}, "data": {"mode": "fast"}})
    try:
        assert await first("configmap", namespace, "settings") == {"mode": "fast"}
        assert await second("secret", namespace, "creds") is None
        assert await second("configmap", namespace, "settings") == {"mode": "fast"}

        await core.patch_namespaced_config_map("settings", namespace, {"data": {"mode": "slow"}})
        await core.create_namespaced_secret(
            namespace, {"metadata": {"name": "creds"}, "stringData": {"password": "s3cr3t"}}
        )

        async def changed() -> bool:
            return await first("configmap", namespace, "settings") == {"mode": "slow"}

        async def created() -> bool:
            return await second("secret", namespace, "creds") == {"password": "s3cr3t"}

        await wait_for(changed, what="the ConfigMap's change in the cache", within=10)
        await wait_for(created, what="the Secret created after the first read, in the cache", within=10)

        await objects.release("uid-first")
        assert objects.watched == {("configmap", namespace, "settings"), ("secret", namespace, "creds")}
        await objects.release("uid-second")
        assert objects.watched == set()
    finally:
        await objects.close()


async def test_lost_node_pods_are_recreated_elsewhere(
    api: client.ApiClient, namespace: str, cluster: LoopbackCluster
) -> None:
    """The lost Node's processes die at once; pod GC deletes its Pods once the Node object is gone
    and the ReplicaSet replaces them on the remaining Node."""
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    await apps.create_namespaced_deployment(namespace, deployment_manifest("survivor", replicas=2))

    async def ready_pods() -> list[client.V1Pod]:
        pods = (await core.list_namespaced_pod(namespace, label_selector="app=survivor")).items
        ready = [p for p in pods if is_running_and_ready(p) and p.metadata.deletion_timestamp is None]
        return ready if len(ready) == 2 and len(pods) == 2 else []

    before = await wait_for(ready_pods, what="2 ready replicas", within=60)
    victim = before[0].spec.node_name
    victims = {p.metadata.name: container_pid(p) for p in before if p.spec.node_name == victim}
    try:
        await cluster.kubelet.lose_node(victim)
        assert all(not psutil.pid_exists(pid) for pid in victims.values()), "the lost Node's processes died"
        with pytest.raises(ApiException) as gone:
            await core.read_node(victim)
        assert gone.value.status == 404

        async def replaced() -> list[client.V1Pod]:
            pods = await ready_pods()
            names = {p.metadata.name for p in pods}
            return pods if pods and not names & victims.keys() and all(p.spec.node_name != victim for p in pods) else []

        after = await wait_for(replaced, what="replacements on the remaining Node", within=150)
        assert all(p.spec.node_name != victim for p in after)
        for pod in after:
            assert_loopback(pod.status.pod_ip)
    finally:
        await cluster.kubelet.add_node(victim, gpus=2)

        async def back() -> bool:
            return node_is_ready(await core.read_node(victim))

        await wait_for(back, what=f"{victim} to be back and Ready")


async def test_a_read_only_root_leaves_only_volumes_writable(
    api: client.ApiClient, namespace: str, cluster: LoopbackCluster
) -> None:
    """`readOnlyRootFilesystem: true` with /tmp an emptyDir, as the chart's controllers run: writing anywhere but
    a volume fails (the process runtime remounts the container's file systems read-only), /dev/null still takes
    output, and a Secret volume whose files the kubelet keeps under /tmp is still there behind the /tmp volume."""
    core = client.CoreV1Api(api)
    await core.create_namespaced_secret(namespace, {"metadata": {"name": "creds"}, "stringData": {"token": "t0k"}})
    code = (
        "import json, os, pathlib, tempfile\n"
        "def writable(directory):\n"
        "    try:\n"
        "        with tempfile.TemporaryFile(dir=directory): return True\n"
        "    except OSError: return False\n"
        "open(os.devnull, 'w').write('x')\n"
        "places = ('/tmp', os.path.expanduser('~'), os.getcwd())\n"
        f"secret = pathlib.Path('{MOUNTS}/creds/token').read_text()\n"
        "print(json.dumps({'writable': {d: writable(d) for d in places}, 'secret': secret}))"
    )
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "creds", "mountPath": f"{MOUNTS}/creds", "readOnly": True}]
    container = python_container(code, volumeMounts=mounts, securityContext={"readOnlyRootFilesystem": True})
    volumes = [{"name": "tmp", "emptyDir": {}}, {"name": "creds", "secret": {"secretName": "creds"}}]
    manifest = pod_manifest("read-only", container, volumes=volumes, restartPolicy="Never")
    await core.create_namespaced_pod(namespace, manifest)
    pod = await wait_pod(core, namespace, "read-only", "to succeed", lambda p: p.status.phase == "Succeeded")
    report = json.loads(cluster.container_log(pod, "main"))
    assert report["secret"] == "t0k"
    writable = report["writable"]
    assert writable.pop("/tmp") is True
    assert set(writable.values()) == {False}, writable
