"""The dual-pods controller: informers, the launchers' views, and the work queue, wired to the reconciler.
This module only decides *which* inference servers to look at after each change; `run_dual_pods` builds
the real collaborators (API server, launchers, requesters, model servers) and runs it all in one TaskGroup.
"""

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from api import keys, launcher_summary
from api.crds import InferenceServerConfig, LauncherConfig
from api.keys import GPU_MAP_CONFIGMAP
from api.log_format import ISC_FIELD, REQUESTER_FIELD
from api.token_file import TokenFile
from controller import pods
from controller.dualpods.binding import LAUNCHERS_BY_CONFIG_HASH
from controller.dualpods.collaborators import Clients
from controller.dualpods.devices import SliceDevices
from controller.dualpods.direct import GPU, NOMINAL
from controller.dualpods.drains import DEFAULT_TIMEOUT_S, DrainRewarmer
from controller.dualpods.isc_status import LAUNCHERS_BY_SUMMARY_ISC, REQUESTERS_BY_ISC, served, summary_iscs
from controller.dualpods.memory import Memory
from controller.dualpods.metrics import DualPodsMetrics
from controller.dualpods.nominal import gpu_keys
from controller.dualpods.outcomes import TimeBudget
from controller.dualpods.passes import Options, World
from controller.dualpods.phases import LAUNCHER_START_BUDGET, Phase
from controller.dualpods.placement.admission import Placement, PlacementOptions
from controller.dualpods.placement.announce import PlacementAnnouncer
from controller.dualpods.placement.choice import Result as Placed
from controller.dualpods.placement.choice import decided, opted_in_expression
from controller.dualpods.placement.claim_templates import KubeClaimTemplates
from controller.dualpods.placement.fleet import INDEXES, REQUESTERS_ON_NODE, FleetReader
from controller.dualpods.placement.webhook import Endpoint, serve_placement
from controller.dualpods.pools.keeper import PoolKeeper
from controller.dualpods.provider_client import ProviderClient
from controller.dualpods.reconcile import LAUNCHERS, Reconciler
from controller.dualpods.requester_client import RequesterClient
from controller.dualpods.requester_tokens import RequesterTokens
from controller.dualpods.snapshot import BOUND_TO, Caches
from controller.dualpods.writer import PodWriter
from controller.http import http_caller
from controller.instance_probe import InstanceProbe
from controller.launcher_client import LauncherClient
from controller.launcher_template import node_independent_pod
from controller.launcher_views import LauncherView, LauncherViews, ViewSource
from controller.status_writer import StatusWriter
from kube.client import custom_objects
from kube.events import EventRecorder
from kube.informer import Informer, Obj
from kube.passclock import timed
from kube.workqueue import DONE, Problem, Result, WorkQueue, run_workers

log = logging.getLogger(__name__)

DIRECT_REQUESTERS = "direct-requesters"
ISCS_BY_LAUNCHER_CONFIG = "iscs-by-launcher-config"
ISC_STATUS_SETTLE_S = 1.0  # an ISC status is written at most this often (its counts change in bursts)


class KeyKind(StrEnum):
    REQUESTER = "requester"
    ISC = "isc"
    ISC_STATUS = "isc-status"
    PLACEMENT = "placement"  # tell a requester where it was placed (its Event)


REQUESTER = KeyKind.REQUESTER
ISC = KeyKind.ISC
ISC_STATUS = KeyKind.ISC_STATUS


class Key(NamedTuple):
    """A work item: one inference server (by requester name), one ISC's instances, one ISC's status, or one
    requester's placement Event."""

    kind: KeyKind
    name: str


@dataclass
class DualPodsOptions:
    workers: int = 4
    launcher_token: TokenFile | None = None  # the bearer token launchers require, followed as its file changes
    launcher_token_secret: str | None = None  # the Secret holding it, mounted into launchers we create
    launcher_runtime_class: str | None = None  # given to launchers we create whose template names none
    sleeper_limit: int = 1  # direct providers that may sleep on one GPU (FMA's binary default)
    requester_tokens: RequesterTokens | None = None  # E15: the credential of calls that change requesters
    drain_rewarm_timeout_s: float = DEFAULT_TIMEOUT_S  # how long a drain waits for a launcher's sleepers to be copied
    launcher_start_budget_s: float = LAUNCHER_START_BUDGET.seconds  # a bound launcher not answering is then an error
    placement: Endpoint | None = None  # where the placement webhook is served (None: it is not)
    placement_default_on: bool = False  # requesters that say nothing, nor their ISC, are placed on sleepers


