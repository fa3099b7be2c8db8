"""The loopback kubelet's pure parts, without a cluster: expansion, env, image map, GPUs, addresses, Pod
decoding."""

import asyncio
import contextlib
import ipaddress
import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes_asyncio import client

from e2e.kubelet import oci
from e2e.kubelet.addresses import AddressBlock, require_loopback
from e2e.kubelet.container import ContainerProcess
from e2e.kubelet.env import ContainerConfigError, PodFields, expand, resolve_env
from e2e.kubelet.gpus import GpuAllocator, InsufficientGpusError, gpu_uuid
from e2e.kubelet.images import DEFAULT_IMAGE_MAP, REPO_ROOT, ImageEntry, ImageMap, ImageMapError, command_line
from e2e.kubelet.objects import ObjectWatches
from e2e.kubelet.pod_worker import PodWorker
from e2e.kubelet.status import ContainerStatus, Terminated, now
from e2e.kubelet.supervisor import CrashLoopBackoff
from e2e.kubelet.sync import PodDecoder
from e2e.kubelet.volumes import Mount
from e2e.waiting import cancel_while_waiting, wait_for


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)-$(B)", "1-2"),
        ("$$(A)", "$(A)"),
        ("$(MISSING)", "$(MISSING)"),
        ("$(A", "$(A"),
        ("cost: $5", "cost: $5"),
        ("trailing $", "trailing $"),
        ("$$$(A)", "$1"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert expand(text, {"A": "1", "B": "2"}) == expected


def _pod() -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="p", namespace="ns", uid="u-1", labels={"team": "blue"}),
        spec=client.V1PodSpec(containers=[], node_name="gpu-node-1"),
    )


async def test_env_resolution_order_and_references() -> None:
    data = {("configmap", "ns", "cm"): {"level": "7", "bad key": "x"}, ("secret", "ns", "s"): {"pw": "hunter2"}}

    async def fetch(kind: str, namespace: str, name: str) -> dict[str, str] | None:
        return data.get((kind, namespace, name))

    container = client.V1Container(
        name="c",
        env_from=[client.V1EnvFromSource(prefix="CM_", config_map_ref=client.V1ConfigMapEnvSource(name="cm"))],
        env=[
            client.V1EnvVar(
                name="IP",
                value_from=client.V1EnvVarSource(field_ref=client.V1ObjectFieldSelector(field_path="status.podIP")),
            ),
            client.V1EnvVar(name="URL", value="http://$(IP):$(CM_level)"),
            client.V1EnvVar(
                name="TEAM",
                value_from=client.V1EnvVarSource(
                    field_ref=client.V1ObjectFieldSelector(field_path="metadata.labels['team']")
                ),
            ),
            client.V1EnvVar(
                name="PW",
                value_from=client.V1EnvVarSource(secret_key_ref=client.V1SecretKeySelector(name="s", key="pw")),
            ),
            client.V1EnvVar(
                name="OPT",
                value_from=client.V1EnvVarSource(
                    config_map_key_ref=client.V1ConfigMapKeySelector(name="nope", key="k", optional=True)
                ),
            ),
        ],
    )
    env = await resolve_env(container, PodFields(_pod(), "127.40.0.2", "127.40.0.1"), {"SVC": "1"}, fetch)
    assert env == {
        "SVC": "1",
        "CM_level": "7",
        "IP": "127.40.0.2",
        "URL": "http://127.40.0.2:7",
        "TEAM": "blue",
        "PW": "hunter2",
    }

    missing = client.V1Container(
        name="c",
        env=[
            client.V1EnvVar(
                name="X",
                value_from=client.V1EnvVarSource(config_map_key_ref=client.V1ConfigMapKeySelector(name="cm", key="k")),
            )
        ],
    )
    with pytest.raises(ContainerConfigError, match="key 'k' not found in configmap ns/cm"):
        await resolve_env(missing, PodFields(_pod(), "127.40.0.2", "127.40.0.1"), {}, fetch)


@pytest.mark.parametrize(
    ("value", "resolved"),
    [
        ("http://127.0.0.1:8001", "http://127.40.0.2:8001"),  # FMA's notifier calls its launcher so
        ("http://localhost/health", "http://127.40.0.2/health"),
        ("127.0.0.1", "127.0.0.1"),  # not a URL: left as written
        ("http://127.0.0.10:80", "http://127.0.0.10:80"),  # another address
        ("https://localhost.example.com", "https://localhost.example.com"),
    ],
)
async def test_a_url_to_the_pods_own_loopback_reaches_the_pod(value: str, resolved: str) -> None:
    """Each Pod here has an address of its own on the host's network: its loopback is that address."""

    async def fetch(kind: str, namespace: str, name: str) -> dict[str, str] | None:
        return None

    container = client.V1Container(name="c", env=[client.V1EnvVar(name="URL", value=value)])
    env = await resolve_env(container, PodFields(_pod(), "127.40.0.2", "127.40.0.1"), {}, fetch)
    assert env["URL"] == resolved


