"""Reconciling one inference server: a server-requesting Pod and the provider bound to it.

Level-triggered and idempotent: each pass reads the informer caches and the launchers' reported
instances, makes at most one decisive change (a write, a launcher call), and returns; the watch
event that change causes brings the next pass. Every durable fact lives in API objects — the binding
in the provider's `requester` annotation, the instance in the launcher's annotations, the GPUs in the
requester's `accelerators` annotation — so a restarted controller carries on where it stopped.

A requester asks for an instance in a launcher (its ISC annotation) or for a direct provider (its server
patch); the steps only direct mode has are in direct.py, the rest is shared.
"""

import logging
import time
from dataclasses import dataclass
from typing import TypeVar

from pydantic import ValidationError

from api import keys
from api.crds import CustomResource, InferenceServerConfig, LauncherConfig, SleeperBudget
from api.launcher import InstanceState, InstanceStatus, VllmConfig
from controller import pods
from controller.events import EventRecorder
from controller.informer import Informer
from controller.launcher_template import TemplateError, launcher_config_hash, node_independent_pod, pod_for_node

from .budget import Sleeper, gpu_sleeper_reserve, gpu_victim, gpus_over_budget, host_victims
from .direct import DirectProviders
from .http import HttpError
from .identity import VLLM, instance_id, runtime_of, vllm_config
from .launcher_client import LauncherClient
from .launcher_views import LauncherView, LauncherViews
from .memory import Memory
from .metrics import DualPodsMetrics
from .provider_client import ProviderClient
from .requester_client import RequesterClient, RequesterError
from .routing import RoutingMetadata, committed_routing, from_isc, problems
from .selection import Candidate, choose, instance_port, plan_for
from .status import RequesterProblem, status_json
from .writer import PodWriter, set_annotation, set_binding, set_finalizer, set_label

log = logging.getLogger(__name__)
Config = TypeVar("Config", bound=CustomResource)

BOUND_TO = "bound-to"
REQUESTERS_ON_NODE = "requesters-on-node"
LAUNCHERS_BY_CONFIG_HASH = "launchers-by-config-hash"
REQUESTERS_BY_ISC = "requesters-by-isc"
LAUNCHERS = "launchers"

RELAY_RECHECK_S = 10.0
SPI_STARTUP_RETRY_S = 0.05
SPI_STARTUP_WINDOW_S = 60.0
INSTANCE_ANNOTATIONS = (
    keys.INSTANCE_ID_ANNOTATION,
    keys.SERVER_PORT_ANNOTATION,
    keys.VLLM_CONFIG_ANNOTATION,
    keys.ISC_ROUTING_METADATA_ANNOTATION,
)


@dataclass
class Options:
    launcher_token_secret: str | None = None
    sleeper_limit: int = 1  # direct providers that may sleep on one GPU (FMA's --sleeper-limit)


@dataclass
class Caches:
    pods: Informer
    nodes: Informer
    iscs: Informer
    lcs: Informer
    configmaps: Informer  # only the gpu-map ConfigMap


