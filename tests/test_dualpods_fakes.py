"""Builders and in-memory fakes shared by the dual-pods controller's unit tests (this module holds no tests).

The controller and its Reconciler are driven with the real informer caches (loaded through their public
`upsert` and `remove`, no API server) and the real metrics, and with fakes, each implementing the Protocol
of what they stand for, for everything that talks to the outside: the Pod writer (the API server), the
launcher, requester and model-server HTTP clients, the launchers' views and the Event recorder. Every fake
call lands in one journal, so a test can assert what was written, deleted and called, and in which order;
ISC status writes (the real writer is tested against the API server in tests/test_conditions.py) land in
their own list, so the journal stays about the inference servers.
e2e/test_dualpods_launcher.py runs the same logic against a real cluster.
"""

import copy
import itertools
import json
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from api import keys, launcher_summary
from api.crds import API_VERSION, CustomResource, InferenceServerConfig, LauncherConfig, Status
from api.launcher import (
    AllInstancesState,
    InstanceState,
    InstanceStatus,
    ProcessStats,
    StopReason,
    VllmConfig,
    WakeCheck,
    WakeCheckStatus,
)
from controller.conditions import current
from controller.dualpods.collaborators import Clients
from controller.dualpods.controller import DualPodsController, DualPodsOptions, kube_caches
from controller.dualpods.devices import Device
from controller.dualpods.identity import instance_id, vllm_config
from controller.dualpods.metrics import DualPodsMetrics
from controller.dualpods.nominal import nominal_provider
from controller.dualpods.passes import Options
from controller.dualpods.phases import Phase, classify
from controller.dualpods.routing import from_isc
from controller.dualpods.snapshot import observe
from controller.dualpods.writer import FIELD_MANAGER, set_binding
from controller.http import HttpError, Reply
from controller.launcher_template import node_independent_pod, pod_for_node
from controller.launcher_views import ChangeListener, LauncherView, ListedListener
from kube.informer import Informer, Obj, object_key
from kube.workqueue import Result
from tests.phase_transitions import RECORDER

NS = "ns"
NODE = "node-a"
GPU0 = "GPU-0000"
GPU1 = "GPU-1111"
ISC = "isc"
LC = "lc"
PORT = 8005
REQ = "req"
REQ_UID = "req-uid"
LAUNCHER = "launcher-1"
STARTED_AT = "2026-01-01T00:00:00+00:00"
LC_LABEL = "from-launcher-config"
ROUTING_LABEL = "example.com/pool"
ROUTING_ANNOTATION = "example.com/note"
PROVIDER = "provider-1"
SERVER_PORT = 8000
TOKEN_VOLUME = "kube-api-access-abcde"
TOKEN_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# An FMA-style server patch: the set's selector label moved off, the model server in the requester's container.
PATCH = """
metadata:
  labels:
    app: null
    model: m1
spec:
  containers:
  - name: inference-server
    image: vllm/vllm-openai:v1
    args: ["--model", "/models/m1", "--port", "8000"]
    env:
    - name: VLLM_SERVER_DEV_MODE
      value: "1"
    readinessProbe:
      httpGet: {path: /health, port: 8000}
"""


# ----- builders


def node_obj(name: str = NODE, *, unschedulable: bool = False, deleting: bool = False) -> Obj:
    metadata: dict[str, Any] = {"name": name, "uid": f"{name}-uid", "resourceVersion": "1"}
    if deleting:
        metadata["deletionTimestamp"] = STARTED_AT
    return {"apiVersion": "v1", "kind": "Node", "metadata": metadata, "spec": {"unschedulable": unschedulable}}