def test_image_map_follows_docker_command_rules(tmp_path: Path) -> None:
    images = ImageMap([DEFAULT_IMAGE_MAP])
    http = images.lookup("docker.io/dualpods/test-http:v9@sha256:abc")
    assert http is not None
    assert http.entrypoint[1:] == ["-m", "e2e.testapps.http_server"]
    assert images.lookup("docker.io/library/python:3.11") == images.lookup("python")
    assert images.lookup("registry.example/unknown:1") is None, "unknown images run as pause containers"
    launcher = images.lookup("dualpods/launcher:v1")  # an image's own files and working directory
    assert launcher is not None
    assert (launcher.working_dir, launcher.files) == ("/app", {"/app": str(REPO_ROOT / "images" / "fma-app")})

    entry = ImageEntry(entrypoint=["ep"], cmd=["c1", "c2"])
    assert command_line(entry, None, None) == ["ep", "c1", "c2"]
    assert command_line(entry, None, ["a"]) == ["ep", "a"]
    assert command_line(entry, ["cmd"], None) == ["cmd"]
    assert command_line(entry, ["cmd"], ["a"]) == ["cmd", "a"]

    bad = tmp_path / "bad.yaml"
    bad.write_text("images:\n  x:\n    entrypoint: ['{pyhton}']\n")
    with pytest.raises(ImageMapError, match="pyhton"):
        ImageMap([bad])


def test_gpus_are_deterministic_and_exclusive() -> None:
    assert gpu_uuid("n", 0) == gpu_uuid("n", 0) != gpu_uuid("n", 1) != gpu_uuid("m", 0)
    gpus = GpuAllocator("n", 2)
    first = gpus.allocate("pod-a", 1)
    second = gpus.allocate("pod-b", 1)
    assert set(first).isdisjoint(second)
    with pytest.raises(InsufficientGpusError, match="Requested: 1, Available: 0"):
        gpus.allocate("pod-c", 1)
    gpus.release("pod-a")
    assert gpus.allocate("pod-c", 1) == first


def test_address_blocks_are_loopback_and_distinct(tmp_path: Path) -> None:
    one, two = AddressBlock.claim(tmp_path), AddressBlock.claim(tmp_path)
    try:
        assert one.network != two.network
        addresses = {one.allocate() for _ in range(5)} | {two.allocate() for _ in range(5)}
        assert len(addresses) == 10
        assert all(a in ipaddress.ip_network("127.0.0.0/8") for a in addresses)
        assert one.host_ip not in addresses
    finally:
        one.release_block()
        two.release_block()
    with pytest.raises(ValueError, match=r"outside 127\.0\.0\.0/8"):
        require_loopback("10.96.0.1")


def test_backoff_restarts_at_once_then_doubles_to_a_cap() -> None:
    backoff = CrashLoopBackoff(0.5, 2.0)
    assert [backoff.next() for _ in range(5)] == [0.0, 0.5, 1.0, 2.0, 2.0]
    backoff.reset()
    assert backoff.next() == 0.0


async def test_a_volume_over_a_parent_of_another_volumes_source_hides_nothing(tmp_path: Path) -> None:
    """An emptyDir at a parent of a later volume's source must not change what that later volume shows, also when
    the volume goes back where its source was (the process runtime binds a checkout under /tmp back over the
    chart's /tmp emptyDir)."""
    parent, empty = tmp_path / "parent", tmp_path / "empty"
    (parent / "source").mkdir(parents=True)
    (parent / "source" / "marker").write_text("the source's own file")
    empty.mkdir()
    source = parent / "source"
    mounts = [Mount(empty, str(parent), read_only=False), Mount(source, str(source), read_only=True)]
    log = tmp_path / "log"
    process = await ContainerProcess.start(
        ["cat", str(source / "marker")], env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, hostname="units",
        mounts=mounts, log=log, read_only_root=True,
    )  # fmt: skip
    assert await process.wait() == 0, log.read_text()
    assert log.read_text().strip() == "the source's own file"