class Reconciler:
    def __init__(
        self,
        namespace: str,
        caches: Caches,
        views: LauncherViews,
        writer: PodWriter,
        launchers: LauncherClient,
        requesters: RequesterClient,
        providers: ProviderClient,
        events: EventRecorder,
        metrics: DualPodsMetrics,
        options: Options,
    ) -> None:
        self.namespace = namespace
        self.c = caches
        self.views = views
        self.writer = writer
        self.launchers = launchers
        self.requesters = requesters
        self.providers = providers
        self.events = events
        self.metrics = metrics
        self.options = options
        self.memory = Memory()
        self.direct = DirectProviders(namespace, caches.pods, caches.configmaps, writer, providers, events,
                                      self.memory, options.sleeper_limit)  # fmt: skip

    def _pod(self, name: str) -> pods.Pod | None:
        return self.c.pods.get(f"{self.namespace}/{name}")

    # ----- one inference server

    async def reconcile_requester(self, name: str) -> float | None:
        requester = self._pod(name)
        bound = self.c.pods.by_index(BOUND_TO, name)
        mine = [p for p in bound if requester is not None and _bound_uid(p) == pods.uid(requester)]
        for stale in (p for p in bound if p not in mine):  # bound to an earlier Pod of the same name
            await self._release(stale, None)
        if len(mine) > 1:
            raise RuntimeError(f"requester {name} is bound to several providers: {[pods.name(p) for p in mine]}")
        provider = mine[0] if mine else None
        if requester is None:
            if provider is not None:
                await self._release(provider, None)
            if not bound:  # both Pods gone
                self.memory.keep_only({pods.uid(p) for p in self.c.pods.items()})
            return None
        try:
            result = await self._reconcile(requester, provider)
        except RequesterProblem as problem:
            await self._report(requester, problem.errors)
            if problem.retry:
                raise
            return None
        except RequesterError as problem:
            await self._report(requester, [str(problem)])
            raise
        # A pass without a problem: the status may be cleared again (by _settle_requester).
        self.memory.errors.pop(pods.uid(requester), None)
        return result

    async def _reconcile(self, requester: pods.Pod, provider: pods.Pod | None) -> float | None:
        wanted = provider is not None and pods.container_running(provider) and not pods.is_deleting(provider)
        if keys.REQUESTER_FINALIZER in pods.finalizers(requester) and not wanted:
            await self.writer.update(
                requester, lambda p: set_finalizer(p, keys.REQUESTER_FINALIZER, False), "no running provider"
            )
            return None
        if provider is not None and pods.is_deleting(provider):
            if not pods.is_deleting(requester):
                await self.writer.delete(requester, f"its provider {pods.name(provider)} is being deleted")
            await self.writer.update(
                provider, lambda p: set_finalizer(p, keys.PROVIDER_FINALIZER, False), "deletion relayed"
            )
            return None
        if provider is not None and pods.is_deleting(requester):
            await self._release(provider, requester)
            return None
        if pods.is_deleting(requester):
            return None
        node_name = pods.node_name(requester)
        node = self.c.nodes.get(node_name) if node_name else None
        if node is None or pods.is_deleting(node):
            return None  # not scheduled yet, or its node is going away: Kubernetes will act
        if pods.pod_ip(requester) is None:
            return None  # a normal moment of a Pod's start, not an error: its IP arrives with an update
        direct = _direct_mode(requester)
        isc_name = "" if direct else pods.annotations(requester).get(keys.INFERENCE_SERVER_CONFIG_ANNOTATION, "")
        known_gpus = pods.annotations(requester).get(keys.ACCELERATORS_ANNOTATION)
        if not known_gpus:
            return await self._record_gpus(requester, isc_name)
        gpus = known_gpus.split(",")
        if provider is None:
            if (node.get("spec") or {}).get("unschedulable"):
                await self.writer.delete(requester, f"node {node_name} is cordoned and no provider is bound")
                return None
            if direct:
                await self.direct.acquire(requester, str(node_name), gpus)
                return None
            return await self._bind(requester, str(node_name), gpus, isc_name)
        if pods.is_direct_provider(provider):
            return await self._serve_direct(requester, provider, gpus)
        return await self._serve(requester, provider, gpus, isc_name)

    async def _record_gpus(self, requester: pods.Pod, isc_name: str) -> float | None:
        """Ask the requester for its GPUs once; the annotation keeps them for every later pass (its
        update brings the next one)."""
        try:
            gpus = await self.requesters.gpu_uuids(requester, isc_name)
        except HttpError as err:
            if err.reply is None and _just_started(requester):
                # Its process is still starting and nothing announces when it listens: look again
                # soon rather than after an exponential back-off that would outlast the start-up.
                return SPI_STARTUP_RETRY_S
            raise RequesterProblem(f"cannot query the requester's GPUs: {err}") from None
        if not gpus:
            raise RequesterProblem("the assigned set of GPUs is empty")
        await self.writer.update(
            requester, lambda p: set_annotation(p, keys.ACCELERATORS_ANNOTATION, ",".join(gpus)), "record GPUs"
        )
        return None

    # ----- binding a launcher

    def _config(self, kind: type[Config], cache: Informer, name: str) -> Config:
        """The named object from `cache`, parsed; the RequesterProblem says whether it is missing or invalid."""
        obj = cache.get(f"{self.namespace}/{name}")
        if obj is None:
            raise RequesterProblem(f"{kind.RESOURCE.kind} {name} does not exist")
        try:
            return kind.from_k8s(obj)
        except ValidationError as err:
            raise RequesterProblem(f"{kind.RESOURCE.kind} {name} is invalid: {err}") from None

    def _launcher_config_of(self, launcher: pods.Pod) -> LauncherConfig | None:
        """The LauncherConfig a launcher was made from; None when it is gone or invalid (no limits then)."""
        try:
            return self._config(
                LauncherConfig, self.c.lcs, pods.labels(launcher).get(keys.LAUNCHER_CONFIG_NAME_LABEL, "")
            )
        except RequesterProblem:
            return None

    async def _bind(self, requester: pods.Pod, node: str, gpus: list[str], isc_name: str) -> float | None:
        isc = self._config(InferenceServerConfig, self.c.iscs, isc_name)
        lc = self._config(LauncherConfig, self.c.lcs, isc.spec.launcher_config_name)
        try:
            template, template_hash = node_independent_pod(lc, self.options.launcher_token_secret)
        except TemplateError as err:
            raise RequesterProblem(str(err)) from None
        routing = from_isc(isc)
        if found := problems(routing, template["metadata"]["labels"], template["metadata"]["annotations"]):
            raise RequesterProblem(f"InferenceServerConfig {isc_name}: " + "; ".join(found))
        try:
            runtime = runtime_of(pods.annotations(requester), isc.metadata.annotations)
        except ValueError as err:
            raise RequesterProblem(str(err)) from None
        budget = lc.spec.sleeper_budget.gpu_memory_bytes
        reserve = gpu_sleeper_reserve(int(budget) if budget is not None else None, lc.spec.max_instances)
        wanted = instance_id(isc, gpus, runtime)
        config = vllm_config(isc, gpus, runtime, reserve)
        port = isc.spec.model_server_config.port
        config_hash = launcher_config_hash(template_hash, node)
        candidates, waiting = await self._candidates(config_hash, isc_name)
        plan = choose(candidates, wanted, port, lc.spec.max_instances)
        uid = pods.uid(requester)
        if plan is None:
            if waiting:
                return None  # a launcher is starting; its readiness or watch brings us back
            self.memory.paths[uid] = "cold"
            await self._create_bound_launcher(requester, pod_for_node(template, template_hash, node), lc, wanted,
                                              config, routing)  # fmt: skip
            return None
        launcher = self._pod(plan.launcher)
        assert launcher is not None
        if found := problems(routing, pods.labels(launcher), pods.annotations(launcher)):
            raise RequesterProblem(f"InferenceServerConfig {isc_name} on launcher {plan.launcher}: " + "; ".join(found))
        self.memory.paths.setdefault(uid, "hot" if plan.priority == "P1" else "warm")
        log.info("binding requester %s to launcher %s (%s)", pods.name(requester), plan.launcher, plan.priority)
        # The bind write is the claim: optimistic, so of two requesters choosing one launcher only one
        # wins. Room for the instance is made afterwards, by the winner alone (see _make_room).
        await self.writer.update(launcher, lambda p: _bind_metadata(p, requester, wanted, config, routing), "bind")
        return None

    async def _candidates(self, config_hash: str, isc_name: str) -> tuple[list[Candidate], bool]:
        """Unbound launchers for this (LauncherConfig, node) whose instances are known, and whether
        some others are still starting."""
        candidates: list[Candidate] = []
        waiting = False
        for launcher in self.c.pods.by_index(LAUNCHERS_BY_CONFIG_HASH, config_hash):
            if pods.is_failed(launcher) or pods.is_deleting(launcher) or pods.binding(launcher) is not None:
                continue
            view = self.views.get(pods.name(launcher))
            pod_ip = pods.pod_ip(launcher)
            if pod_ip is None or not pods.is_ready(launcher) or view is None or not view.synced:
                waiting = True
                continue
            garbage = [s for s in view.instances.values()
                       if s.status is InstanceStatus.STOPPED or instance_port(s) is None]  # fmt: skip
            for state in garbage:
                await self.launchers.delete_instance(pod_ip, state.instance_id, isc_name)
            running = [s for s in view.instances.values() if s not in garbage]
            candidates.append(Candidate(pods.name(launcher), running))
        return candidates, waiting

    async def _create_bound_launcher(
        self,
        requester: pods.Pod,
        launcher: pods.Pod,
        lc: LauncherConfig,
        wanted: str,
        config: VllmConfig,
        routing: RoutingMetadata,
    ) -> None:
        """A new launcher, bound from birth so the populator never takes it for a spare."""
        _bind_metadata(launcher, requester, wanted, config, routing)
        started = time.monotonic()
        success = "false"
        try:
            created = await self.writer.create(launcher)
            success = "true"
        finally:
            self.metrics.launcher_create_seconds.labels(self.namespace, lc.metadata.name, success).observe(
                time.monotonic() - started
            )
        log.info("created launcher %s bound to requester %s", pods.name(created), pods.name(requester))

    # ----- serving through a bound launcher

    async def _serve(self, requester: pods.Pod, launcher: pods.Pod, gpus: list[str], isc_name: str) -> float | None:
        annotations = pods.annotations(launcher)
        wanted = annotations.get(keys.INSTANCE_ID_ANNOTATION, "")
        name = pods.name(requester)
        pod_ip = pods.pod_ip(launcher)
        view = self.views.get(pods.name(launcher))
        reachable = pod_ip is not None and pods.is_ready(launcher) and view is not None and view.synced
        state = view.instances.get(wanted) if view is not None and reachable else None
        if reachable and state is None and pods.labels(requester).get(keys.INSTANCE_LABEL) == wanted:
            await self._lose(requester, launcher, f"its instance {wanted} vanished from launcher")
            return None
        running = state is not None and state.status is InstanceStatus.RUNNING
        if await self._settle_requester(requester, launcher, gpus, instance=wanted if running else None):
            return None  # the update brings the next pass
        if not reachable or pod_ip is None or view is None:
            return None  # the launcher is starting; its readiness or watch brings us back
        served = pods.labels(requester).get(keys.INSTANCE_LABEL) == wanted
        if state is not None and state.status is InstanceStatus.STOPPED:
            if served:
                await self._lose(requester, launcher, f"its instance {wanted} stopped with exit code {state.exit_code}")
            else:  # it stopped before it ever served this requester: start it afresh
                await self.launchers.delete_instance(pod_ip, wanted, isc_name, name)
            return None
        if state is None:
            await self._make_room(requester, launcher, pod_ip, view, wanted, isc_name)
            config = VllmConfig.model_validate_json(annotations[keys.VLLM_CONFIG_ANNOTATION])
            self.memory.paths.setdefault(pods.uid(requester), "warm")
            try:
                await self.launchers.create_instance(pod_ip, wanted, config, isc_name, name)
            except HttpError as err:
                if err.reply is not None and err.reply.status == 409 and "already exists" in str(err.reply.body):
                    return None  # created by an earlier pass; its events have not arrived yet
                if err.reply is not None and err.reply.status < 500:
                    raise RequesterProblem(f"launcher {pods.name(launcher)} refused the instance: {err}") from None
                raise
            return None
        if not state.ready:
            return None  # its READY event brings us back
        if state.sleeping:
            if await self._evicted_for_wake(requester, launcher, pod_ip, wanted, gpus, isc_name):
                return None  # the DELETED event brings us back
            await self.launchers.wake(pod_ip, wanted, isc_name, name)
            return None  # its AWAKE event brings us back
        routing = committed_routing(launcher)
        other_labels = {k: v for k, v in pods.labels(launcher).items() if k not in routing.labels}
        other_annotations = {k: v for k, v in annotations.items() if k not in routing.annotations}
        if found := problems(routing, other_labels, other_annotations):
            message = "; ".join(found)
            await self.events.record(requester, "Warning", "OutdatedRoutingMetadata", message)
            await self.writer.delete(requester, f"outdated routing metadata: {message}")
            return None
        await self.writer.update(launcher, lambda p: _serving_metadata(p, routing), "instance serving")
        self._set_duality(launcher, 1)
        port = _server_port(launcher)
        await self._sync_lora(requester, pod_ip, port, state)
        return await self._relay(requester, True, isc_name, target=(pod_ip, port))

    async def _sync_lora(self, requester: pods.Pod, pod_ip: str, port: int, state: InstanceState) -> None:
        """Keep the serving instance's LoRA adapters in step with its ISC's current list (E8), without
        restarting it. A failing adapter is reported (Event) and does not stop the serving."""
        isc_name = (state.annotations or {}).get(keys.INSTANCE_ISC_NAME, "")
        obj = self.c.iscs.get(f"{self.namespace}/{isc_name}")
        if obj is None or ("--enable-lora" not in state.options.split() and not obj["spec"].get("loraAdapters")):
            return
        wanted = {a.name: a.path for a in InferenceServerConfig.from_k8s(obj).spec.lora_adapters}
        name = pods.name(requester)
        loaded = await self.providers.lora_adapters(pod_ip, port, name)
        try:
            for adapter in sorted(loaded - wanted.keys()):
                await self.providers.unload_lora(pod_ip, port, adapter, name)
            for adapter in sorted(wanted.keys() - loaded):
                await self.providers.load_lora(pod_ip, port, adapter, wanted[adapter], name)
        except HttpError as err:
            await self.events.record(requester, "Warning", "LoraAdapter", str(err))

    async def _serve_direct(self, requester: pods.Pod, provider: pods.Pod, gpus: list[str]) -> float | None:
        """A direct provider serves its requester once awake; its readiness is the provider Pod's own."""
        if await self._settle_requester(requester, provider, gpus, instance=None):
            return None  # the update brings the next pass
        ready = await self.direct.actuate(provider)
        if ready is None:
            return None
        self._set_duality(provider, 1)
        return await self._relay(requester, ready, "", target=(str(pods.pod_ip(provider)), self.direct.port(provider)))

    async def _make_room(
        self, requester: pods.Pod, launcher: pods.Pod, pod_ip: str, view: LauncherView, wanted: str, isc_name: str
    ) -> None:
        """Before creating the bound instance: delete the sleeping instances on its port and the least
        recently used others beyond the LauncherConfig's maxInstances (FMA's reclaim)."""
        lc = self._launcher_config_of(launcher)
        max_instances = lc.spec.max_instances if lc is not None else None
        port = _server_port(launcher)
        others = [s for s in view.instances.values() if s.instance_id != wanted]
        plan = plan_for(Candidate(pods.name(launcher), others), wanted, port, max_instances or len(others) + 1)
        uid = pods.uid(requester)
        for victim in plan.victims:
            log.info("deleting instance %s on launcher %s to make room for %s", victim, pods.name(launcher), wanted)
            await self.launchers.delete_instance(pod_ip, victim, isc_name, pods.name(requester))
        if plan.victims:
            self.memory.victims[uid] = self.memory.victims.get(uid, 0) + len(plan.victims)

    def _set_duality(self, launcher: pods.Pod, value: float) -> None:
        """fma_duality for each GPU of the provider's binding (1 bound, 0 after)."""
        binding = pods.binding(launcher)
        config = pods.json_annotation(launcher, keys.VLLM_CONFIG_ANNOTATION) or {}
        direct_gpus = pods.annotations(launcher).get(keys.ACCELERATORS_ANNOTATION)
        if binding is None:
            return
        for gpu in config.get("gpu_uuids") or (direct_gpus.split(",") if direct_gpus else []):
            self.metrics.duality.labels(
                self.namespace,
                binding.requester_name,
                pods.name(launcher),
                keys.INFERENCE_SERVER_CONTAINER,
                pods.annotations(launcher).get(keys.INSTANCE_ID_ANNOTATION, ""),
                gpu,
                str(pods.node_name(launcher)),
            ).set(value)

    async def _lose(self, requester: pods.Pod, launcher: pods.Pod, why: str) -> None:
        """The bound instance is gone: delete the requester so its set makes a fresh one."""
        await self.events.record(requester, "Warning", "InstanceLost", f"{why} {pods.name(launcher)}")
        await self.writer.delete(requester, why)

    async def _settle_requester(
        self, requester: pods.Pod, launcher: pods.Pod, gpus: list[str], instance: str | None
    ) -> bool:
        """Bring the requester's metadata in line with its binding (finalizer, labels, GPUs, no errors);
        True if that took a write."""
        holding = pods.container_running(launcher)
        reported = pods.uid(requester) in self.memory.errors

        def settle(pod: pods.Pod) -> None:
            set_finalizer(pod, keys.REQUESTER_FINALIZER, holding)
            set_label(pod, keys.DUAL_LABEL, pods.name(launcher))
            if instance is not None:
                set_label(pod, keys.INSTANCE_LABEL, instance)
            set_annotation(pod, keys.ACCELERATORS_ANNOTATION, ",".join(gpus))
            if not reported:  # a problem reported in the last pass stays until a pass goes without one
                set_annotation(pod, keys.STATUS_ANNOTATION, status_json([]))

        return await self.writer.update(requester, settle, "binding")

    async def _relay(
        self, requester: pods.Pod, ready: bool, isc_name: str, target: tuple[str, int] | None = None
    ) -> float | None:
        """Tell the requester whether it is ready (its kubelet's readiness probe then marks the Pod so),
        after pointing its request proxy (E7) at `target`, the serving model server."""
        uid = pods.uid(requester)
        if pods.container_ready(requester) == ready:
            self.memory.relayed[uid] = (ready, time.monotonic())
            return None
        last = self.memory.relayed.get(uid)
        if last is not None and last[0] == ready and time.monotonic() - last[1] < RELAY_RECHECK_S:
            return RELAY_RECHECK_S - (time.monotonic() - last[1])
        if ready and target is not None:
            await self.requesters.configure_proxy(requester, *target, isc_name)
        await self.requesters.relay_readiness(requester, ready, isc_name)
        self.memory.relayed[uid] = (ready, time.monotonic())
        log.info("Successfully relayed the readiness requesterName=%s ready=%s", pods.name(requester), ready)
        if ready and uid not in self.memory.actuated:
            self.memory.actuated.add(uid)
            elapsed = pods.container_age_s(requester)
            if elapsed is not None:
                self.metrics.actuation_seconds.labels(
                    self.namespace, self.memory.paths.get(uid, "hot"), str(self.memory.victims.get(uid, 0)), isc_name
                ).observe(max(0.0, elapsed))
        return RELAY_RECHECK_S

    async def _report(self, requester: pods.Pod, errors: list[str]) -> None:
        uid = pods.uid(requester)
        if self.memory.errors.get(uid) != errors:
            self.memory.errors[uid] = errors
            for error in errors:
                await self.events.record(requester, "Warning", "ActuationProblem", error)
        await self.writer.update(
            requester, lambda p: set_annotation(p, keys.STATUS_ANNOTATION, status_json(errors)), "status"
        )

    # ----- unbinding

    async def _release(self, launcher: pods.Pod, requester: pods.Pod | None) -> None:
        """Unbind a provider from a requester that is gone or going: a launcher's instance sleeps (or, if
        its ISC changed meanwhile, is deleted), a direct provider sleeps, and the provider becomes a spare."""
        if pods.is_deleting(launcher):
            await self.writer.update(launcher, lambda p: set_finalizer(p, keys.PROVIDER_FINALIZER, False), "gone")
            return
        if pods.in_trouble(launcher):
            await self.writer.delete(launcher, "unbinding a provider that restarted and is not ready")
            return
        if pods.is_direct_provider(launcher):
            if await self.direct.put_to_sleep(launcher):
                await self._unbind(launcher, requester)
            return
        annotations = pods.annotations(launcher)
        routing = committed_routing(launcher)
        if any(pods.labels(launcher).get(k) == v for k, v in routing.labels.items()):
            # Routing labels go first, so request routers drop the endpoint while it still serves.
            await self.writer.update(launcher, lambda p: _remove_routing_labels(p, routing), "unbind: routing")
            return
        wanted = annotations.get(keys.INSTANCE_ID_ANNOTATION, "")
        pod_ip = pods.pod_ip(launcher)
        view = self.views.get(pods.name(launcher))
        if pod_ip is not None and pods.container_running(launcher):
            if view is None or not view.synced:
                raise RuntimeError(f"launcher {pods.name(launcher)}'s instances are not known yet; cannot unbind")
            state = view.instances.get(wanted)
            if state is not None:
                await self._put_away(launcher, pod_ip, state)
        await self._unbind(launcher, requester)

    async def _unbind(self, provider: pods.Pod, requester: pods.Pod | None) -> None:
        """One write clears the provider's binding (and the metadata that came with it); then the requester
        may go."""
        self._set_duality(provider, 0)
        await self.writer.update(provider, _unbind_metadata, "unbind")
        if requester is not None:
            await self.writer.update(requester, lambda p: set_finalizer(p, keys.REQUESTER_FINALIZER, False), "unbound")

    async def _put_away(self, launcher: pods.Pod, pod_ip: str, state: InstanceState) -> None:
        isc_name = (state.annotations or {}).get(keys.INSTANCE_ISC_NAME, "")
        if state.status is InstanceStatus.STOPPED or not state.ready or self._obsolete(state):
            # A stopped, still loading or outdated instance is not worth keeping asleep; waiting for a
            # load to finish would hold the requester's deletion, and its GPUs, for that long.
            await self.launchers.delete_instance(pod_ip, state.instance_id, isc_name)
        elif not state.sleeping:
            if await self._fits_host_budget(launcher, pod_ip, state.instance_id, isc_name):
                await self.launchers.sleep(pod_ip, state.instance_id, isc_name, pods.name(launcher))
            else:
                await self.launchers.delete_instance(pod_ip, state.instance_id, isc_name)

    # ----- memory budgets of sleeping instances (E3)

    def _sleeper_budget(self, launcher: pods.Pod) -> SleeperBudget | None:
        lc = self._launcher_config_of(launcher)
        return lc.spec.sleeper_budget if lc is not None else None

    async def _fits_host_budget(self, launcher: pods.Pod, pod_ip: str, instance: str, isc_name: str) -> bool:
        """Make room for one more sleeper in host memory: False if even alone it would not fit."""
        budget = self._sleeper_budget(launcher)
        if budget is None or budget.host_memory_bytes is None:
            return True
        listing = await self.launchers.list_instances(pod_ip, isc_name)
        states = {s.instance_id: s for s in listing.instances}
        # What goes to sleep stays in host memory plus, at most, what it held on the GPU (its weights).
        process = states[instance].process if instance in states else None
        incoming = (process.rss_bytes + (process.gpu_memory_bytes or 0)) if process else 0
        victims = host_victims(_sleepers(listing.instances, exclude=instance), incoming, int(budget.host_memory_bytes))
        if victims is None:
            await self._note_budget(launcher, f"instance {instance} would hold {incoming} bytes asleep, more than "
                                    f"the host budget {budget.host_memory_bytes}; deleting it instead")  # fmt: skip
            return False
        for victim in victims:
            await self._note_budget(launcher, f"deleting sleeping instance {victim} to keep sleepers within the "
                                    f"host budget {budget.host_memory_bytes}")  # fmt: skip
            await self.launchers.delete_instance(pod_ip, victim, isc_name)
        return True

    async def _evicted_for_wake(
        self, requester: pods.Pod, launcher: pods.Pod, pod_ip: str, instance: str, gpus: list[str], isc_name: str
    ) -> bool:
        """Before waking: if a GPU carries more than the sleepers may hold, delete the least recently
        used sleeper there (True), or refuse the wake with a reason if none can go."""
        budget = self._sleeper_budget(launcher)
        if budget is None or budget.gpu_memory_bytes is None:
            return False
        over = gpus_over_budget(await self.requesters.memory_usage(requester, isc_name), gpus,
                                int(budget.gpu_memory_bytes))  # fmt: skip
        if not over:
            return False
        listing = await self.launchers.list_instances(pod_ip, isc_name)
        victim = gpu_victim(_sleepers(listing.instances, exclude=instance), over)
        if victim is None:
            used = ", ".join(f"{gpu}: {mib} MiB" for gpu, mib in over.items())
            raise RequesterProblem(
                f"not waking instance {instance}: its GPUs already hold more than the sleeper budget "
                f"{budget.gpu_memory_bytes} bytes ({used}) and no sleeping instance of this launcher can go"
            )
        await self._note_budget(launcher, f"deleting sleeping instance {victim} to free GPU memory for {instance}")
        await self.launchers.delete_instance(pod_ip, victim, isc_name, pods.name(requester))
        return True

    async def _note_budget(self, launcher: pods.Pod, message: str) -> None:
        log.info("launcher %s: %s", pods.name(launcher), message)
        await self.events.record(launcher, "Normal", "SleeperBudget", message)

    def _current_isc(self, name: str) -> InferenceServerConfig | None:
        """The ISC as it is now; None when it is gone or invalid."""
        try:
            return self._config(InferenceServerConfig, self.c.iscs, name)
        except RequesterProblem:
            return None

    def _obsolete(self, state: InstanceState) -> bool:
        """The instance's InferenceServerConfig changed (or is gone) since it was created."""
        return not _made_from(state, self._current_isc((state.annotations or {}).get(keys.INSTANCE_ISC_NAME, "")))

    # ----- instances of a changed InferenceServerConfig

    async def reconcile_isc(self, isc_name: str) -> float | None:
        """Delete sleeping instances made from an older version of this ISC (awake ones go at unbind)."""
        isc = self._current_isc(isc_name)
        for launcher in self.c.pods.by_index(LAUNCHERS, "true"):
            view = self.views.get(pods.name(launcher))
            pod_ip = pods.pod_ip(launcher)
            if view is None or not view.synced or pod_ip is None:
                continue
            bound_instance = pods.annotations(launcher).get(keys.INSTANCE_ID_ANNOTATION)
            for state in list(view.instances.values()):
                mine = (state.annotations or {}).get(keys.INSTANCE_ISC_NAME) == isc_name
                idle = state.sleeping or state.status is InstanceStatus.STOPPED
                if mine and idle and state.instance_id != bound_instance and not _made_from(state, isc):
                    log.info("deleting obsolete instance %s of ISC %s on launcher %s", state.instance_id, isc_name,
                             pods.name(launcher))  # fmt: skip
                    await self.launchers.delete_instance(pod_ip, state.instance_id, isc_name)
        return None


