"""Drains keep the fleet warm: a launcher holding sleepers goes only once they are asleep on other Nodes.

The chart's launcher PodDisruptionBudget (`maxUnavailable: 0`) covers the launchers labelled
`dual-pods.llm-d.ai/warm=true`, so an eviction (`kubectl drain`, a node-pool upgrade) of such a launcher is
refused, and the drain retries it. This loop, keyed by launcher, keeps that label:

- on a schedulable Node, a launcher is warm while it holds a sleeping instance;
- on a cordoned Node, the time the drain was first seen is recorded on the launcher
  (`dual-pods.llm-d.ai/drain-started`, so a restarted controller keeps counting), and its sleepers are copied,
  asleep, to launchers on other Nodes (drain_plan.py: create a copy, then sleep it once it is ready). The label
  goes when nothing is left to copy or wait for, or when the timeout passed, and the drain then evicts the
  launcher. A Normal `DrainRewarmed` Event on the launcher says where each sleeper went, a Warning names a
  sleeper no launcher could take (`DrainStranded`) or a timeout (`DrainRewarmTimeout`).

While a drain waits, its launcher is looked at again every RECHECK_S (the copies it waits for are other
launchers' instances, whose events key those launchers). Only launchers that speak dualpods' API get copies
(their sleep route; FMA's launcher is put to sleep through vLLM's dev-mode route, which this loop leaves to the
requesters' passes): on a launcher without it the label follows the schedulable rule only.
"""

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from api import keys, launcher_summary
from api.crds import InferenceServerConfig, LauncherConfig
from api.log_format import LAUNCHER_FIELD
from controller import pods
from controller.dualpods.collaborators import Clients
from controller.dualpods.copies import CARRY_OUT_FAILURES, LauncherFacts, carry_out, launcher_ip
from controller.dualpods.drain_plan import plan, sleeping
from controller.dualpods.gpu_map import gpu_locations
from controller.dualpods.launcher_summaries import SETTLE_S, summary_text
from controller.dualpods.snapshot import Caches, parse
from controller.dualpods.writer import set_annotation, set_label
from controller.launcher_views import LauncherView, ViewSource
from kube import events
from kube.events import EventType
from kube.informer import Obj
from kube.workqueue import DONE, Problem, Result, Wait, WorkQueue, pass_context, run_workers

log = logging.getLogger(__name__)

RECHECK_S = 1.0
DEFAULT_TIMEOUT_S = 600.0
WARM = "true"


