"""The launcher-population controller (FMA's launcher-populator), wired: informers, queues, workers.

Five informers feed two queues. The digest queue has one worker, the digest's only writer: it turns
LauncherConfig, policy, Node and ResourceSlice changes (the devices DRA drivers publish for a Node, which
`draDevices` selectors read) into the digest and into those objects' statuses (status.py), and
adds the keys whose target changed to the key queue; a launcher Pod change adds its own key, and the
policies naming its LauncherConfig when it came, went, or changed readiness, schedulability or stuckness.
The key queue's workers reconcile one (Node, LauncherConfig) key at a time each. Nothing polls: a key is
looked at again only when something it depends on changes, or when one of its launchers will cross a stuck
threshold. A key whose launchers the API server refuses is reported on the policies asking for it (a
Warning Event when the refusal is new, their Ready condition while it lasts).
"""

import asyncio
import functools
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, NamedTuple

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from api import keys, launcher_summary
from api.crds import LauncherConfig, LauncherPopulationPolicy
from api.token_file import TokenFile
from controller import pods
from controller.http import http_caller
from controller.instance_probe import InstanceProbe
from controller.launcher_client import LauncherClient
from controller.launcher_template import Pod
from controller.launcher_views import LauncherViews, ViewSource
from controller.populator.digest import Digest, digest_config, digest_policy
from controller.populator.expectations import PendingExpectations
from controller.populator.key import LauncherKey, key_fields, launcher_key, selector
from controller.populator.kubeapi import COMPONENT, KubeLauncherApi
from controller.populator.metrics import LauncherPodCount
from controller.populator.nodes import NodeFacts
from controller.populator.phases import Thresholds, scheduled_at, template_hash
from controller.populator.reconcile import KeyReconciler
from controller.populator.refusals import Refusal
from controller.populator.status import config_status, policy_status
from controller.populator.warmth import Warmth
from controller.status_writer import StatusWriter
from kube import events
from kube.client import custom_objects
from kube.events import EventRecorder
from kube.informer import Informer, Obj
from kube.passclock import own_seconds_histogram, timed
from kube.workqueue import DONE, Result, WorkQueue, run_workers

log = logging.getLogger(__name__)

BY_KEY = "key"
BY_CONFIG = "config"
BY_NODE = "node"
# A LauncherConfig's instance counts (its status) follow its launchers' summaries within this, and a policy's
# readiness its launchers' readiness: a wave writes a summary onto every launcher (and a population makes
# thousands Ready), and each recount reads all of them, so they are recounted once per settle time, not once
# per change (1,000 launchers: about 830 summary writes in 22 s of the benchmark's idle phase).
COUNTS_SETTLE_S = 1.0


@dataclass
class PopulatorOptions:
    workers: int = 4
    """Workers reconciling (Node, LauncherConfig) keys."""
    expectation_timeout: float = 5.0
    """Seconds to wait for the cache to show a create or delete before listing from the API server."""
    stuck_scheduling_threshold: float = 120.0
    """Seconds an unscheduled launcher may take before it is stuck_scheduling."""
    stuck_starting_threshold: float = 450.0
    """Seconds a scheduled launcher may take to become Ready before it is stuck_starting."""
    launcher_token_secret: str | None = None
    """Secret holding the launchers' API token, mounted into every launcher Pod (E9)."""
    launcher_runtime_class: str | None = None
    """The RuntimeClass given to launcher Pods whose template names none."""
    launcher_token: TokenFile | None = None
    """The launchers' API token, to read their instances (which launcher holds the least warm state); followed
    as its file changes."""


class DigestItem(NamedTuple):
    kind: Literal["config", "policy", "node"]
    name: str