async def test_pod_events_decode_as_the_library_does_and_a_changed_spec_is_seen() -> None:
    """Each event is a fresh parse of its line, as from the watch."""
    api = client.ApiClient(client.Configuration())
    try:
        decoder = PodDecoder()
        pod: dict[str, Any] = {
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "python", "args": ["a"]}]},
            "status": {"phase": "Pending"},
        }
        library = api.deserialize(SimpleNamespace(data=json.dumps(pod)), "V1Pod")
        assert decoder.decode(json.loads(json.dumps(pod))) == library
        pod["status"] = {"phase": "Running"}
        pod["metadata"]["resourceVersion"] = "8"
        again = decoder.decode(json.loads(json.dumps(pod)))
        assert again.status.phase == "Running"
        assert again.metadata.resource_version == "8"
        assert again.spec == library.spec
        pod["spec"]["containers"][0]["image"] = "python:3.12"
        assert decoder.decode(json.loads(json.dumps(pod))).spec.containers[0].image == "python:3.12"
    finally:
        await api.close()


FULL_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7", "labels": {"app": "a"},
        "creationTimestamp": "2026-12-01T10:00:00Z", "deletionTimestamp": "2026-12-01T10:05:00Z",
        "deletionGracePeriodSeconds": 30,
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n", "controller": True}],
        "managedFields": [{"manager": "kubectl", "operation": "Update", "time": "2026-12-01T10:00:00Z"}],
    },
    "spec": {
        "nodeName": "n1", "restartPolicy": "Always", "terminationGracePeriodSeconds": 5,
        "containers": [{
            "name": "c", "image": "python", "command": ["python"], "args": ["-m", "http.server"],
            "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
            "env": [{"name": "A", "value": "1"},
                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m"}},
            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
            "livenessProbe": {"tcpSocket": {"port": 8000}, "failureThreshold": 3},
            "volumeMounts": [{"name": "v", "mountPath": "/v", "readOnly": True}],
        }],
        "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "1Gi"}},
                    {"name": "s", "secret": {"secretName": "s", "defaultMode": 420}}],
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
    },
    "status": {
        "phase": "Running", "podIP": "127.0.1.2", "startTime": "2026-12-01T10:00:01Z",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T10:00:02Z"}],
        "containerStatuses": [{
            "name": "c", "ready": True, "restartCount": 0, "image": "python", "imageID": "",
            "state": {"running": {"startedAt": "2026-12-01T10:00:01.123456Z"}},
        }],
    },
}  # fmt: skip


async def test_a_full_pod_decodes_as_the_library_decodes_it() -> None:
    """Timestamps, int-or-string ports, quantities, nested lists and maps: the models' public schema gives what
    the client's own deserializer gives."""
    async with client.ApiClient(client.Configuration()) as api:
        library = api.deserialize(SimpleNamespace(data=json.dumps(FULL_POD)), "V1Pod")
    decoded = PodDecoder().decode(json.loads(json.dumps(FULL_POD)))
    assert decoded == library
    assert decoded.metadata.deletion_timestamp == library.metadata.deletion_timestamp
    assert decoded.status.container_statuses[0].state.running.started_at.microsecond == 123456
    assert decoded.spec.containers[0].readiness_probe.http_get.port == "http"


async def test_a_stop_cancelled_during_the_grace_period_ends_cancelled_and_the_container_can_still_be_killed(
    tmp_path: Path,
) -> None:
    """A Pod worker cancelled while a container ignores SIGTERM gets its cancellation; the worker's cleanup
    then kills the container, which is gone within a moment (137: SIGKILL)."""
    log = tmp_path / "log"
    process = await ContainerProcess.start(
        ["sh", "-c", "trap '' TERM; echo up; exec sleep 30"], env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path,
        hostname="units", mounts=[], log=log,
    )  # fmt: skip
    try:
        await wait_for(lambda: "up" in log.read_text(), what="the container up", within=5, interval=0.01)
        await cancel_while_waiting(asyncio.create_task(process.stop(30)))
    finally:
        process.kill()
    async with asyncio.timeout(5):
        assert await process.wait() == 137


