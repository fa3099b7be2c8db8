"""One reconcile pass's context, shared by its steps: the frozen snapshot, the clients (with every Pod
write recorded, so the pass's outcome says what it changed), what is kept in memory, and the helpers that
several steps use (relaying readiness, deleting a requester whose instance is lost, fma_duality).
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api import keys
from controller import pods
from controller.dualpods.collaborators import Clients
from controller.dualpods.memory import Memory, Relayed
from controller.dualpods.metrics import DualPodsMetrics
from controller.dualpods.outcomes import DONE, Done, Wait
from controller.dualpods.snapshot import BoundNow, Caches, Snapshot
from controller.dualpods.status import RequesterWants, desired_requester
from controller.launcher_views import ViewSource
from kube import events
from kube.events import EventType

log = logging.getLogger(__name__)

RELAY_RECHECK_S = 10.0  # how long a relayed readiness is given to show on the requester before it is re-sent


@dataclass
class Options:
    launcher_token_secret: str | None = None
    launcher_runtime_class: str | None = None  # for launcher templates that name no RuntimeClass
    sleeper_limit: int = 1  # direct providers that may sleep on one GPU (FMA's --sleeper-limit)


@dataclass(frozen=True)
class World:
    """What every pass works with: the caches, the launcher views, the clients, the memory, the metrics."""

    namespace: str
    caches: Caches
    views: ViewSource
    clients: Clients
    memory: Memory
    metrics: DualPodsMetrics
    options: Options


@dataclass
class Pass:
    world: World
    s: Snapshot
    changed: list[str] = field(default_factory=list)  # what this pass wrote, in words
    written: set[str] = field(default_factory=set)  # the Pods it wrote (their cached copies are stale now)
    wants: RequesterWants = field(default_factory=RequesterWants)  # the requester's changes, written once

    @property
    def requester(self) -> pods.Pod:
        """The requester (steps that run only with one)."""
        assert self.s.requester is not None
        return self.s.requester

    @property
    def provider(self) -> pods.Pod:
        """The provider (steps that run only with one)."""
        assert self.s.provider is not None
        return self.s.provider

    @property
    def memory(self) -> Memory:
        return self.world.memory

    @property
    def clients(self) -> Clients:
        return self.world.clients

    # ----- writes, recorded

    async def update(
        self, pod: pods.Pod, mutate: Callable[[pods.Pod], None], why: str, *, if_unchanged: bool = True
    ) -> bool:
        version = await self.world.clients.pods.update(pod, mutate, why, if_unchanged=if_unchanged)
        if version is not None:
            self._note(pod, f"updated {pods.name(pod)}: {why}")
            self.memory.wrote(pod, version)
        return version is not None

    async def create(self, pod: pods.Pod) -> pods.Pod:
        created = await self.world.clients.pods.create(pod)
        self._note(created, f"created {pods.name(created)}")
        return created

    async def delete(self, pod: pods.Pod, why: str) -> None:
        await self.world.clients.pods.delete(pod, why)
        self._note(pod, f"deleted {pods.name(pod)}: {why}")

    def want(
        self,
        why: str,
        *,
        settled: bool = False,
        bound_now: BoundNow | None = None,
        finalizer: bool | None = None,
        gpus: list[str] | None = None,
        unserved: bool = False,
    ) -> None:
        """A change to the requester's metadata, written with its status at the end of the pass (one write)."""
        w = self.wants
        w.settled, w.unserved = w.settled or settled, w.unserved or unserved
        w.bound_now = bound_now or w.bound_now
        w.finalizer = finalizer if finalizer is not None else w.finalizer
        w.gpus = gpus if gpus is not None else w.gpus
        w.why.append(why)

    async def write_requester(self, errors: list[str] | None) -> None:
        """Write the whole requester the pass wants (desired_requester), at most once a pass: at its end, or
        earlier by a step that must see it written before it goes on."""
        requester = self.requester
        assert pods.name(requester) not in self.written, "the requester is written at most once a pass"
        desired = desired_requester(requester, self.s, self.wants, errors)
        if desired != requester:
            why = "; ".join(self.wants.why) or "status"
            await self.update(requester, lambda pod: pod.update(desired), why, if_unchanged=False)

    async def event(self, obj: dict[str, Any], type_: EventType, reason: str, message: str) -> None:
        """Say something about `obj`: the one object logger (events.tell), within this pass's log context."""
        await events.tell(self.world.clients.events, obj, type_, reason, message)

    async def warn(self, obj: dict[str, Any], reason: str, message: str) -> None:
        """A warning about `obj`: logged, and a Warning Event on it."""
        await self.event(obj, "Warning", reason, message)

    def _note(self, pod: pods.Pod, what: str) -> None:
        self.changed.append(what)
        self.written.add(pods.name(pod))

    # ----- helpers of several steps

    async def lose(self, why: str) -> None:
        """The bound instance is gone: delete the requester so its set makes a fresh one."""
        await self.warn(self.requester, "InstanceLost", f"{why} {pods.name(self.provider)}")
        await self.delete(self.requester, why)

    async def relay(self, ready: bool, target: tuple[str, int] | None = None) -> Done | Wait:
        """Tell the requester whether it is ready (its kubelet's readiness probe then marks the Pod so),
        after pointing its request proxy (E7) at `target`, the serving model server. Re-sent whenever the
        requester's readiness differs from `ready` (after RELAY_RECHECK_S, or at once when its container
        restarted and so forgot it)."""
        requester = self.requester
        uid = pods.uid(requester)
        incarnation = pods.restart_count(requester)
        if ready and target is not None and self.memory.proxied.get(uid) != (incarnation, target):
            # Pointed again whenever the server moved (or is not known to have been pointed at since the
            # requester's container started), even for a requester that is Ready already.
            await self.clients.requesters.configure_proxy(requester, *target, self.s.isc_name)
            self.memory.proxied[uid] = (incarnation, target)
        if pods.container_ready(requester) == ready:
            self.memory.relayed[uid] = Relayed(ready, incarnation, time.monotonic())
            return DONE
        why = f"requester {pods.name(requester)} does not show it is {'' if ready else 'not '}ready yet"
        last = self.memory.relayed.get(uid)
        if (
            last is not None
            and last[:2] == (ready, incarnation)
            and (since := time.monotonic() - last.at) < RELAY_RECHECK_S
        ):
            return Wait(RELAY_RECHECK_S - since, why)
        await self.clients.requesters.relay_readiness(requester, ready, self.s.isc_name)
        self.memory.relayed[uid] = Relayed(ready, incarnation, time.monotonic())
        log.info("Successfully relayed the readiness requesterName=%s ready=%s", pods.name(requester), ready)
        if ready and uid not in self.memory.actuated:
            self.memory.actuated.add(uid)
            elapsed = pods.container_age_s(requester)
            if elapsed is not None:
                path, victims = self.memory.paths.get(uid, "hot"), str(self.memory.victims.get(uid, 0))
                self.world.metrics.actuation_seconds.labels(
                    self.world.namespace, path, victims, self.s.isc_name
                ).observe(max(0.0, elapsed))
        return Wait(RELAY_RECHECK_S, why)

    def set_duality(self, provider: pods.Pod, value: float) -> None:
        """fma_duality for each GPU of the provider's binding (1 bound, 0 after)."""
        binding = pods.binding(provider)
        config = pods.json_annotation(provider, keys.VLLM_CONFIG_ANNOTATION) or {}
        direct_gpus = pods.annotations(provider).get(keys.ACCELERATORS_ANNOTATION)
        if binding is None:
            return
        for gpu in config.get("gpu_uuids") or (direct_gpus.split(",") if direct_gpus else []):
            self.world.metrics.set_duality(
                value,
                self.world.namespace,
                binding.requester_name,
                pods.name(provider),
                keys.INFERENCE_SERVER_CONTAINER,
                pods.annotations(provider).get(keys.INSTANCE_ID_ANNOTATION, ""),
                gpu,
                str(pods.node_name(provider)),
            )
