"""The pool keeper: keeps each InferenceServerConfig's warm pool (`spec.warmPool`) at its declared count of sleeping
copies, in the dual-pods controller (so on the leader only). One work item per ISC with a pool.

A pass reads the fleet from the controller's caches and launcher views (nothing is asked of the API server), plans
(plan.py) and makes the launcher calls the plan says: create copies, put loaded ones to sleep, delete those a
requester's GPUs or a budget end. What it found is kept as the pool's `Filling` (plan.py's verdict and counts) for
the ISC's status pass, which writes `status.pool` and the `PoolReady` condition, and in the metrics
`dualpods_pool_sleepers` and `dualpods_pool_declared`. An Event on the ISC says when the pool cannot be filled
(`PoolUnfillable`, with why) and when it is full again (`PoolFilled`).

Any change of a launcher's instances, a Pod or a Node may free or take a GPU: it queues every pool again, after
SETTLE_S, once for all the changes meanwhile. A cluster with no pool declared queues nothing and costs nothing.
"""

import logging
from collections.abc import Callable, Iterable, Mapping

from api import keys
from api.crds import InferenceServerConfig, LauncherConfig
from api.log_format import ISC_FIELD
from controller import pods
from controller.dualpods.collaborators import Clients
from controller.dualpods.copies import CARRY_OUT_FAILURES, LauncherFacts, carry_out, launcher_ip
from controller.dualpods.identity import runtime_of
from controller.dualpods.metrics import DualPodsMetrics
from controller.dualpods.placement.choice import Spot
from controller.dualpods.placement.fleet import FleetReader, NodeUse
from controller.dualpods.pools.filling import Filling, Verdict
from controller.dualpods.pools.plan import NodeFacts, PoolPlan, plan_pool
from controller.dualpods.reconcile import LAUNCHERS
from controller.dualpods.snapshot import Caches, parse
from controller.http import HttpError
from controller.launcher_template import TemplateError, launcher_config_hash
from controller.launcher_views import ViewSource
from kube import events
from kube.informer import Obj
from kube.workqueue import DONE, Problem, Result, Wait, WorkQueue, pass_context, run_workers

log = logging.getLogger(__name__)

SETTLE_S = 0.5  # a burst of changes (a wave's binds) queues each pool once
LOADING_RECHECK_S = 5.0  # while copies load (their events bring the pass sooner)