def _made_from(state: InstanceState, isc: InferenceServerConfig | None) -> bool:
    """The instance is what this version of the ISC makes (on its GPUs, with its runtime)."""
    return isc is not None and instance_id(isc, state.gpu_uuids or [], state.runtime or VLLM) == state.instance_id


def _sleepers(states: list[InstanceState], exclude: str) -> list[Sleeper]:
    return [
        Sleeper(
            s.instance_id,
            s.revision,
            s.process.rss_bytes if s.process else 0,
            frozenset(s.gpu_uuids or []),
        )
        for s in states
        if s.sleeping and s.status is InstanceStatus.RUNNING and s.instance_id != exclude
    ]


def _just_started(requester: pods.Pod) -> bool:
    """Its container is not running yet, or started within the start-up window."""
    age = pods.container_age_s(requester)
    return age is None or age < SPI_STARTUP_WINDOW_S


def _server_port(launcher: pods.Pod) -> int:
    """The port of the instance bound on this launcher (0 before a binding)."""
    return int(pods.annotations(launcher).get(keys.SERVER_PORT_ANNOTATION, "0"))


def _bound_uid(pod: pods.Pod) -> str | None:
    binding = pods.binding(pod)
    return binding.requester_uid if binding else None


def _direct_mode(requester: pods.Pod) -> bool:
    """Which provider the requester asks for: its own (server-patch) or a launcher's instance (ISC)."""
    found = pods.annotations(requester)
    if keys.SERVER_PATCH_ANNOTATION in found and keys.INFERENCE_SERVER_CONFIG_ANNOTATION in found:
        raise RequesterProblem(
            f"the annotations {keys.SERVER_PATCH_ANNOTATION} and {keys.INFERENCE_SERVER_CONFIG_ANNOTATION} "
            "exclude each other",
            retry=False,
        )
    return keys.SERVER_PATCH_ANNOTATION in found