@pytest.fixture
def fake_podman(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `podman` first on PATH that records its pid and arguments, then hangs for `run` only."""
    calls = tmp_path / "podman-calls"
    podman = tmp_path / "bin" / "podman"
    podman.parent.mkdir()
    podman.write_text(f'#!/bin/sh\necho "$$ $*" >> {calls}\n[ "$1" = hang ] && exec sleep 30\nexit 0\n')
    podman.chmod(0o755)
    monkeypatch.setenv("PATH", f"{podman.parent}:{os.environ['PATH']}")
    return calls


async def test_a_podman_call_cancelled_while_it_runs_ends_cancelled(fake_podman: Path) -> None:
    calling = asyncio.create_task(oci._podman("hang"))
    try:
        await wait_for(fake_podman.is_file, what="podman called", within=5, interval=0.01)
        await cancel_while_waiting(calling, settle=0.05)
    finally:
        for line in fake_podman.read_text().splitlines():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split()[0]), signal.SIGKILL)


async def test_an_oci_stop_cancelled_during_the_grace_period_ends_cancelled_before_any_removal(
    fake_podman: Path, tmp_path: Path
) -> None:
    """SIGTERM went to the container; the cancelled stop leaves the removal (SIGKILL) to its caller's cleanup."""
    process = await asyncio.create_subprocess_exec("sleep", "30")
    spec = oci.OciSpec(
        name="units-1", image="img", command=None, args=None, env={}, hostname="units", mounts=[], working_dir=None
    )
    try:
        await cancel_while_waiting(asyncio.create_task(oci.OciContainer(spec, process).stop(30)), settle=0.2)
        assert [line.split()[1:] for line in fake_podman.read_text().splitlines()] == [
            ["kill", "--signal=TERM", "units-1"]
        ]
    finally:
        process.kill()
        await process.wait()


class StatusApi:
    """The API server's `pods/status` endpoint as the kubelet's pod worker calls it: each write is counted and
    answered with the Pod at the next resourceVersion."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.writes: list[dict[str, Any]] = []
        self.calls = 0
        self.answer_first = asyncio.Event()  # the first write is answered when this is set
        self.answer_first.set()

    async def patch_namespaced_pod_status(
        self, name: str, namespace: str, body: dict[str, Any], _preload_content: bool
    ) -> "StatusAnswer":
        self.calls += 1
        if self.calls == 1:
            await self.answer_first.wait()
        self.version += 1
        self.writes.append(body)
        return StatusAnswer({"metadata": {"name": name, "namespace": namespace, "resourceVersion": str(self.version)}})


class StatusAnswer:
    status = 200

    def __init__(self, pod: dict[str, Any]) -> None:
        self._body = json.dumps(pod).encode()

    async def __aenter__(self) -> "StatusAnswer":
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def read(self) -> bytes:
        return self._body


def _versioned(version: int, ready: str | None) -> client.V1Pod:
    pod = _pod()
    pod.metadata.resource_version = str(version)
    pod.status = client.V1PodStatus(conditions=[client.V1PodCondition(type="Ready", status=ready)] if ready else [])
    return pod


def _status_runtime(pods_dir: Path, core: Any) -> SimpleNamespace:
    """What a PodWorker reads of its Node to write its Pod's status (`core`: a fake CoreV1Api, never asked for
    ConfigMaps or Secrets)."""
    return SimpleNamespace(
        config=SimpleNamespace(pods_dir=pods_dir), host_ip="127.0.0.1", core=core, objects=ObjectWatches(core)
    )


async def test_a_late_event_of_the_pod_sends_no_status_again_and_another_clients_readiness_change_does(
    tmp_path: Path,
) -> None:
    """A watch event older than the kubelet's own status write (it lags on a busy API server) is not a change of
    the Pod's readiness by another client; the node lifecycle controller's NotReady, written after it, is."""
    api = StatusApi(version=10)
    runtime = _status_runtime(tmp_path, api)
    worker = PodWorker(runtime, _versioned(10, None))  # type: ignore[arg-type]
    worker.state.start_time = now()
    worker.state.initialized = True  # and no container to wait for: Ready
    await worker._flush_status()
    assert len(api.writes) == 1
    assert api.version == 11

    worker.update(_versioned(10, None))  # the event of the Pod before the write, arriving after it
    await worker._flush_status()
    assert len(api.writes) == 1, "a late event is no reason to write the same status again"

    worker.update(_versioned(12, "False"))  # the node lifecycle controller marked it NotReady after the write
    await worker._flush_status()
    assert len(api.writes) == 2, "another client's readiness change is written over"


async def test_a_stopped_pods_last_status_write_is_its_terminal_phase_however_the_writes_are_answered(
    tmp_path: Path,
) -> None:
    """The reporter's write of the stopped container is slow to be answered; the final write, asked for
    meanwhile (the Pod's deletion), goes after it and says Succeeded: the Pod never goes back to Running."""
    api = StatusApi(version=10)
    api.answer_first.clear()
    runtime = _status_runtime(tmp_path, api)
    worker = PodWorker(runtime, _versioned(10, None))  # type: ignore[arg-type]
    worker.state.start_time = now()
    worker.state.initialized = True
    stopped = Terminated(0, "Completed", None, now(), None)
    worker.state.containers = [ContainerStatus(name="c", image="i", state="terminated", terminated=stopped)]
    reporter = asyncio.create_task(worker._flush_status())  # the container stopped: phase Running still
    await asyncio.sleep(0)
    worker.state.released = True  # and the Pod's resources are returned: Succeeded
    final = asyncio.create_task(worker._flush_status())
    await asyncio.sleep(0)
    api.answer_first.set()
    await asyncio.gather(reporter, final)
    assert [write["status"]["phase"] for write in api.writes] == ["Running", "Succeeded"]