class Populator:
    """The controller; it also serves the reconcile as its `LauncherCache`."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        options: PopulatorOptions,
        registry: CollectorRegistry,
        views: ViewSource,
    ) -> None:
        core = client.CoreV1Api(api)
        self._views = views
        self._summaries = launcher_summary.ParsedSummaries()
        self._namespace = namespace
        self._options = options
        self._pods = Informer(
            "launcher-pods", functools.partial(core.list_namespaced_pod, namespace), label_selector=selector()
        )
        self._pods.add_index(BY_KEY, lambda pod: [str(key)] if (key := launcher_key(pod)) else [])
        self._pods.add_index(BY_CONFIG, lambda pod: [key.config] if (key := launcher_key(pod)) else [])
        self._nodes = Informer("nodes", core.list_node)
        self._resource = client.ResourceV1Api(api)
        self._slices = Informer("resourceslices", self._resource.list_resource_slice)
        self._slices.add_index(BY_NODE, lambda s: [n] if (n := (s.get("spec") or {}).get("nodeName")) else [])
        self._configs = Informer("launcherconfigs", custom_objects(api, namespace, LauncherConfig))
        self._policies = Informer(
            "launcherpopulationpolicies", custom_objects(api, namespace, LauncherPopulationPolicy)
        )
        self._digest = Digest()
        self._digest_queue: WorkQueue[DigestItem] = WorkQueue("populator-digest")
        self._key_queue: WorkQueue[LauncherKey] = WorkQueue("populator-keys")
        self._expectations = PendingExpectations(options.expectation_timeout)
        self._metrics = LauncherPodCount(registry)
        self._own_seconds = own_seconds_histogram(registry)
        self._status = StatusWriter(client.CustomObjectsApi(api), namespace)
        self._events = EventRecorder(api, COMPONENT)
        self._refusals: dict[LauncherKey, Refusal] = {}
        self._reconcile = KeyReconciler(
            self._digest,
            self,
            KubeLauncherApi(core, self._events, namespace),
            self,
            self._expectations,
            self._metrics,
            Thresholds(options.stuck_scheduling_threshold, options.stuck_starting_threshold),
            recheck_after=options.expectation_timeout,
        )
        self._pods.subscribe(self._on_pod)
        self._nodes.subscribe(self._on_node)
        self._slices.subscribe(self._on_slice)
        self._configs.subscribe(lambda old, new: self._on_object("config", old, new))
        self._policies.subscribe(lambda old, new: self._on_object("policy", old, new))

    async def run(self) -> None:
        """Run the informers and, once they have synced and the digest is built, the workers; until cancelled."""
        informers: tuple[Informer, ...] = (self._pods, self._nodes, self._configs, self._policies)
        if await self._slices_readable():
            informers = (*informers, self._slices)
        log.info("launcher populator starting in namespace %s with %s", self._namespace, self._options)
        try:
            async with asyncio.TaskGroup() as tasks:
                for informer in informers:
                    tasks.create_task(informer.run())
                await asyncio.gather(*(informer.synced.wait() for informer in informers))
                # The whole digest first, so no key is reconciled against a partial policy picture.
                for node in self._nodes.items():
                    self._update_node(node["metadata"]["name"])
                for config in self._configs.items():
                    self._update_config(config["metadata"]["name"])
                for policy in self._policies.items():
                    self._update_policy(policy["metadata"]["name"])
                log.info("launcher populator synced: %d launcher Pods", len(self._pods.items()))
                own = self._own_seconds
                digest = timed(self._process, own, lambda item: item.kind)
                tasks.create_task(run_workers(self._digest_queue, digest, 1, lambda item: {item.kind: item.name}))
                reconcile = timed(self._reconcile, own, lambda key: "launchers")
                tasks.create_task(run_workers(self._key_queue, reconcile, self._options.workers, key_fields))
        finally:
            self._digest_queue.shutdown()
            self._key_queue.shutdown()

    async def _slices_readable(self) -> bool:
        """Whether ResourceSlices can be watched: not on Kubernetes before 1.34 (no resource.k8s.io/v1), nor
        where the controllers' Node-reading ClusterRole (an admin's `global.nodeViewClusterRole`) does not grant
        them. Without them, `draDevices` selectors select no Node, and the populator says so once."""
        try:
            await self._resource.list_resource_slice(limit=1)
        except ApiException as error:
            if error.status not in (403, 404):
                raise
            log.warning("cannot list ResourceSlices (%s %s): draDevices selects no Node", error.status, error.reason)
            return False
        return True

    # ----- the cache, as the key reconcile reads it

    def launchers(self, key: LauncherKey) -> list[Pod]:
        return self._pods.by_index(BY_KEY, str(key))

    def has_node(self, name: str) -> bool:
        return self._nodes.get(name) is not None

    def warmth(self, pod: Pod) -> Warmth:
        return Warmth.of(self._views.get(pod["metadata"]["name"]))

    # ----- refusals, as the key reconcile reports them

    async def refused(self, key: LauncherKey, refusal: Refusal | None) -> None:
        """Show a change of the key's refusal on every policy asking for its launchers: their status, and a
        Warning Event for a new refusal (a refusal seen again on a retry is not repeated)."""
        if self._refusals.get(key) == refusal:
            return
        if refusal is None:
            del self._refusals[key]
            log.info("%s: launchers can be created again", key)
        else:
            self._refusals[key] = refusal
            log.warning("%s: the API server refuses its launchers (%s): %s", key, refusal.reason, refusal.message)
        for name in self._digest.policies_naming(key.config):
            if key not in self._digest.policy_asks(name):
                continue
            self._digest_queue.add(DigestItem("policy", name))
            policy = self._policies.get(f"{self._namespace}/{name}")
            if refusal is not None and policy is not None:
                where = f"LauncherConfig {key.config} on node {key.node}"
                await events.warn(
                    self._events, policy, refusal.reason, f"cannot create a launcher of {where}: {refusal.message}"
                )

    # ----- informer events

    def _on_pod(self, old: Obj | None, new: Obj | None) -> None:
        if new is not None and (key := launcher_key(new)) is not None:
            self._expectations.observe_creation(key, new["metadata"]["uid"])
            if pods.is_deleting(new):
                self._expectations.observe_deletion(key, new["metadata"]["uid"])
        elif new is None and old is not None and (key := launcher_key(old)) is not None:
            self._expectations.observe_deletion(key, old["metadata"]["uid"])
        if _key_facts(old) != _key_facts(new):
            for pod in (old, new):
                if pod is not None and (key := launcher_key(pod)) is not None:
                    self._key_queue.add(key)
        if new is not None:
            running = pods.container_running(new) and not pods.is_failed(new)
            incarnation = (new["metadata"]["uid"], pods.restart_count(new))
            self._views.track(new["metadata"]["name"], pods.pod_ip(new) if running else None, incarnation)
        elif old is not None:
            self._views.forget(old["metadata"]["name"])
            self._summaries.forget(old["metadata"]["name"])
        configs = {key.config for pod in (old, new) if pod is not None and (key := launcher_key(pod))}
        if _population_facts(old) != _population_facts(new):
            for config in configs:  # a policy's readiness reads all its launchers: recomputed once they settle
                for policy in self._digest.policies_naming(config):
                    self._digest_queue.add_after(DigestItem("policy", policy), COUNTS_SETTLE_S)
        if launcher_summary.annotation_on(old) != launcher_summary.annotation_on(new):
            for config in configs:  # its instance counts may have changed: recounted once the writes settle
                self._digest_queue.add_after(DigestItem("config", config), COUNTS_SETTLE_S)

    def _on_node(self, old: Obj | None, new: Obj | None) -> None:
        if old is None or new is None or NodeFacts.from_k8s(old) != NodeFacts.from_k8s(new):
            self._digest_queue.add(DigestItem("node", (new or old or {})["metadata"]["name"]))

    def _on_slice(self, old: Obj | None, new: Obj | None) -> None:
        for each in (old, new):
            if each is not None and (node := (each.get("spec") or {}).get("nodeName")):
                self._digest_queue.add(DigestItem("node", node))

    def _on_object(self, kind: Literal["config", "policy"], old: Obj | None, new: Obj | None) -> None:
        self._digest_queue.add(DigestItem(kind, (new or old or {})["metadata"]["name"]))

    # ----- digesting (the digest worker only)

    async def _process(self, item: DigestItem) -> Result:
        now = datetime.now(UTC)
        match item.kind:
            case "config":
                config = self._update_config(item.name)
                if config is not None:
                    summaries = map(self._summaries.of_pod, self._pods.by_index(BY_CONFIG, item.name))
                    error = self._digest.config_error(item.name)
                    await self._status.write(LauncherConfig, config, config_status(config, error, summaries, now))
            case "policy":
                policy = self._update_policy(item.name)
                if policy is not None:
                    problems, asks = self._digest.policy_problems(item.name), self._digest.policy_asks(item.name)
                    status = policy_status(policy, problems, asks, self.launchers, self._refusals, now)
                    await self._status.write(LauncherPopulationPolicy, policy, status)
            case "node":
                self._update_node(item.name)
        return DONE

    def _update_config(self, name: str) -> Obj | None:
        config = self._configs.get(f"{self._namespace}/{name}")
        # One being deleted counts as missing: no new launchers for it, and the old ones are left to the
        # garbage collector (or, orphaned, to the user).
        digest = None
        if config is not None and not pods.is_deleting(config):
            digest = digest_config(config, self._options.launcher_token_secret, self._options.launcher_runtime_class)
        if self._digest.set_config(name, digest):
            state = "missing or being deleted" if digest is None else digest.error or f"template {digest.template_hash}"
            log.info("LauncherConfig %s: %s", name, state)
            for policy in self._digest.policies_naming(name):
                self._digest_queue.add(DigestItem("policy", policy))
            launchers = {key for pod in self._pods.by_index(BY_CONFIG, name) if (key := launcher_key(pod))}
            for key in self._digest.keys_for_config(name) | launchers:
                self._key_queue.add(key)
        self._metrics.set_config_exists(name, config is not None)
        return config

    def _update_policy(self, name: str) -> Obj | None:
        policy = self._policies.get(f"{self._namespace}/{name}")
        for key in self._digest.set_policy(name, digest_policy(policy) if policy is not None else None):
            self._key_queue.add(key)
        return policy

    def _update_node(self, name: str) -> None:
        node = self._nodes.get(name)
        facts = NodeFacts.from_k8s(node, self._slices.by_index(BY_NODE, name)) if node is not None else None
        changed = self._digest.set_node(name, facts)
        for key in changed:
            self._key_queue.add(key)
        for config in {key.config for key in changed}:  # what the policies ask for changed with the keys
            for policy in self._digest.policies_naming(config):
                self._digest_queue.add(DigestItem("policy", policy))


async def run_populator(
    api: client.ApiClient, namespace: str, options: PopulatorOptions, registry: CollectorRegistry
) -> None:
    """The populator with the launchers' views it reads their sleepers from, until cancelled."""
    async with http_caller(None, namespace) as http:
        # The prober learns the sleepers of launchers that speak only FMA's API (Warmth reads them).
        views = LauncherViews(LauncherClient(http, options.launcher_token), prober=InstanceProbe(http))
        populator = Populator(api, namespace, options, registry, views)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(views.run())
            tasks.create_task(populator.run())


def _population_facts(pod: Obj | None) -> tuple[bool, bool, bool, str | None] | None:
    """What a policy's readiness reads of a launcher: it exists, is being deleted, is Ready, is stuck, why the
    scheduler cannot place it."""
    if pod is None:
        return None
    stuck = pods.labels(pod).get(keys.LAUNCHER_STUCK_LABEL) == "true"
    return pods.is_deleting(pod), pods.is_ready(pod), stuck, pods.unschedulable(pod)


def _key_facts(pod: Obj | None) -> tuple[object, ...] | None:
    """What a key's reconcile decides on of a launcher (reconcile.py, phases.py, stuck.py): which Pod it is, its
    binding, template, readiness, scheduling and stuckness. The dual-pods controller's other writes (instance
    summaries, routing and warm labels) change none of them and queue no pass; the reconcile reads the rest
    (its sleepers, their last use) from the cache when something else brings it."""
    if pod is None:
        return None
    return (
        _population_facts(pod),
        pods.uid(pod),
        pods.binding(pod),
        template_hash(pod),
        scheduled_at(pod),
        launcher_key(pod),
    )
