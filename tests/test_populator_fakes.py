"""Builders and in-memory fakes shared by the populator's unit tests (this module holds no tests).

The reconcile logic is tested against fakes, not the loopback cluster, so each case runs in
milliseconds and can set up what a real cluster makes hard to time: a cache that lags, a delete that
conflicts, a patch that fails. e2e/test_populator.py runs the same logic against the real API server.
"""

import copy
import itertools
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from api import keys
from controller.launcher_template import Pod
from controller.populator.digest import Digest, digest_config, digest_policy
from controller.populator.expectations import PendingExpectations
from controller.populator.key import LauncherKey, launcher_key
from controller.populator.kubeapi import DeleteOutcome
from controller.populator.metrics import LauncherPodCount
from controller.populator.nodes import NodeFacts
from controller.populator.phases import Thresholds
from controller.populator.reconcile import KeyReconciler
from controller.populator.refusals import Refusal
from controller.populator.warmth import Warmth

NOW = datetime(2026, 6, 21, 12, 0, tzinfo=UTC)
NODE = "node-a"
CONFIG = "lc-a"
KEY = LauncherKey(NODE, CONFIG)
THRESHOLDS = Thresholds(scheduling=120.0, starting=450.0)
EXPECTATION_TIMEOUT = 5.0


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def config_manifest(name: str = CONFIG, container: str = keys.INFERENCE_SERVER_CONTAINER) -> dict[str, Any]:
    return {
        "apiVersion": "fma.llm-d.ai/v1alpha1",
        "kind": "LauncherConfig",
        "metadata": {"name": name, "namespace": "ns", "uid": f"{name}-uid", "generation": 1},
        "spec": {"maxInstances": 2, "podTemplate": {"spec": {"containers": [{"name": container, "image": "l:1"}]}}},
    }


def policy_manifest(counts: dict[str, int], match_labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "fma.llm-d.ai/v1alpha1",
        "kind": "LauncherPopulationPolicy",
        "metadata": {"name": "policy", "namespace": "ns", "generation": 1},
        "spec": {
            "enhancedNodeSelector": {"labelSelector": {"matchLabels": match_labels or {}}},
            "countForLauncher": [{"launcherConfigName": c, "launcherCount": n} for c, n in counts.items()],
        },
    }


def node(name: str = NODE, labels: dict[str, str] | None = None, **allocatable: str) -> NodeFacts:
    return NodeFacts(name, labels or {}, allocatable)


def digest_for(count: int | None, nodes: Iterable[str] = (NODE,)) -> Digest:
    """A digest with LauncherConfig `lc-a` and, unless `count` is None, a policy asking `count` of it."""
    digest = Digest()
    for name in nodes:
        digest.set_node(name, node(name))
    digest.set_config(CONFIG, digest_config(config_manifest(), None))
    if count is not None:
        digest.set_policy("policy", digest_policy(policy_manifest({CONFIG: count})))
    return digest


def current_hash(digest: Digest, key: LauncherKey = KEY) -> str:
    target = digest.target(key)
    assert target is not None
    return target.template_hash


def launcher(
    name: str,
    template_hash: str | None,
    *,
    created: datetime = NOW - timedelta(minutes=1),
    scheduled: datetime | None = None,
    ready: bool = False,
    bound: bool = False,
    deleting: bool = False,
    stuck_label: bool = False,
    key: LauncherKey = KEY,
    used: datetime | None = None,
) -> dict[str, Any]:
    """A launcher Pod of `key` as the API server would show it."""
    conditions = []
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(scheduled)})
    if ready:
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": stamp(created)})
    labels = {
        keys.COMPONENT_LABEL: keys.LAUNCHER_COMPONENT,
        keys.LAUNCHER_CONFIG_NAME_LABEL: key.config,
        keys.NODE_NAME_LABEL: key.node,
    }
    if stuck_label:
        labels[keys.LAUNCHER_STUCK_LABEL] = "true"
    annotations = {keys.LAUNCHER_TEMPLATE_HASH_ANNOTATION: template_hash} if template_hash is not None else {}
    if bound:
        annotations[keys.REQUESTER_ANNOTATION] = f"{name}-requester-uid {name}-requester"
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"{name}-uid",
        "resourceVersion": "1",
        "creationTimestamp": stamp(created),
        "labels": labels,
        "annotations": annotations,
    }
    if deleting:
        metadata["deletionTimestamp"] = stamp(NOW)
    if used is not None:  # when the dual-pods controller last wrote it (bound or unbound it)
        metadata["managedFields"] = [{"manager": "dual-pods-controller", "operation": "Update", "time": stamp(used)}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "status": {"conditions": conditions}}


