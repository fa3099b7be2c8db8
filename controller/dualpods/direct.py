"""Direct providers (fma.md §2.6): a requester with a `server-patch` annotation is served by a Pod made from its own
spec — its nominal provider — running the model server itself, rather than by a launcher.

These are the steps only direct mode has; reconcile.py runs them in the places where launcher mode runs its own:
find or make the provider (wake a sleeping copy when one exists, else keep each GPU's sleepers within the limit and
create one), wake the bound provider, and put it to sleep before it is unbound. Whether a provider sleeps is
learnt once per controller lifetime (and container restart) and then known from what the controller did to it: no
polling.
"""

import json
import logging
import re
from typing import Final

from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from controller import pods
from controller.events import EventRecorder
from controller.informer import Informer

from .gpu_map import GpuMapError, gpu_indices
from .http import HttpError
from .memory import Memory
from .nominal import NominalError, nominal_provider, server_port
from .provider_client import ProviderClient
from .status import RequesterProblem
from .writer import FIELD_MANAGER, PodWriter, set_binding, set_label

log = logging.getLogger(__name__)

NOMINAL: Final = "nominal"  # pod index: nominal hash -> direct providers
GPU: Final = "gpu"  # pod index: "<node> <index>" -> direct providers that may use that GPU
_INVALID_POD: Final = re.compile(r'^Pod "[a-z0-9.-]*" is invalid')