class DrainRewarmer:
    def __init__(
        self,
        namespace: str,
        caches: Caches,
        views: ViewSource,
        clients: Clients,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.namespace = namespace
        self.caches = caches
        self.views = views
        self.clients = clients
        self.timeout_s = timeout_s
        self.now = now
        self.settle_s = SETTLE_S
        self._told: set[tuple[str, str]] = set()  # (launcher UID, message) Events already recorded
        self.queue: WorkQueue[str] = WorkQueue("drains")
        views.subscribe(self._changed, lambda launcher, _view: self._changed(launcher))
        caches.pods.subscribe(self._pod_changed)
        caches.nodes.subscribe(self._node_changed)

    async def run(self) -> None:
        await run_workers(self.queue, self.reconcile, workers=1, fields=lambda name: {LAUNCHER_FIELD: name})

    async def reconcile(self, name: str) -> Result:
        with pass_context(**{LAUNCHER_FIELD: name}):
            return await self._reconcile(name)

    async def _reconcile(self, name: str) -> Result:
        pod = self.caches.pods.get(f"{self.namespace}/{name}")
        view = self.views.get(name)
        if pod is None or pods.is_deleting(pod) or not pods.is_launcher(pod) or view is None or not view.synced:
            return DONE
        held = bool(sleeping(list(view.instances.values())))
        if not pods.is_cordoned(self._node_of(pod)):
            await self._keep(pod, view, warm=held, drain_started=None)
            return DONE
        started = _started(pod) or self.now()
        if not held or not view.extensions:
            await self._keep(pod, view, warm=False, drain_started=started)
            return DONE
        if (self.now() - started).total_seconds() > self.timeout_s:
            await self._tell(pod, "Warning", "DrainRewarmTimeout", f"its sleepers were not all copied to other "
                             f"nodes within {self.timeout_s:g} s; letting the drain evict it")  # fmt: skip
            await self._keep(pod, view, warm=False, drain_started=started)
            return DONE
        drain = plan(self._facts(pod), self._others(pod), self._iscs())
        try:
            await carry_out(self.clients, self._ip, self.views, drain.creates, drain.sleeps, f"drain of {name}")
        except CARRY_OUT_FAILURES as err:
            return Problem.of(f"drain of {name}: {err}")  # backed off, and planned afresh
        if drain.stranded and (unseen := self._unseen_launchers(pod)):
            # One of them may be where a stranded sleeper goes (a controller that just started knows no launcher
            # yet): the drain keeps waiting rather than finding nowhere to copy it and letting the launcher go.
            log.info("drain of %s: waiting for the instances of launchers %s", name, ", ".join(unseen))
            await self._keep(pod, view, warm=True, drain_started=started)
            return Wait(RECHECK_S, f"the instances of launchers {', '.join(unseen)}")
        for sleeper, why in drain.stranded.items():
            await self._tell(pod, "Warning", "DrainStranded", f"sleeping instance {sleeper} cannot be copied "
                             f"to another node: {why}")  # fmt: skip
        if drain.done:
            where = ", ".join(f"{sleeper} on {target}" for sleeper, target in sorted(drain.covered.items()))
            await self._tell(
                pod, "Normal", "DrainRewarmed", f"its sleepers are asleep on other nodes: {where or 'none'}"
            )
        await self._keep(pod, view, warm=not drain.done, drain_started=started)
        return DONE if drain.done else Wait(RECHECK_S, "its sleepers' copies")

    async def _keep(self, pod: Obj, view: LauncherView, *, warm: bool, drain_started: datetime | None) -> None:
        """The instance summary, the warm label and the drain's start time, in one write per pass and only when
        one of them differs (an instance that goes to sleep changes both the summary and the label)."""
        stamp = drain_started.isoformat() if drain_started is not None else None
        summary = summary_text(pod, view, self.now())

        def mutate(p: Obj) -> None:
            set_annotation(p, launcher_summary.ANNOTATION, summary)
            set_label(p, keys.LAUNCHER_WARM_LABEL, WARM if warm else None)
            set_annotation(p, keys.DRAIN_STARTED_ANNOTATION, stamp)

        if not warm and keys.LAUNCHER_WARM_LABEL in pods.labels(pod) and drain_started is not None:
            log.info("launcher %s may go: its drain holds it no more", pods.name(pod))
        await self.clients.pods.update(pod, mutate, "summary, warm" if warm else "summary, not warm")

    async def _tell(self, pod: Obj, type_: EventType, reason: str, message: str) -> None:
        """Said once per launcher and message (a drain's pass repeats every RECHECK_S)."""
        key = (pods.uid(pod), f"{reason}: {message}")
        if key not in self._told:
            self._told.add(key)
            await events.tell(self.clients.events, pod, type_, reason, message)

    # ----- what the plan reads

    def _node_of(self, pod: Obj) -> Obj | None:
        return self.caches.nodes.get(str(pods.node_name(pod)))

    def _launchers(self) -> list[Obj]:
        return [p for p in self.caches.pods.items() if pods.is_launcher(p) and not pods.is_deleting(p)]

    def _facts(self, pod: Obj) -> LauncherFacts:
        view = self.views.get(pods.name(pod))
        node = str(pods.node_name(pod))
        config_name = pods.labels(pod).get(keys.LAUNCHER_CONFIG_NAME_LABEL, "")
        node_obj = self._node_of(pod)
        reachable = view is not None and view.synced and view.extensions and pods.is_ready(pod)
        available = reachable and node_obj is not None and not pods.is_cordoned(node_obj)
        return LauncherFacts(
            name=pods.name(pod),
            node=node,
            config_name=config_name,
            config=parse(LauncherConfig, self.caches.lcs, self.namespace, config_name).value,
            instances=list(view.instances.values()) if view is not None else [],
            bound_instance=pods.annotations(pod).get(keys.INSTANCE_ID_ANNOTATION) if pods.binding(pod) else None,
            gpus=self._gpus_on(node),
            available=available,
        )

    def _unseen_launchers(self, source: Obj) -> list[str]:
        """Other Ready launchers on schedulable Nodes whose instances are not known yet (view not synced)."""
        unseen = []
        for pod in self._launchers():
            if pods.name(pod) == pods.name(source) or not pods.is_ready(pod) or pods.is_cordoned(self._node_of(pod)):
                continue
            view = self.views.get(pods.name(pod))
            if view is None or not view.synced:
                unseen.append(pods.name(pod))
        return unseen

    def _others(self, source: Obj) -> list[LauncherFacts]:
        return [self._facts(p) for p in self._launchers() if pods.name(p) != pods.name(source)]

    def _gpus_on(self, node: str) -> list[str]:
        """The GPU UUIDs known on `node`: the gpu-map's, and those its launchers' instances and requesters use."""
        known = set()
        for configmap in self.caches.configmaps.items():
            known |= {uuid for uuid, where in gpu_locations(configmap).items() if where.node == node}
        for pod in self.caches.pods.items():
            if pods.node_name(pod) != node:
                continue
            view = self.views.get(pods.name(pod)) if pods.is_launcher(pod) else None
            for state in view.instances.values() if view is not None else ():
                known |= set(state.gpu_uuids or [])
            if pods.is_requester(pod):
                known |= set(pods.accelerators(pod) or ())
        return sorted(known)

    def _iscs(self) -> dict[str, InferenceServerConfig]:
        found = {}
        for obj in self.caches.iscs.items():
            name = obj["metadata"]["name"]
            if (isc := parse(InferenceServerConfig, self.caches.iscs, self.namespace, name).value) is not None:
                found[name] = isc
        return found

    def _ip(self, launcher: str) -> str:
        return launcher_ip(self.caches, self.namespace, launcher)

    # ----- which launchers a change concerns

    def _changed(self, launcher: str) -> None:
        """After SETTLE_S, as the summaries: the reconciler writes the launcher when its instances change."""
        self.queue.add_after(launcher, self.settle_s)

    def _pod_changed(self, old: Obj | None, new: Obj | None) -> None:
        if new is not None and pods.is_launcher(new):
            self._changed(pods.name(new))

    def _node_changed(self, old: Obj | None, new: Obj | None) -> None:
        if pods.is_cordoned(old) == pods.is_cordoned(new):
            return
        node = (new or old or {}).get("metadata", {}).get("name")
        for launcher in self._launchers():
            if pods.node_name(launcher) == node:
                self.queue.add(pods.name(launcher))


def _started(pod: Obj) -> datetime | None:
    text = pods.annotations(pod).get(keys.DRAIN_STARTED_ANNOTATION)
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None