class FakeCluster:
    """A fake of the launcher API (`LauncherApi`), of the informer cache (`LauncherCache`) and of where
    refusals go (`RefusalSink`).

    `pods` is the API server's state; `cache` is what the informer shows, a copy that tests refresh
    with `sync()`, so they can model an informer that lags. Deletes are immediate (no grace period)
    unless `graceful` is set. `conflicting` names Pods whose deletes answer 409; `patch_error`, when
    set, is what every label patch raises; `create_error`, what every create raises. `refusals` is what
    the reconcile reported, in order.
    """

    def __init__(self, *pods: dict[str, Any], nodes: Iterable[str] = (NODE,)) -> None:
        self.pods = {pod["metadata"]["name"]: copy.deepcopy(pod) for pod in pods}
        self.cache = copy.deepcopy(self.pods)
        self.nodes = set(nodes)
        self.events: list[tuple[str, str, str]] = []  # Warning Events: (pod, reason, message)
        self.notes: list[tuple[str, str, str]] = []  # Normal Events
        self.warm: dict[str, Warmth] = {}  # what each launcher's view reports asleep (none when absent)
        self.conflicting: set[str] = set()
        self.patch_error: ApiException | None = None
        self.create_error: ApiException | None = None
        self.refusals: list[tuple[LauncherKey, Refusal | None]] = []
        self.graceful = False
        self.creates = 0
        self.lists = 0
        self._serial = itertools.count(1)

    def sync(self, expectations: PendingExpectations | None = None) -> None:
        """The informer catches up, telling `expectations` what it sees, as the Populator's handler does."""
        if expectations is not None:
            cached = {p["metadata"]["uid"]: p for p in self.cache.values()}
            for pod in self.pods.values():
                key, uid = launcher_key(pod), pod["metadata"]["uid"]
                assert key is not None
                if uid not in cached:
                    expectations.observe_creation(key, uid)
                if "deletionTimestamp" in pod["metadata"]:
                    expectations.observe_deletion(key, uid)
            for uid in cached.keys() - {p["metadata"]["uid"] for p in self.pods.values()}:
                key = launcher_key(cached[uid])
                assert key is not None
                expectations.observe_deletion(key, uid)
        self.cache = copy.deepcopy(self.pods)

    def names(self) -> set[str]:
        return set(self.pods)

    # ----- LauncherCache

    def launchers(self, key: LauncherKey) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for p in self.cache.values() if launcher_key(p) == key]

    def has_node(self, name: str) -> bool:
        return name in self.nodes

    def warmth(self, pod: Pod) -> Warmth:
        return self.warm.get(pod["metadata"]["name"], Warmth())

    # ----- LauncherApi

    async def list_launchers(self, key: LauncherKey) -> list[dict[str, Any]]:
        self.lists += 1
        return [copy.deepcopy(p) for p in self.pods.values() if launcher_key(p) == key]

    async def create(self, pod: Pod) -> dict[str, Any]:
        if self.create_error is not None:
            raise self.create_error
        self.creates += 1
        created = copy.deepcopy(dict(pod))
        serial = next(self._serial)
        meta = created["metadata"]
        meta.update(name=f"{meta['generateName']}{serial}", uid=f"created-{serial}-uid", resourceVersion="1")
        meta["creationTimestamp"] = stamp(NOW)
        self.pods[meta["name"]] = created
        return copy.deepcopy(created)

    async def delete(self, pod: Pod) -> DeleteOutcome:
        name = pod["metadata"]["name"]
        stored = self.pods.get(name)
        if stored is None:
            return DeleteOutcome.GONE
        same = all(stored["metadata"][f] == pod["metadata"][f] for f in ("uid", "resourceVersion"))
        if name in self.conflicting or not same:
            return DeleteOutcome.CONFLICT
        if self.graceful:
            stored["metadata"]["deletionTimestamp"] = stamp(NOW)
        else:
            del self.pods[name]
        return DeleteOutcome.DELETED

    async def set_stuck_label(self, pod: Pod, stuck: bool) -> bool:
        stored = self.pods.get(pod["metadata"]["name"])
        if stored is None:
            return False
        if self.patch_error is not None:
            raise self.patch_error
        labels = stored["metadata"]["labels"]
        if stuck:
            labels[keys.LAUNCHER_STUCK_LABEL] = "true"
        else:
            labels.pop(keys.LAUNCHER_STUCK_LABEL, None)
        stored["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"]) + 1)
        return True

    async def warn(self, pod: Pod, reason: str, message: str) -> None:
        self.events.append((pod["metadata"]["name"], reason, message))

    async def note(self, pod: Pod, reason: str, message: str) -> None:
        self.notes.append((pod["metadata"]["name"], reason, message))

    # ----- RefusalSink

    async def refused(self, key: LauncherKey, refusal: Refusal | None) -> None:
        self.refusals.append((key, refusal))


class FakeMonotonic:
    """A monotonic clock that tests move by hand, for expectation timeouts."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reconciler(
    cluster: FakeCluster, digest: Digest, clock: FakeMonotonic | None = None
) -> tuple[KeyReconciler, PendingExpectations, CollectorRegistry]:
    """A KeyReconciler over the fakes, at `NOW`, with a fresh registry."""
    expectations = PendingExpectations(EXPECTATION_TIMEOUT, clock or FakeMonotonic())
    registry = CollectorRegistry()
    reconcile = KeyReconciler(
        digest,
        cluster,
        cluster,
        cluster,
        expectations,
        LauncherPodCount(registry),
        THRESHOLDS,
        recheck_after=EXPECTATION_TIMEOUT,
        clock=lambda: NOW,
    )
    return reconcile, expectations, registry