def _bind_metadata(
    launcher: pods.Pod, requester: pods.Pod, wanted: str, config: VllmConfig, routing: RoutingMetadata
) -> None:
    set_binding(launcher, requester)
    set_annotation(launcher, keys.INSTANCE_ID_ANNOTATION, wanted)
    set_annotation(launcher, keys.SERVER_PORT_ANNOTATION, str((config.annotations or {})[keys.INSTANCE_INFERENCE_PORT]))
    set_annotation(launcher, keys.VLLM_CONFIG_ANNOTATION, config.model_dump_json(exclude_none=True))
    set_annotation(launcher, keys.ISC_ROUTING_METADATA_ANNOTATION, routing.model_dump_json())


def _serving_metadata(launcher: pods.Pod, routing: RoutingMetadata) -> None:
    set_label(launcher, keys.SLEEPING_LABEL, "false")
    for key, value in routing.labels.items():
        set_label(launcher, key, value)
    for key, value in routing.annotations.items():
        set_annotation(launcher, key, value)


def _remove_routing_labels(launcher: pods.Pod, routing: RoutingMetadata) -> None:
    for key in routing.labels:
        set_label(launcher, key, None)


def _unbind_metadata(launcher: pods.Pod) -> None:
    routing = committed_routing(launcher)
    _remove_routing_labels(launcher, routing)
    for key in routing.annotations:
        set_annotation(launcher, key, None)
    for key in (keys.REQUESTER_ANNOTATION, *INSTANCE_ANNOTATIONS):
        set_annotation(launcher, key, None)
    set_label(launcher, keys.DUAL_LABEL, None)
    set_label(launcher, keys.SLEEPING_LABEL, "true")
    set_finalizer(launcher, keys.PROVIDER_FINALIZER, False)