class PoolKeeper:
    def __init__(
        self,
        namespace: str,
        caches: Caches,
        views: ViewSource,
        clients: Clients,
        metrics: DualPodsMetrics,
        reserved: Callable[[], list[Spot]],
        fillings: dict[str, Filling],
        filled: Callable[[str], None],
        template: Callable[[LauncherConfig], str],
    ) -> None:
        """`reserved`: spots promised at admission (placement); `fillings`: where each pool's last Filling is kept
        (the ISC status pass reads it); `filled(isc)`: a pool's Filling changed (its status is due); `template(lc)`:
        the template hash of launchers made from `lc` now."""
        self.namespace = namespace
        self.caches = caches
        self.views = views
        self.clients = clients
        self.metrics = metrics
        self.fleet = FleetReader(namespace, caches, views)
        self.reserved = reserved
        self.filled = filled
        self.template = template
        self.fillings = fillings
        # The verdict each pool's last Event told: a pool that could not be filled is announced filled once it is,
        # however many passes it spent loading between the two.
        self.told: dict[str, Verdict] = {}
        self.queue: WorkQueue[str] = WorkQueue("pools")
        views.subscribe(self._anything_changed, lambda _launcher, _view: self._anything_changed())
        caches.pods.subscribe(lambda old, new: self._anything_changed())
        caches.nodes.subscribe(self._node_changed)
        caches.iscs.subscribe(self._isc_changed)

    async def run(self) -> None:
        await run_workers(self.queue, self.reconcile, workers=1, fields=lambda name: {ISC_FIELD: name})

    async def reconcile(self, name: str) -> Result:
        with pass_context(**{ISC_FIELD: name}):
            return await self._reconcile(name)

    async def _reconcile(self, name: str) -> Result:
        isc = parse(InferenceServerConfig, self.caches.iscs, self.namespace, name).value
        if isc is None or isc.spec.warm_pool is None:
            self._forget(name)
            return DONE
        lc = parse(LauncherConfig, self.caches.lcs, self.namespace, isc.spec.launcher_config_name).value
        try:
            runtime = runtime_of({}, isc.metadata.annotations)
            template_hash = self.template(lc) if lc is not None else None
        except (ValueError, TemplateError):
            template_hash = None  # the ISC's status says what is wrong with it or its LauncherConfig
        launchers, uses = (
            self._launchers(lc, template_hash) if lc is not None and template_hash is not None else ([], {})
        )
        plan = plan_pool(isc, runtime, launchers, self._nodes(isc, uses), _copy_bytes(name, launchers))
        try:
            await self._act(name, plan)
        except CARRY_OUT_FAILURES as err:
            return Problem.of(f"pool of {name}: {err}")  # backed off, and planned afresh
        await self._record(isc, plan)
        return Wait(LOADING_RECHECK_S, "copies loading") if plan.loading or plan.creates else DONE

    async def _act(self, name: str, plan: PoolPlan) -> None:
        await carry_out(self.clients, self._ip, self.views, plan.creates, plan.sleeps, f"pool of {name}")
        for copy in plan.deletes:
            log.info("pool of %s: deleting copy %s on launcher %s: a requester of another model holds its GPUs "
                     "now, or asleep it would not fit the host budget", name, copy.instance.instance_id,
                     copy.launcher)  # fmt: skip
            try:
                await self.clients.launchers.delete_instance(self._ip(copy.launcher), copy.instance.instance_id, name)
            except HttpError as err:
                log.info("pool of %s: could not delete %s: %s", name, copy.instance.instance_id, err)

    async def _record(self, isc: InferenceServerConfig, plan: PoolPlan) -> None:
        name = isc.metadata.name
        declared = isc.spec.warm_pool.sleepers if isc.spec.warm_pool is not None else 0
        loading = len(plan.loading) + len(plan.creates)
        filling = Filling(declared, len(plan.ready), loading, len(plan.nodes()), plan.verdict, plan.why)
        before = self.fillings.get(name)
        self.fillings[name] = filling
        self.metrics.pool_sleepers.labels(self.namespace, name).set(filling.ready)
        self.metrics.pool_declared.labels(self.namespace, name).set(declared)
        if before == filling:
            return
        self.filled(name)
        obj = self.caches.iscs.get(f"{self.namespace}/{name}")
        told = self.told.get(name, Verdict.FILLED)
        if obj is not None and plan.verdict.unfillable and told != plan.verdict:
            await events.warn(self.clients.events, obj, "PoolUnfillable", plan.why)
            self.told[name] = plan.verdict
        elif obj is not None and plan.verdict is Verdict.FILLED and told.unfillable:
            await events.note(self.clients.events, obj, "PoolFilled", plan.why)
            self.told[name] = plan.verdict

    def _forget(self, name: str) -> None:
        self.told.pop(name, None)
        if self.fillings.pop(name, None) is not None:
            self.metrics.forget_pool(self.namespace, name)
            self.filled(name)

    # ----- what the plan reads

    def _launchers(self, lc: LauncherConfig, template_hash: str) -> tuple[list[LauncherFacts], dict[str, NodeUse]]:
        """The LauncherConfig's current launchers, and what holds the GPUs of each Node they are on."""
        found = []
        reserved = self.reserved()
        uses: dict[str, NodeUse] = {}
        for pod in self.caches.pods.by_index(LAUNCHERS, "true"):
            node = pods.node_name(pod)
            config_hash = pods.annotations(pod).get(keys.LAUNCHER_CONFIG_HASH_ANNOTATION)
            if node is None or pods.is_deleting(pod) or config_hash != launcher_config_hash(template_hash, node):
                continue
            view = self.views.get(pods.name(pod))
            use = uses.get(node) or uses.setdefault(node, self.fleet.use_of(node, reserved))
            bound = pods.binding(pod) is not None
            known = view is not None and view.synced and view.extensions
            available = known and pods.is_ready(pod) and not bound and pods.name(pod) not in use.claimed
            found.append(
                LauncherFacts(
                    name=pods.name(pod),
                    node=node,
                    config_name=lc.metadata.name,
                    config=lc,
                    instances=list(view.instances.values()) if view is not None else [],
                    bound_instance=pods.annotations(pod).get(keys.INSTANCE_ID_ANNOTATION) if bound else None,
                    available=available,
                )
            )
        return found, uses

    def _nodes(self, isc: InferenceServerConfig, uses: Mapping[str, NodeUse]) -> dict[str, NodeFacts]:
        """The pool's view of the Nodes its launchers are on (`uses`, read once a pass by `_launchers`)."""
        assert isc.spec.warm_pool is not None
        selector = isc.spec.warm_pool.node_selector
        found = {}
        for name, use in uses.items():
            node = self.caches.nodes.get(name)
            if node is None:
                continue
            selected = not pods.is_cordoned(node) and not pods.is_deleting(node) and selector.matches(pods.labels(node))
            held = {gpu: frozenset(iscs) for gpu, iscs in use.held.items()}
            found[name] = NodeFacts(name, selected, self.fleet.gpus_on(name), held,
                                    frozenset(use.awake), use.room(), dict(use.sleepers))  # fmt: skip
        return found

    def _ip(self, launcher: str) -> str:
        return launcher_ip(self.caches, self.namespace, launcher)

    # ----- which pools a change concerns

    def pooled(self) -> list[str]:
        return [pods.name(isc) for isc in self.caches.iscs.items() if (isc.get("spec") or {}).get("warmPool")]

    def _anything_changed(self, *_: object) -> None:
        for name in self.pooled():
            self.queue.add_after(name, SETTLE_S)

    def _node_changed(self, old: Obj | None, new: Obj | None) -> None:
        if (
            (old is None) != (new is None)
            or pods.is_cordoned(old) != pods.is_cordoned(new)
            or (pods.labels(old or {}) != pods.labels(new or {}))
        ):
            self._anything_changed()

    def _isc_changed(self, old: Obj | None, new: Obj | None) -> None:
        if old is None or new is None or old.get("spec") != new.get("spec"):
            self.queue.add(pods.name(new or old or {"metadata": {"name": ""}}))


def _copy_bytes(isc: str, launchers: Iterable[LauncherFacts]) -> int:
    """What a copy of `isc` holds asleep: the most any instance of it in `launchers` holds (0: none seen yet)."""
    seen = [
        state.process.rss_bytes
        for launcher in launchers
        for state in launcher.instances
        if state.process is not None and (state.annotations or {}).get(keys.INSTANCE_ISC_NAME) == isc
    ]
    return max(seen, default=0)