def lc_obj(max_instances: int = 2, labels: dict[str, str] | None = None, budget: dict[str, int] | None = None) -> Obj:
    """A LauncherConfig; `budget` is its E3 sleeperBudget (hostMemoryBytes, gpuMemoryBytes)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "LauncherConfig",
        "metadata": {"name": LC, "namespace": NS, "uid": "lc-uid", "resourceVersion": "1"},
        "spec": {
            "maxInstances": max_instances,
            "podTemplate": {
                "metadata": {"labels": {LC_LABEL: "yes", **(labels or {})}},
                "spec": {"containers": [{"name": keys.INFERENCE_SERVER_CONTAINER, "image": "launcher:1"}]},
            },
            "sleeperBudget": budget or {},
        },
    }


def isc_obj(
    name: str = ISC,
    *,
    port: int = PORT,
    options: str = "--model /models/a",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    rv: str = "1",
) -> Obj:
    """An ISC; by default with one routing label and one routing annotation."""
    return {
        "apiVersion": API_VERSION,
        "kind": "InferenceServerConfig",
        "metadata": {"name": name, "namespace": NS, "uid": f"{name}-uid", "resourceVersion": rv},
        "spec": {
            "launcherConfigName": LC,
            "modelServerConfig": {
                "port": port,
                "options": options,
                "labels": {ROUTING_LABEL: "a"} if labels is None else labels,
                "annotations": {ROUTING_ANNOTATION: "x"} if annotations is None else annotations,
            },
        },
    }


def wanted_id(isc: Obj | None = None, gpus: Iterable[str] = (GPU0,)) -> str:
    return instance_id(InferenceServerConfig.from_k8s(isc or isc_obj()), list(gpus))


def requester_obj(
    name: str = REQ,
    uid: str = REQ_UID,
    *,
    ip: str | None = "127.0.0.5",
    gpus: Iterable[str] | None = (GPU0,),
    isc: str | None = ISC,
    ready: bool = False,
    finalizer: bool = False,
    deleting: bool = False,
    labels: dict[str, str] | None = None,
    rv: str = "1",
) -> Obj:
    """A server-requesting Pod on NODE, its container running; `gpus` None: not yet recorded."""
    annotations: dict[str, str] = {}
    if isc is not None:
        annotations[keys.INFERENCE_SERVER_CONFIG_ANNOTATION] = isc
    if gpus is not None:
        annotations[keys.ACCELERATORS_ANNOTATION] = ",".join(gpus)
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": uid,
        "resourceVersion": rv,
        "labels": {"app": "requesters", **(labels or {})},
        "annotations": annotations,
        "finalizers": [keys.REQUESTER_FINALIZER] if finalizer else [],
    }
    if deleting:  # just now: its finalizer's patience has not run out
        metadata["deletionTimestamp"] = datetime.now(UTC).isoformat()
    status: dict[str, Any] = {
        "phase": "Running",
        "containerStatuses": [
            {"name": keys.INFERENCE_SERVER_CONTAINER, "ready": ready, "restartCount": 0,
             "state": {"running": {"startedAt": STARTED_AT}}},
        ],
    }  # fmt: skip
    if ip is not None:
        status["podIP"] = ip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"nodeName": NODE}, "status": status}


def on_node(pod: Obj, *, ip: str | None, ready: bool, running: bool, restarts: int, failed: bool = False) -> Obj:
    """`pod` on NODE with the status its kubelet reports: the serving container running, or still being created."""
    pod["spec"]["nodeName"] = NODE
    state = {"running": {"startedAt": STARTED_AT}} if running else {"waiting": {"reason": "ContainerCreating"}}
    pod["status"] = {
        "phase": "Failed" if failed else "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [
            {"name": keys.INFERENCE_SERVER_CONTAINER, "ready": ready, "restartCount": restarts, "state": state}
        ],
    }
    if ip is not None:
        pod["status"]["podIP"] = ip
    return pod


def launcher_obj(
    name: str = LAUNCHER,
    *,
    ip: str | None = "127.0.1.1",
    ready: bool = True,
    running: bool = True,
    restarts: int = 0,
    deleting: bool = False,
    failed: bool = False,
    lc: Obj | None = None,
) -> Obj:
    """An unbound launcher on NODE, made from the LauncherConfig as the controllers make them."""
    template, template_hash = node_independent_pod(LauncherConfig.from_k8s(lc or lc_obj()))
    pod = pod_for_node(template, template_hash, NODE)
    metadata = pod["metadata"]
    del metadata["generateName"]
    metadata.update(name=name, uid=f"{name}-uid", resourceVersion="1", finalizers=[])
    if deleting:
        metadata["deletionTimestamp"] = STARTED_AT
    return on_node(pod, ip=ip, ready=ready, running=running, restarts=restarts, failed=failed)


def crash_looping(pod: Obj) -> Obj:
    """`pod` with its container failing: restarted again and again, now waiting to be restarted."""
    pod["status"]["containerStatuses"][0].update(restartCount=5, state={"waiting": {"reason": "CrashLoopBackOff"}})
    return pod


def bound(
    launcher: Obj,
    requester: Obj,
    *,
    isc: Obj | None = None,
    gpus: Iterable[str] = (GPU0,),
    serving: bool = False,
    routing_json: str | None = None,
) -> Obj:
    """`launcher` bound to `requester` as the bind write leaves it; `serving`: also as the serving write
    leaves it (sleeping=false and the ISC's routing metadata applied)."""
    model = InferenceServerConfig.from_k8s(isc or isc_obj())
    config = vllm_config(model, list(gpus), verify_wakes=True)
    routing = from_isc(model)
    pod = copy.deepcopy(launcher)
    metadata = pod["metadata"]
    metadata["annotations"].update({
        keys.REQUESTER_ANNOTATION: f"{requester['metadata']['uid']} {requester['metadata']['name']}",
        keys.INSTANCE_ID_ANNOTATION: instance_id(model, list(gpus)),
        keys.SERVER_PORT_ANNOTATION: str(model.spec.model_server_config.port),
        keys.VLLM_CONFIG_ANNOTATION: config.model_dump_json(exclude_none=True),
        keys.ISC_ROUTING_METADATA_ANNOTATION: routing_json or routing.model_dump_json(),
    })  # fmt: skip
    metadata["labels"][keys.DUAL_LABEL] = requester["metadata"]["name"]
    metadata["finalizers"] = [*metadata.get("finalizers", []), keys.PROVIDER_FINALIZER]
    if serving:
        metadata["labels"].update({keys.SLEEPING_LABEL: "false", **routing.labels})
        metadata["annotations"].update(routing.annotations)
    return pod


def inst(
    instance: str,
    *,
    isc: str = ISC,
    port: int = PORT,
    gpus: Iterable[str] = (GPU0,),
    sleeping: bool = True,
    ready: bool = True,
    stopped: bool = False,
    revision: int = 1,
    rss: int | None = None,
    gpu_bytes: int | None = None,
    wake_check_failed: bool = False,
) -> InstanceState:
    """An instance as a launcher reports it, made by the controller for `isc`; `rss` and `gpu_bytes`:
    the memory its processes hold; `wake_check_failed`: killed by its launcher for failing its post-wake
    check."""
    process = None
    if rss is not None:
        process = ProcessStats(pid=1, processes=1, rss_bytes=rss, cpu_percent=0.0, gpu_memory_bytes=gpu_bytes)
    return InstanceState(
        status=InstanceStatus.STOPPED if stopped or wake_check_failed else InstanceStatus.RUNNING,
        instance_id=instance,
        revision=revision,
        options=f"--model /models/a --port {port}",
        gpu_uuids=list(gpus),
        annotations={keys.INSTANCE_ISC_NAME: isc, keys.INSTANCE_INFERENCE_PORT: str(port)},
        ready=ready,
        sleeping=sleeping,
        exit_code=-9 if wake_check_failed else 1 if stopped else None,
        stop_reason=StopReason.WAKE_CHECK_FAILED if wake_check_failed else None,
        wake_check=WakeCheck(status=WakeCheckStatus.RECORDED, detail="token 0: 464 instead of 198")
        if wake_check_failed
        else None,
        process=process,
    )


def summarized(pod: Obj, *instances: InstanceState) -> Obj:
    """`pod` (a launcher) carrying the dual-pods controller's summary of `instances`."""
    summary = launcher_summary.summarize(instances, None, datetime(2026, 12, 2, 6, 0, tzinfo=UTC))
    pod["metadata"].setdefault("annotations", {})[launcher_summary.ANNOTATION] = summary.annotation()
    return pod


WANTED = wanted_id()


def finalizers(pod: Obj) -> list[str]:
    found: list[str] = pod["metadata"].get("finalizers") or []
    return found


def settled(requester: Obj, launcher: str = LAUNCHER, instance: str = WANTED) -> Obj:
    """`requester` as the controller settles it once bound (§2.4 step 11)."""
    requester["metadata"]["finalizers"] = [keys.REQUESTER_FINALIZER]
    requester["metadata"]["labels"].update({keys.DUAL_LABEL: launcher, keys.INSTANCE_LABEL: instance})
    requester["metadata"]["annotations"][keys.STATUS_ANNOTATION] = '{"Errors": null}'
    return requester


def status_errors(pod: Obj) -> list[str] | None:
    errors: list[str] | None = json.loads(pod["metadata"]["annotations"][keys.STATUS_ANNOTATION])["Errors"]
    return errors


# ----- builders for direct mode


def gpu_map_obj(data: dict[str, dict[str, int]] | None = None, rv: str = "1") -> Obj:
    """The gpu-map ConfigMap; by default NODE's two GPUs at indices 0 and 1."""
    mapping = {NODE: {GPU0: 0, GPU1: 1}} if data is None else data
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": keys.GPU_MAP_CONFIGMAP, "namespace": NS, "uid": "gpu-map-uid", "resourceVersion": rv},
        "data": {node: json.dumps(entries) for node, entries in mapping.items()},
    }