def kube_caches(api: client.ApiClient, namespace: str) -> Caches:
    """The informers the controller reads, over the API server (they list and watch once run)."""
    core = client.CoreV1Api(api)
    return Caches(
        pods=Informer("pods", functools.partial(core.list_namespaced_pod, namespace)),
        nodes=Informer("nodes", core.list_node),
        iscs=Informer("inferenceserverconfigs", custom_objects(api, namespace, InferenceServerConfig)),
        lcs=Informer("launcherconfigs", custom_objects(api, namespace, LauncherConfig)),
        configmaps=Informer(
            "configmaps",
            functools.partial(
                core.list_namespaced_config_map, namespace, field_selector=f"metadata.name={GPU_MAP_CONFIGMAP}"
            ),
        ),
    )


class DualPodsController:
    def __init__(
        self,
        namespace: str,
        caches: Caches,
        views: ViewSource,
        clients: Clients,
        metrics: DualPodsMetrics,
        options: DualPodsOptions,
    ) -> None:
        self.namespace = namespace
        self.options = options
        self.caches = caches
        self.views = views
        self.metrics = metrics
        self.queue: WorkQueue[Key] = WorkQueue("dual-pods", observe_wait=self._observe_queue_wait)
        self.isc_status_settle_s = ISC_STATUS_SETTLE_S
        index = caches.pods.add_index
        index(BOUND_TO, _bound_to)
        index(LAUNCHERS_BY_CONFIG_HASH, _launcher_config_hash)
        index(REQUESTERS_BY_ISC, _requester_isc)
        index(LAUNCHERS_BY_SUMMARY_ISC, summary_iscs)
        index(LAUNCHERS, lambda p: ["true"] if pods.is_launcher(p) else [])
        index(NOMINAL, _nominal_hash)
        index(GPU, gpu_keys)
        index(DIRECT_REQUESTERS, _direct_requester)
        for name, function in INDEXES.items():
            index(name, function)
        caches.iscs.add_index(ISCS_BY_LAUNCHER_CONFIG, lambda isc: [_launcher_config_name(isc)])
        options_ = Options(options.launcher_token_secret, options.launcher_runtime_class, options.sleeper_limit)
        self.reconciler = Reconciler(
            World(namespace, caches, views, clients, Memory(), metrics, options_),
            {Phase.LAUNCHER_STARTING: TimeBudget(seconds=options.launcher_start_budget_s)},
        )
        self.drains = DrainRewarmer(namespace, caches, views, clients, options.drain_rewarm_timeout_s)
        placement = PlacementOptions(
            options.placement_default_on, options.launcher_token_secret, options.launcher_runtime_class
        )
        self.placement = Placement(
            FleetReader(namespace, caches, views),
            placement,
            clients.claim_templates,
            on_decision=lambda d: metrics.placements.labels(namespace, d.result.value).inc(),
        )
        for result in Placed:  # every result a series from the start, so that a rate of 0 reads as 0, not absent
            metrics.placements.labels(namespace, result.value)
        self.announcer = PlacementAnnouncer(namespace, caches.pods, clients.events)
        self.pools = PoolKeeper(
            namespace, caches, views, clients, metrics, self.placement.reservations.current,
            self.reconciler.memory.pools, self._enqueue_isc_status,
            lambda lc: node_independent_pod(lc, options.launcher_token_secret, options.launcher_runtime_class)[1],
        )  # fmt: skip
        self.synced = asyncio.Event()  # the caches hold a full list: decisions read them from here on
        self.opt_ins_changed = asyncio.Event()  # an ISC's placement annotation changed: the webhook's condition too
        caches.pods.subscribe(self._count_requesters)
        caches.iscs.subscribe(self._count_iscs)
        caches.pods.subscribe(self._pod_changed)
        caches.pods.subscribe(self._forget_deleted_pod)
        caches.nodes.subscribe(self._node_changed)
        caches.iscs.subscribe(self._isc_changed)
        caches.lcs.subscribe(self._lc_changed)
        caches.configmaps.subscribe(self._gpu_map_changed)
        views.subscribe(self._launcher_changed, self._launcher_listed)

    def _informers(self) -> list[Informer]:
        c = self.caches
        return [c.pods, c.nodes, c.iscs, c.lcs, c.configmaps]

    async def run(self) -> None:
        """The informers, and once they have synced the workers, until cancelled."""
        try:
            async with asyncio.TaskGroup() as tasks:
                for informer in self._informers():
                    tasks.create_task(informer.run())
                await asyncio.gather(*(i.synced.wait() for i in self._informers()))
                log.info("caches synced; %d pods, %d nodes", len(self.caches.pods.items()),
                         len(self.caches.nodes.items()))  # fmt: skip
                self.synced.set()
                process = timed(self._process, self.metrics.reconcile_own_seconds, lambda key: key.kind.value)
                tasks.create_task(run_workers(self.queue, process, self.options.workers, _key_fields))
                tasks.create_task(self.drains.run())
                tasks.create_task(self.pools.run())
        finally:
            for queue in (self.queue, self.drains.queue, self.pools.queue):
                queue.shutdown()

    async def _process(self, key: Key) -> Result:
        started = time.monotonic()
        node = self._node_of(key)
        try:
            result = await self._reconcile(key)
        except Exception:
            self.metrics.queue_retries.labels(node).inc()
            raise
        finally:
            self.metrics.queue_work_seconds.labels(node).observe(time.monotonic() - started)
            self.metrics.queue_depth.labels(node).set(len(self.queue))
        if isinstance(result, Problem) and result.retry:  # backed off too (workqueue.py)
            self.metrics.queue_retries.labels(node).inc()
        return result

    async def _reconcile(self, key: Key) -> Result:
        if key.kind is KeyKind.REQUESTER:
            return await self.reconciler.reconcile_requester(key.name)
        if key.kind is KeyKind.ISC_STATUS:
            return await self.reconciler.reconcile_isc_status(key.name)
        if key.kind is KeyKind.PLACEMENT:
            await self.announcer.announce(key.name)
            return DONE
        return await self.reconciler.reconcile_isc(key.name)

    def _observe_queue_wait(self, key: Key, seconds: float) -> None:
        self.metrics.queue_wait_seconds.labels(self._node_of(key)).observe(seconds)

    def _node_of(self, key: Key) -> str:
        pod = self.caches.pods.get(f"{self.namespace}/{key.name}") if key.kind is KeyKind.REQUESTER else None
        return (pods.node_name(pod) if pod else None) or ""

    def _enqueue(self, key: Key, after: float = 0.0) -> None:
        node = self._node_of(key)
        self.metrics.queue_adds.labels(node).inc()
        self.metrics.queue_retries.labels(node)  # 0 until a retry, as client-go's queue metrics are
        self.queue.add_after(key, after)

    def _enqueue_isc_status(self, isc: str) -> None:
        """An ISC's status counts its requesters and instances, which change by the hundred in a wave: it is
        computed ISC_STATUS_SETTLE_S after the first change, once for all the changes meanwhile."""
        self._enqueue(Key(KeyKind.ISC_STATUS, isc), after=self.isc_status_settle_s)

    def _enqueue_requester(self, name: str) -> None:
        self._enqueue(Key(KeyKind.REQUESTER, name))

    def _enqueue_requesters_on(self, node: str | None, *, serving_too: bool = True) -> None:
        """The requesters of a Node; `serving_too=False` leaves out those whose last pass found their instance
        serving: a spare provider's change matters to requesters that bind, make room or wake, not to one
        that its instance serves (that pass reads its own provider alone)."""
        phases = self.reconciler.memory.phases
        for requester in self.caches.pods.by_index(REQUESTERS_ON_NODE, node or ""):
            if serving_too or phases.get(pods.name(requester)) != Phase.SERVING:
                self._enqueue_requester(pods.name(requester))

    # ----- which inference servers a change concerns

    def _pod_changed(self, old: Obj | None, new: Obj | None) -> None:
        if _service_facts(old) != _service_facts(new):
            for isc in {name for pod in (old, new) if pod is not None for name in _requester_isc(pod)}:
                self._enqueue_isc_status(isc)
        if launcher_summary.annotation_on(old) != launcher_summary.annotation_on(
            new
        ):  # its instances' counts may have changed
            for isc in {name for pod in (old, new) if pod is not None for name in summary_iscs(pod)}:
                self._enqueue_isc_status(isc)
        if new is not None and pods.is_requester(new) and (decision := decided(new)) is not None:
            if decision.spot is not None:
                self.placement.reservations.release(decision.spot)
            if self.announcer.should_tell(new):
                self._enqueue(Key(KeyKind.PLACEMENT, pods.name(new)))
        for pod in (p for p in (old, new) if p is not None):
            if pods.is_requester(pod):
                self._enqueue_requester(pods.name(pod))
            binding = pods.binding(pod)
            if binding is not None:
                self._enqueue_requester(binding.requester_name)
            elif pods.is_launcher(pod) or pods.is_direct_provider(pod):
                self._enqueue_requesters_on(pods.node_name(pod), serving_too=False)
        if new is not None and pods.is_launcher(new):
            running = pods.container_running(new) and not pods.is_failed(new)
            # A restarted container is a new launcher process: its view starts afresh.
            signature = pods.annotations(new).get(keys.INSTANCE_SIGNATURE_ANNOTATION)
            self.views.track(pods.name(new), pods.pod_ip(new) if running else None, _incarnation(new), signature)
        elif old is not None and new is None and pods.is_launcher(old):
            self.views.forget(pods.name(old))

    def _launcher_changed(self, launcher: str) -> None:
        pod = self.caches.pods.get(f"{self.namespace}/{launcher}")
        if pod is None:
            return
        binding = pods.binding(pod)
        if binding is not None:
            self._enqueue_requester(binding.requester_name)
        else:
            self._enqueue_requesters_on(pods.node_name(pod), serving_too=False)

    def _launcher_listed(self, launcher: str, view: LauncherView) -> None:
        """A launcher's instances seen in full: check those of each ISC for obsolescence (an ISC may
        have changed while this controller was not watching)."""
        for isc in {(s.annotations or {}).get(keys.INSTANCE_ISC_NAME) for s in view.instances.values()} - {None}:
            self._enqueue(Key(KeyKind.ISC, str(isc)))

    def _node_changed(self, old: Obj | None, new: Obj | None) -> None:
        if old is not None and new is not None and _node_facts(old) == _node_facts(new):
            return  # a heartbeat, a condition, an image list: nothing a reconcile reads
        self._enqueue_requesters_on(pods.name(new or old or {"metadata": {"name": ""}}))

    def _isc_changed(self, old: Obj | None, new: Obj | None) -> None:
        name = pods.name(new or old or {"metadata": {"name": ""}})
        if old is None or new is None or _placement_of(old) != _placement_of(new):
            self.opt_ins_changed.set()
        if old is None or new is None or _read_facts(old) != _read_facts(new):  # not its status alone
            self._enqueue_requesters_of(name)
        if new is not None:
            self._enqueue_isc_status(name)
        if old is not None and (new is None or old.get("spec") != new.get("spec")):
            self._enqueue(Key(KeyKind.ISC, name))

    def opted_in(self) -> str:
        """The placement webhook's match condition (choice.opted_in_expression) for the ISCs there are now."""
        values = {
            pods.name(isc): value
            for isc in self.caches.iscs.items()
            if (value := pods.annotations(isc).get(keys.PLACEMENT_ANNOTATION)) is not None
        }
        return opted_in_expression(values, self.options.placement_default_on)

    def _gpu_map_changed(self, old: Obj | None, new: Obj | None) -> None:
        """Direct requesters wait for their GPUs to be in the map (FMA re-enqueues all requesters)."""
        for requester in self.caches.pods.by_index(DIRECT_REQUESTERS, "true"):
            self._enqueue_requester(pods.name(requester))

    def _lc_changed(self, old: Obj | None, new: Obj | None) -> None:
        if old is not None and new is not None and _read_facts(old) == _read_facts(new):
            return  # its status alone: the populator's counts
        name = pods.name(new or old or {"metadata": {"name": ""}})
        for isc in self.caches.iscs.by_index(ISCS_BY_LAUNCHER_CONFIG, name):
            self._enqueue_requesters_of(pods.name(isc))
            self._enqueue_isc_status(pods.name(isc))

    def _enqueue_requesters_of(self, isc: str) -> None:
        for requester in self.caches.pods.by_index(REQUESTERS_BY_ISC, isc):
            self._enqueue_requester(pods.name(requester))

    # ----- FMA's object counts

    def _count_requesters(self, old: Obj | None, new: Obj | None) -> None:
        """`fma_requester_count` of each ISC the changed Pod names (kept at 0 once none do, as FMA's)."""
        for isc in {name for pod in (old, new) if pod is not None for name in _requester_isc(pod)}:
            self.metrics.requester_count.labels(isc).set(self.caches.pods.count(REQUESTERS_BY_ISC, isc))

    def _forget_deleted_pod(self, old: Obj | None, new: Obj | None) -> None:
        """A deleted requester's or provider's fma_duality series go with it."""
        if old is not None and new is None:
            self.metrics.forget_pod(self.namespace, pods.name(old))
            self.announcer.forget(old)

    def _count_iscs(self, old: Obj | None, new: Obj | None) -> None:
        """`fma_isc_count` of the LauncherConfig(s) the changed ISC names."""
        for lc in {_launcher_config_name(isc) for isc in (old, new) if isc is not None}:
            count = self.caches.iscs.count(ISCS_BY_LAUNCHER_CONFIG, lc)
            self.metrics.isc_count.labels(lc).set(count)