class DirectProviders:
    def __init__(
        self,
        namespace: str,
        pod_cache: Informer,
        configmaps: Informer,
        writer: PodWriter,
        client: ProviderClient,
        events: EventRecorder,
        memory: Memory,
        sleeper_limit: int,
    ) -> None:
        self.namespace = namespace
        self._pods = pod_cache
        self._configmaps = configmaps
        self.writer = writer
        self.client = client
        self.events = events
        self.memory = memory
        self.sleeper_limit = sleeper_limit

    # ----- a requester without a provider

    async def acquire(self, requester: pods.Pod, node: str, gpus: list[str]) -> None:
        """Bind a sleeping copy of the requester's nominal provider; or make room for a new one and create it,
        bound from birth. Each is one write whose event brings the next pass."""
        gpu_map = self._configmaps.get(f"{self.namespace}/{keys.GPU_MAP_CONFIGMAP}")
        try:
            indices = gpu_indices(gpu_map, node, gpus)
        except GpuMapError as err:  # the ConfigMap's next change brings every direct requester back
            raise RequesterProblem(*err.errors, retry=False) from None
        try:
            nominal = nominal_provider(requester, node, indices, gpus)
        except NominalError as err:  # only a change to the requester's patch can help
            message = f"failed to construct the nominal server-providing Pod: {err}"
            raise RequesterProblem(message, retry=False) from None
        uid = pods.uid(requester)
        copies = [p for p in self._pods.by_index(NOMINAL, nominal.hash) if not pods.is_deleting(p)]
        sleeper = next((p for p in copies if pods.binding(p) is None and not pods.is_failed(p)), None)
        if sleeper is not None:
            self.memory.paths.setdefault(uid, "hot")
            log.info("binding requester %s to sleeping provider %s", pods.name(requester), pods.name(sleeper))
            await self.writer.update(sleeper, lambda p: set_binding(p, requester), "bind")
            return
        if any(self._serves_a_departing_requester(p) for p in copies):
            return  # it is about to sleep and be unbound; that change brings us back to reuse it
        if await self._make_room(node, indices):
            return  # the deletions' events bring us back
        self.memory.paths[uid] = "cold"
        set_binding(nominal.pod, requester)
        try:
            created = await self.writer.create(nominal.pod)
        except ApiException as err:
            message = _api_message(err)
            if err.status in (400, 422):  # invalid, or not even a Pod: only a new patch can help
                what = message if _INVALID_POD.match(message) else f"Pod is refused: {message}"
                raise RequesterProblem(f"the nominal server-providing {what}", retry=False) from None
            raise RequesterProblem(f"failed to create server-providing Pod: {message}") from None
        self._note(created, asleep=False)
        log.info("created provider %s bound to requester %s on GPUs %s of node %s", pods.name(created),
                 pods.name(requester), ",".join(indices), node)  # fmt: skip

    async def _make_room(self, node: str, indices: list[str]) -> bool:
        """FMA's sleeper limit: on each GPU, delete the least recently used sleepers beyond the limit. True while
        a GPU holds more than the limit, counting those still going (they hold GPU memory until they are gone)."""
        victims: dict[str, tuple[pods.Pod, str]] = {}  # name -> (Pod, the GPU it was chosen for)
        crowded = False
        for index in indices:
            sleepers = [p for p in self._pods.by_index(GPU, f"{node} {index}") if pods.binding(p) is None]
            staying = [p for p in sleepers if not pods.is_deleting(p) and pods.name(p) not in victims]
            for victim in sorted(staying, key=_last_used)[: max(len(staying) - self.sleeper_limit, 0)]:
                victims[pods.name(victim)] = (victim, index)
            crowded = crowded or len(sleepers) > self.sleeper_limit
        for victim, index in victims.values():
            message = (
                f"deleting sleeping provider {pods.name(victim)}: at most {self.sleeper_limit} may sleep on "
                f"GPU {index} of node {node}"
            )
            log.info("%s", message)
            await self.events.record(victim, "Normal", "SleeperBudget", message)
            await self.writer.delete(victim, "sleeper limit")
        return crowded

    # ----- a bound provider

    async def actuate(self, provider: pods.Pod) -> bool | None:
        """Make the bound provider serve. Whether it is ready to (its own readiness probe), or None when this
        pass made a change whose event brings the next one."""
        pod_ip = pods.pod_ip(provider)
        if pod_ip is None or not pods.is_ready(provider):
            return False  # starting or restarting: its readiness brings us back
        port = self.port(provider)
        requester = _requester_name(provider)
        asleep = self._asleep(provider)
        if asleep is None:  # not known since this controller started (or the container restarted): ask once
            asleep = await self.client.is_sleeping(pod_ip, port, requester)
            self._note(provider, asleep)
        if asleep:
            await self.client.wake(pod_ip, port, requester)
            self._note(provider, asleep=False)
        if pods.labels(provider).get(keys.SLEEPING_LABEL) != "false":
            await self.writer.update(provider, lambda p: set_label(p, keys.SLEEPING_LABEL, "false"), "awake")
            return None
        return True

    async def put_to_sleep(self, provider: pods.Pod) -> bool:
        """Before an unbind: the provider sleeps, so that no unbound provider holds its GPUs awake. False if it
        could not be put to sleep (not serving yet, or it refuses) and was deleted instead."""
        pod_ip = pods.pod_ip(provider)
        if pod_ip is None or not pods.is_ready(provider):
            await self.writer.delete(provider, "unbinding a provider that does not serve, so cannot sleep")
            return False
        if self._asleep(provider) is True:
            return True
        try:
            await self.client.sleep(pod_ip, self.port(provider), _requester_name(provider))
        except HttpError as err:
            if err.reply is None or err.reply.status >= 500:
                raise  # unreachable for a moment, or failing: try again
            await self.events.record(provider, "Warning", "CannotSleep", f"deleting it instead of unbinding: {err}")
            await self.writer.delete(provider, "unbinding a provider that refuses to sleep")
            return False
        self._note(provider, asleep=True)
        return True

    def _serves_a_departing_requester(self, provider: pods.Pod) -> bool:
        """Bound to a requester that is gone or going (a set replacing a Pod, say): soon a sleeper to reuse."""
        binding = pods.binding(provider)
        if binding is None:
            return False
        requester = self._pods.get(f"{self.namespace}/{binding.requester_name}")
        return requester is None or pods.is_deleting(requester) or pods.uid(requester) != binding.requester_uid

    def port(self, provider: pods.Pod) -> int:
        """The port its model server listens on."""
        try:
            return server_port(provider)
        except NominalError as err:  # not a Pod this controller made
            raise RequesterProblem(f"provider {pods.name(provider)}: {err}") from None

    def _asleep(self, provider: pods.Pod) -> bool | None:
        known = self.memory.asleep.get(pods.uid(provider))
        return known[1] if known is not None and known[0] == pods.restart_count(provider) else None

    def _note(self, provider: pods.Pod, asleep: bool) -> None:
        self.memory.asleep[pods.uid(provider)] = (pods.restart_count(provider), asleep)


def _requester_name(provider: pods.Pod) -> str:
    binding = pods.binding(provider)
    return binding.requester_name if binding else ""


def _last_used(pod: pods.Pod) -> tuple[str, str]:
    """When the controller last changed the Pod (its managedFields entry, FMA's measure), else its creation; then
    its name. RFC 3339 UTC times compare as strings."""
    written = [
        str(entry["time"])
        for entry in pods.meta(pod).get("managedFields") or []
        if entry.get("manager") == FIELD_MANAGER and entry.get("time")
    ]
    return max(written, default=str(pods.meta(pod).get("creationTimestamp") or "")), pods.name(pod)


def _api_message(err: ApiException) -> str:
    """The message of the API server's Status answer (PodWriter puts the answer in `reason`)."""
    text = err.body or err.reason or ""
    try:
        return str(json.loads(text)["message"])
    except (ValueError, KeyError, TypeError):
        return str(text)