def direct_requester_obj(name: str = REQ, uid: str = REQ_UID, *, patch: str = PATCH, **kwargs: Any) -> Obj:
    """A server-requesting Pod with a server patch, as the API server shows one of a ReplicaSet `requesters`:
    with the ServiceAccount token volume that admission adds."""
    pod = requester_obj(name, uid, isc=None, **kwargs)
    pod["metadata"]["annotations"][keys.SERVER_PATCH_ANNOTATION] = patch
    pod["spec"].update(
        serviceAccountName="default",
        containers=[{
            "name": keys.INFERENCE_SERVER_CONTAINER,
            "image": "requester:1",
            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}},
            "volumeMounts": [{"name": TOKEN_VOLUME, "mountPath": TOKEN_MOUNT, "readOnly": True}],
        }],
        volumes=[{"name": TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
    )  # fmt: skip
    return pod


def provider_obj(
    name: str = PROVIDER,
    *,
    requester: Obj | None = None,
    gpus: Iterable[str] = (GPU0,),
    indices: Iterable[str] = ("0",),
    bound_to: Obj | None = None,
    sleeping: str = "true",
    ip: str | None = "127.0.2.1",
    ready: bool = True,
    running: bool = True,
    restarts: int = 0,
    deleting: bool = False,
    used_at: str | None = None,
    created_at: str = STARTED_AT,
) -> Obj:
    """A direct provider on NODE made from `requester`'s patch as the controller makes them, unbound (asleep) unless
    `bound_to`; `used_at`: when the controller last wrote it (its managedFields entry)."""
    pod = nominal_provider(requester or direct_requester_obj(), NODE, list(indices), list(gpus)).pod
    metadata = pod["metadata"]
    del metadata["generateName"]
    metadata.update(name=name, uid=f"{name}-uid", resourceVersion="1", finalizers=[], creationTimestamp=created_at)
    metadata["labels"][keys.SLEEPING_LABEL] = sleeping
    if used_at is not None:
        metadata["managedFields"] = [
            {"manager": "kube-scheduler", "operation": "Update", "time": "2099-01-01T00:00:00Z"},
            {"manager": FIELD_MANAGER, "operation": "Update", "time": used_at},
        ]
    if deleting:
        metadata["deletionTimestamp"] = STARTED_AT
    if bound_to is not None:
        set_binding(pod, bound_to)
    return on_node(pod, ip=ip, ready=ready, running=running, restarts=restarts)


# ----- fakes


@dataclass
class Call:
    """One thing the Reconciler did to the outside world."""

    kind: str  # update / create / delete (Pods), create_instance / delete_instance / sleep / wake / list
    # (launchers), gpu_uuids / memory_usage / relay (requesters), event
    target: str  # the Pod's name, or the instance ID for launcher calls
    detail: Any = None  # the written Pod, the delete preconditions, the call's arguments, the Event


class Journal(list[Call]):
    def kinds(self) -> list[tuple[str, str]]:
        return [(c.kind, c.target) for c in self]

    def of(self, kind: str) -> list[Call]:
        return [c for c in self if c.kind == kind]

    def written(self, name: str) -> Obj:
        """The last version of Pod `name` that was written (updated or created)."""
        pods = [c.detail for c in self if c.kind in ("update", "create") and c.target == name]
        assert pods, f"{name} was not written: {self.kinds()}"
        last: Obj = pods[-1]
        return last


class FakeWriter:
    """A fake PodWrites (the real one, PodWriter, needs an API server). Each write goes into the journal and into the
    pod cache the way the API server and the informer would show it (a new resourceVersion; a delete of
    a Pod with finalizers only marks it; a deleting Pod goes once its last finalizer is removed), so a
    test can run several passes in a row."""

    def __init__(self, journal: Journal, cache: Informer) -> None:
        self.namespace = NS
        self.journal = journal
        self.cache = cache
        self._versions = itertools.count(100)
        self._serial = itertools.count(1)
        self.created_unseen: list[Obj] = []  # with `watch_lags`: created Pods the cache does not show yet
        self.watch_lags = False  # created Pods reach the cache only at `deliver_created`, as a lagging watch

    def _store(self, pod: Obj) -> str:
        """Keep `pod` as its new version (or drop it, if that ends its deletion); its resourceVersion."""
        pod = copy.deepcopy(pod)
        version = pod["metadata"]["resourceVersion"] = str(next(self._versions))
        gone = pod["metadata"].get("deletionTimestamp") and not pod["metadata"].get("finalizers")
        if gone:
            self.cache.remove(object_key(pod))
        else:
            self.cache.upsert(pod)
        return version

    async def update(
        self, pod: Obj, mutate: Callable[[Obj], None], why: str, *, if_unchanged: bool = True
    ) -> str | None:
        changed = copy.deepcopy(pod)
        mutate(changed)
        if changed == pod:
            return None
        self.journal.append(Call("update", pod["metadata"]["name"], changed))
        return self._store(changed)

    async def create(self, pod: Obj) -> Obj:
        created = copy.deepcopy(pod)
        serial = next(self._serial)
        metadata = created["metadata"]
        metadata.update(name=f"{metadata['generateName']}{serial}", uid=f"created-{serial}-uid", namespace=NS)
        self.journal.append(Call("create", metadata["name"], copy.deepcopy(created)))
        if self.watch_lags:
            self.created_unseen.append(created)
        else:
            self._store(created)
        return created

    def deliver_created(self) -> None:
        """The lagging watch catches up: the Pods created since show in the cache."""
        for created in self.created_unseen:
            self._store(created)
        self.created_unseen.clear()

    async def delete(self, pod: Obj, why: str) -> None:
        metadata = pod["metadata"]
        self.journal.append(
            Call("delete", metadata["name"], {"uid": metadata["uid"], "rv": metadata["resourceVersion"]})
        )
        current = self.cache.get(object_key(pod))
        if current is not None:
            current = copy.deepcopy(current)
            current["metadata"]["deletionTimestamp"] = STARTED_AT
            self._store(current)


class FakeViews:
    """A fake ViewSource (the real one, LauncherViews, follows each launcher's watch stream over HTTP). A
    test puts in what each launcher reports, FakeLauncherClient changes it as the launcher's events would,
    and `changed` / `listed` tell the listeners as the real views do."""

    def __init__(self) -> None:
        self.views: dict[str, LauncherView] = {}
        self.tracked: list[tuple[str, str | None]] = []
        self.forgotten: list[str] = []
        self._on_change: list[ChangeListener] = []
        self._on_listed: list[ListedListener] = []

    def subscribe(self, on_change: ChangeListener, on_listed: ListedListener | None = None) -> None:
        self._on_change.append(on_change)
        if on_listed is not None:
            self._on_listed.append(on_listed)

    def changed(self, launcher: str) -> None:
        """As after a watch event of `launcher`."""
        for listener in self._on_change:
            listener(launcher)

    def listed(self, launcher: str, view: LauncherView) -> None:
        """As after a list of `launcher` that found something new."""
        for listener in self._on_listed:
            listener(launcher, view)

    def get(self, launcher: str) -> LauncherView | None:
        return self.views.get(launcher)

    def put(self, launcher: Obj, *states: InstanceState, synced: bool = True) -> LauncherView:
        view = LauncherView(
            pod_ip=launcher["status"].get("podIP", ""),
            instances={s.instance_id: s for s in states},
            revision=max((s.revision for s in states), default=0),
            synced=synced,
        )
        self.views[launcher["metadata"]["name"]] = view
        return view

    def at(self, pod_ip: str) -> LauncherView:
        return next(v for v in self.views.values() if v.pod_ip == pod_ip)

    # What the controller's event handlers call.
    def track(
        self, launcher: str, pod_ip: str | None, incarnation: Hashable = None, signature: str | None = None
    ) -> None:
        self.tracked.append((launcher, pod_ip))

    def learn(self, launcher: str, instance_id: str, sleeping: bool) -> None:
        """As the real views record a sleep or wake made through vLLM's own endpoints."""
        if self.views[launcher].learn(instance_id, sleeping):
            self.changed(launcher)

    def forget(self, launcher: str) -> None:
        self.forgotten.append(launcher)


class FakeLauncherClient:
    """A fake Launchers (the real one, LauncherClient, calls launcher Pods over HTTP (covered by the launcher's own
    tests and e2e). Calls go into the journal and change the FakeViews as the launcher would: a created
    instance appears starting, a deleted one disappears, sleep and wake flip `sleeping`. `refusal`, when
    set, is what the next instance creations raise; a wake of an instance in `corrupt` fails its post-wake
    check as our launcher's does (the instance killed, STOPPED WakeCheckFailed, the wake answered 502). With
    `lagging`, a creation's event has not reached the view yet: the launcher's answer is all the controller
    knows of it (`deliver` brings the events)."""

    def __init__(self, journal: Journal, views: FakeViews) -> None:
        self.journal = journal
        self.views = views
        self.refusal: Exception | None = None
        self.corrupt: set[str] = set()
        self.lagging = False
        self._undelivered: list[tuple[str, InstanceState]] = []

    def _change(self, pod_ip: str, instance: str, **update: Any) -> None:
        view = self.views.at(pod_ip)
        view.revision += 1
        state = view.instances[instance]
        view.instances[instance] = state.model_copy(update={**update, "revision": view.revision})

    async def list_instances(self, pod_ip: str, isc_name: str = "") -> AllInstancesState:
        self.journal.append(Call("list", pod_ip))
        view = self.views.at(pod_ip)
        running = [s for s in view.instances.values() if s.status is InstanceStatus.RUNNING]
        return AllInstancesState(revision=view.revision, total_instances=len(view.instances),
                                 running_instances=len(running), instances=list(view.instances.values()))  # fmt: skip

    async def create_instance(
        self, pod_ip: str, instance_id: str, config: VllmConfig, isc_name: str, requester: str
    ) -> InstanceState:
        self.journal.append(Call("create_instance", instance_id, (pod_ip, config, isc_name, requester)))
        if self.refusal is not None:
            raise self.refusal
        view = self.views.at(pod_ip)
        revision = max([view.revision, *(s.revision for _, s in self._undelivered)]) + 1
        state = InstanceState(
            status=InstanceStatus.RUNNING, instance_id=instance_id, revision=revision, options=config.options,
            gpu_uuids=config.gpu_uuids, annotations=config.annotations,
        )  # fmt: skip
        self._undelivered.append((pod_ip, state))
        if not self.lagging:
            self.deliver()
        return state

    def deliver(self) -> None:
        """The CREATED events not yet in the views arrive, as the watch stream brings them."""
        for pod_ip, state in self._undelivered:
            view = self.views.at(pod_ip)
            view.instances[state.instance_id] = state
            view.revision = max(view.revision, state.revision)
            view.cover_pending(listed=False)
        self._undelivered.clear()

    async def delete_instance(self, pod_ip: str, instance_id: str, isc_name: str = "", requester: str = "") -> None:
        self.journal.append(Call("delete_instance", instance_id, pod_ip))
        self.views.at(pod_ip).instances.pop(instance_id, None)

    async def sleep(self, pod_ip: str, instance_id: str, isc_name: str, requester: str) -> None:
        self.journal.append(Call("sleep", instance_id, pod_ip))
        self._change(pod_ip, instance_id, sleeping=True)

    async def wake(self, pod_ip: str, instance_id: str, isc_name: str, requester: str) -> None:
        self.journal.append(Call("wake", instance_id, pod_ip))
        if instance_id in self.corrupt:
            failed = inst(instance_id, wake_check_failed=True)
            self._change(pod_ip, instance_id, **failed.model_dump(include={"status", "stop_reason", "exit_code"}),
                         wake_check=failed.wake_check)  # fmt: skip
            body = {"detail": "woken, it failed its post-wake check", "reason": "WakeCheckFailed"}
            raise HttpError("wake", f"http://{pod_ip}:8001/v2/vllm/instances/{instance_id}/wake_up", Reply(502, body))
        self._change(pod_ip, instance_id, sleeping=False)


class FakeProviderClient:
    """A fake ModelServers (the real one, ProviderClient, calls vLLM on a direct provider over HTTP). Calls go
    into the journal (target: the provider's address, detail: the port); `asleep` is what each address reports,
    and sleep and wake change it; `refusal`, when set, is what the next sleeps raise."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.asleep: dict[str, bool] = {}
        self.refusal: Exception | None = None
        self.adapters: dict[str, set[str]] = {}  # address -> LoRA adapters it serves

    async def is_sleeping(self, pod_ip: str, port: int, requester: str) -> bool:
        self.journal.append(Call("is_sleeping", pod_ip, port))
        return self.asleep.get(pod_ip, False)

    async def sleep(self, pod_ip: str, port: int, requester: str) -> None:
        self.journal.append(Call("sleep", pod_ip, port))
        if self.refusal is not None:
            raise self.refusal
        self.asleep[pod_ip] = True

    async def wake(self, pod_ip: str, port: int, requester: str) -> None:
        self.journal.append(Call("wake", pod_ip, port))
        self.asleep[pod_ip] = False

    async def lora_adapters(self, pod_ip: str, port: int, requester: str) -> set[str]:
        return set(self.adapters.get(pod_ip, set()))

    async def load_lora(self, pod_ip: str, port: int, name: str, path: str, requester: str) -> None:
        self.journal.append(Call("load_lora", name, path))
        self.adapters.setdefault(pod_ip, set()).add(name)

    async def unload_lora(self, pod_ip: str, port: int, name: str, requester: str) -> None:
        self.journal.append(Call("unload_lora", name))
        self.adapters.setdefault(pod_ip, set()).discard(name)


class FakeRequesterClient:
    """A fake Requesters (the real one, RequesterClient, calls the requester's SPI over HTTP (covered by
    tests/test_requester.py and e2e). `gpus` is what the accelerator query answers (or raises);
    `relay_error`, when set, is what relaying readiness raises."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.gpus: list[str] | Exception = [GPU0]
        self.relay_error: Exception | None = None
        self.memory_mib: dict[str, int] = {}
        self.proxied: dict[str, tuple[str, int]] = {}  # requester -> where its proxy points (kept out of the journal)

    async def gpu_uuids(self, requester: Obj, isc_name: str) -> list[str]:
        self.journal.append(Call("gpu_uuids", requester["metadata"]["name"]))
        if isinstance(self.gpus, Exception):
            raise self.gpus
        return list(self.gpus)

    async def memory_usage(self, requester: Obj, isc_name: str) -> dict[str, int]:
        self.journal.append(Call("memory_usage", requester["metadata"]["name"]))
        return dict(self.memory_mib)

    async def configure_proxy(self, requester: Obj, address: str, port: int, isc_name: str) -> None:
        self.proxied[requester["metadata"]["name"]] = (address, port)

    async def relay_readiness(self, requester: Obj, ready: bool, isc_name: str) -> None:
        self.journal.append(Call("relay", requester["metadata"]["name"], ready))
        if self.relay_error is not None:
            raise self.relay_error


class FakeEvents:
    """A fake EventSink (the real one, EventRecorder, creates Event objects through the API server)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    async def record(self, obj: Obj, type_: str, reason: str, message: str) -> None:
        self.journal.append(Call("event", obj["metadata"]["name"], (type_, reason, message)))


class FakeDevices:
    """A fake Devices (the real one, SliceDevices, lists the Node's ResourceSlices through the API server): the
    DRA device names of the UUIDs in `names`, on any Node."""

    def __init__(self) -> None:
        self.names: dict[str, Device] = {}

    async def named(self, node: str, uuids: list[str]) -> dict[str, Device]:
        return {u: self.names[u] for u in uuids if u in self.names}


class FakeStatuses:
    """A fake StatusWrites: it keeps what the real one would write, as the API server would then show it."""

    def __init__(self, cache: Informer) -> None:
        self.cache = cache
        self.written: list[tuple[str, Status]] = []

    async def write(self, kind: type[CustomResource], obj: Mapping[str, Any], status: Status) -> bool:
        if current(type(status), obj) == status:
            return False
        self.written.append((obj["metadata"]["name"], status))
        shown = {**copy.deepcopy(dict(obj)), "status": status.to_k8s()}
        shown["metadata"]["resourceVersion"] = f"{obj['metadata']['resourceVersion']}+status"
        self.cache.upsert(shown)
        return True


class Harness:
    """The controller and its Reconciler over the controller's own caches and indexes, filled by hand, with the
    fakes above."""

    def __init__(self, api: client.ApiClient, options: Options) -> None:
        self.registry = CollectorRegistry()
        self.caches = kube_caches(api, NS)
        self.journal = Journal()
        self.views = FakeViews()
        self.writer = FakeWriter(self.journal, self.caches.pods)
        self.launchers = FakeLauncherClient(self.journal, self.views)
        self.requesters = FakeRequesterClient(self.journal)
        self.providers = FakeProviderClient(self.journal)
        self.events = FakeEvents(self.journal)
        self.statuses = FakeStatuses(self.caches.iscs)
        self.devices = FakeDevices()
        clients = Clients(
            self.writer, self.launchers, self.requesters, self.providers, self.events, self.statuses, self.devices
        )
        settings = DualPodsOptions(
            launcher_token_secret=options.launcher_token_secret, sleeper_limit=options.sleeper_limit
        )
        self.controller = DualPodsController(NS, self.caches, self.views, clients, DualPodsMetrics(self.registry),
                                             settings)  # fmt: skip
        self.controller.isc_status_settle_s = 0.0  # queued at once: the tests read the queue without waiting
        self.reconciler = self.controller.reconciler

    def informer(self, obj: Obj) -> Informer:
        return {
            "Pod": self.caches.pods,
            "Node": self.caches.nodes,
            "InferenceServerConfig": self.caches.iscs,
            "LauncherConfig": self.caches.lcs,
            "ConfigMap": self.caches.configmaps,
        }[obj["kind"]]

    def put(self, *objs: Obj) -> None:
        """Objects as the informers would show them once the API server has them (replacing any
        cached version, whatever its resourceVersion)."""
        for obj in objs:
            self.informer(obj).remove(object_key(obj))
            self.informer(obj).upsert(copy.deepcopy(obj))

    def remove(self, obj: Obj) -> None:
        self.informer(obj).remove(object_key(obj))

    def pod(self, name: str) -> Obj:
        pod = self.caches.pods.get(f"{NS}/{name}")
        assert pod is not None, f"Pod {name} is not in the cache"
        return pod

    def has_pod(self, name: str) -> bool:
        return self.caches.pods.get(f"{NS}/{name}") is not None

    async def reconcile(self, name: str = REQ) -> Result:
        """One pass, recorded: the phase it ran and the phase its change led to (tests/phase_transitions.py)."""
        before = self.phase(name)
        try:
            return await self.reconciler.reconcile_requester(name)
        finally:
            RECORDER.record(name, before, self.phase(name))

    def phase(self, name: str = REQ) -> Phase:
        """The phase the next pass of `name` runs."""
        return classify(observe(NS, name, self.caches, self.views))

    async def drive(self, name: str = REQ, passes: int = 10) -> list[Call]:
        """Reconcile until a pass does nothing, as the watch event of each write would; returns what was done."""
        start = len(self.journal)
        for _ in range(passes):
            before = len(self.journal)
            await self.reconcile(name)
            if len(self.journal) == before:
                return self.journal[start:]
        raise AssertionError(f"still busy after {passes} passes: {self.journal.kinds()[start:]}")

    def metric(self, name: str, **labels: str) -> float | None:
        value: float | None = self.registry.get_sample_value(name, labels)
        return value

    async def queued(self) -> set[tuple[str, str]]:
        """Empty the controller's work queue; what was in it."""
        found: set[tuple[str, str]] = set()
        while len(self.controller.queue):
            key = await self.controller.queue.get()
            assert key is not None
            self.controller.queue.done(key)
            found.add(key)
        return found


@asynccontextmanager
async def harness(options: Options | None = None) -> AsyncIterator[Harness]:
    """A Harness; its API client only binds the informers, and never connects."""
    async with client.ApiClient() as api:
        yield Harness(api, options or Options())