async def run_dual_pods(
    api: client.ApiClient, namespace: str, options: DualPodsOptions, registry: CollectorRegistry
) -> None:
    """The controller with its real collaborators, until cancelled."""
    metrics = DualPodsMetrics(registry)
    async with http_caller(metrics.http_latency_seconds, namespace) as http:
        launchers = LauncherClient(http, options.launcher_token)
        views = LauncherViews(launchers, prober=InstanceProbe(http))
        clients = Clients(
            pods=PodWriter(api, namespace),
            launchers=launchers,
            requesters=RequesterClient(http, options.requester_tokens),
            servers=ProviderClient(http),
            events=EventRecorder(api, "dual-pods-controller"),
            statuses=StatusWriter(client.CustomObjectsApi(api), namespace),
            devices=SliceDevices(api),
            claim_templates=KubeClaimTemplates(api),
        )
        controller = DualPodsController(namespace, kube_caches(api, namespace), views, clients, metrics, options)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(views.run())
            tasks.create_task(controller.run())
            if options.placement is not None:
                await controller.synced.wait()
                tasks.create_task(
                    serve_placement(
                        api, controller.placement, options.placement, controller.opted_in, controller.opt_ins_changed
                    )
                )


def _key_fields(key: Key) -> dict[str, str]:
    """A work item's log fields: the object its pass is about (`requester=`, `isc=`)."""
    return {ISC_FIELD if key.kind in (ISC, ISC_STATUS) else REQUESTER_FIELD: key.name}


def _incarnation(pod: Obj) -> tuple[str, int]:
    """Which run of the launcher's container this is: its Pod and its restart count."""
    return pods.uid(pod), pods.restart_count(pod)


def _node_facts(node: Obj) -> tuple[bool, bool]:
    """What the reconciler reads of a Node besides its existence: being deleted, being cordoned."""
    return pods.is_deleting(node), pods.is_unschedulable(node)


_WRITE_BOOKKEEPING = frozenset({"resourceVersion", "managedFields"})


def _read_facts(obj: Obj) -> tuple[Obj, Obj]:
    """What the passes read of an ISC or a LauncherConfig: its metadata and its spec, not its status, which
    a controller writes once a second in a wave (this one an ISC's, the populator a LauncherConfig's; each
    write would queue every requester of them). A status write changes the metadata's resourceVersion and
    managedFields too (the time of the status manager's entry): left out."""
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _WRITE_BOOKKEEPING}
    return metadata, obj.get("spec") or {}


def _service_facts(pod: Obj | None) -> tuple[tuple[str, ...], bool] | None:
    """What an ISC's status reads of a requester: which ISC it names, whether it is served (None: no such Pod)."""
    if pod is None or not pods.is_requester(pod):
        return None
    return tuple(_requester_isc(pod)), served(pod)


def _placement_of(isc: Obj) -> str | None:
    return pods.annotations(isc).get(keys.PLACEMENT_ANNOTATION)


def _launcher_config_name(isc: Obj) -> str:
    return str((isc.get("spec") or {}).get("launcherConfigName", ""))


def _bound_to(pod: Obj) -> list[str]:
    binding = pods.binding(pod)
    return [binding.requester_name] if binding else []


def _launcher_config_hash(pod: Obj) -> list[str]:
    value = pods.annotations(pod).get(keys.LAUNCHER_CONFIG_HASH_ANNOTATION)
    return [value] if value and pods.is_launcher(pod) else []


def _nominal_hash(pod: Obj) -> list[str]:
    value = pods.annotations(pod).get(keys.NOMINAL_ANNOTATION)
    return [value] if value else []


def _direct_requester(pod: Obj) -> list[str]:
    return ["true"] if keys.SERVER_PATCH_ANNOTATION in pods.annotations(pod) else []


def _requester_isc(pod: Obj) -> list[str]:
    value = pods.annotations(pod).get(keys.INFERENCE_SERVER_CONFIG_ANNOTATION)
    return [value] if value else []
