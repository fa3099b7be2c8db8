"""Direct providers (fma.md §2.6): a requester with a `server-patch` annotation is served by a Pod made from its own
spec — its nominal provider — running the model server itself, rather than by a launcher.

These are the steps only direct mode has (ACQUIRING, DIRECT_SERVING, and the sleep of RELEASING): find or make
the provider (bind a sleeping copy when one exists, else keep each GPU's sleepers within the limit and create
one), wake the bound provider and relay its readiness, and put it to sleep before it is unbound. Whether a provider
sleeps is learnt once per controller lifetime (and container restart) and then known from what the controller did to
it (kept in the pass's memory): no polling.
"""

import logging
from typing import Final

from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from controller import pods
from controller.dualpods.gpu_map import GpuMapError, gpu_indices
from controller.dualpods.nominal import NominalError, nominal_provider, server_port
from controller.dualpods.outcomes import DONE, Problem, StepResult
from controller.dualpods.passes import Pass
from controller.dualpods.writer import set_binding, set_label
from controller.http import HttpError
from kube.client import refusal

log = logging.getLogger(__name__)

NOMINAL: Final = "nominal"  # pod index: nominal hash -> direct providers
GPU: Final = "gpu"  # pod index: "<node> <index>" -> direct providers that may use that GPU


# ----- a requester without a provider


async def acquire(p: Pass) -> StepResult:
    """Bind a sleeping copy of the requester's nominal provider; or make room for a new one and create it,
    bound from birth. Each is one write whose event brings the next pass."""
    requester, cache = p.requester, p.world.caches
    node, gpus = str(pods.node_name(requester)), p.s.gpus or []
    gpu_map = cache.configmaps.get(f"{p.s.namespace}/{keys.GPU_MAP_CONFIGMAP}")
    try:
        indices = gpu_indices(gpu_map, node, gpus)
    except GpuMapError as err:  # the ConfigMap's next change brings every direct requester back
        return Problem(tuple(err.errors), retry=False)
    try:
        nominal = nominal_provider(requester, node, indices, gpus)
    except NominalError as err:  # only a change to the requester's patch can help
        message = f"failed to construct the nominal server-providing Pod: {err}"
        return Problem.of(message, retry=False)
    uid = pods.uid(requester)
    copies = [pod for pod in cache.pods.by_index(NOMINAL, nominal.hash) if not pods.is_deleting(pod)]
    sleeper = next((pod for pod in copies if pods.binding(pod) is None and not pods.is_failed(pod)), None)
    if sleeper is not None:
        p.memory.paths.setdefault(uid, "hot")
        log.info("binding requester %s to sleeping provider %s", pods.name(requester), pods.name(sleeper))
        await p.update(sleeper, lambda pod: set_binding(pod, requester), "bind")
        return DONE
    if any(_serves_a_departing_requester(p, pod) for pod in copies):
        return DONE  # it is about to sleep and be unbound; that change brings us back to reuse it
    if await _make_room(p, node, indices):
        return DONE  # the deletions' events bring us back
    p.memory.paths[uid] = "cold"
    set_binding(nominal.pod, requester)
    try:
        created = await p.create(nominal.pod)
    except ApiException as err:
        reason, message = refusal(err)
        if err.status in (400, 422):  # invalid, or not even a Pod: only a new patch can help
            what = message if reason == "Invalid" or err.status == 422 else f"Pod is refused: {message}"
            return Problem.of(f"the nominal server-providing {what}", retry=False)
        return Problem.of(f"failed to create server-providing Pod: {message}")
    _note(p, created, asleep=False)
    log.info("created provider %s bound to requester %s on GPUs %s of node %s", pods.name(created),
             pods.name(requester), ",".join(indices), node)  # fmt: skip
    return DONE


async def _make_room(p: Pass, node: str, indices: list[str]) -> bool:
    """FMA's sleeper limit: on each GPU, delete the least recently used sleepers beyond the limit. True while
    a GPU holds more than the limit, counting those still going (they hold GPU memory until they are gone)."""
    limit = p.world.options.sleeper_limit
    victims: dict[str, tuple[pods.Pod, str]] = {}  # name -> (Pod, the GPU it was chosen for)
    crowded = False
    for index in indices:
        found = p.world.caches.pods.by_index(GPU, f"{node} {index}")
        sleepers = [pod for pod in found if pods.binding(pod) is None]
        staying = [pod for pod in sleepers if not pods.is_deleting(pod) and pods.name(pod) not in victims]
        for victim in sorted(staying, key=_last_used)[: max(len(staying) - limit, 0)]:
            victims[pods.name(victim)] = (victim, index)
        crowded = crowded or len(sleepers) > limit
    for victim, index in victims.values():
        message = (
            f"deleting sleeping provider {pods.name(victim)}: at most {limit} may sleep on GPU {index} of node {node}"
        )
        await p.event(victim, "Normal", "SleeperBudget", message)
        await p.delete(victim, "sleeper limit")
    return crowded


# ----- a bound provider


async def actuate(p: Pass) -> StepResult:
    """Make the bound provider serve, then relay its readiness (its own readiness probe's): a wake call,
    then the sleeping label's write or the relay."""
    provider = p.provider
    pod_ip = pods.pod_ip(provider)
    if pod_ip is None or not pods.is_ready(provider):
        p.set_duality(provider, 1)
        return await p.relay(False)  # starting or restarting: its readiness brings us back
    port = server_port_of(provider)
    if isinstance(port, Problem):
        return port
    requester = _requester_name(provider)
    asleep = _asleep(p, provider)
    if asleep is None:  # not known since this controller started (or the container restarted): ask once
        asleep = await p.clients.servers.is_sleeping(pod_ip, port, requester)
        _note(p, provider, asleep)
    if asleep:
        await p.clients.servers.wake(pod_ip, port, requester)
        _note(p, provider, asleep=False)
    if pods.labels(provider).get(keys.SLEEPING_LABEL) != "false":
        await p.update(provider, lambda pod: set_label(pod, keys.SLEEPING_LABEL, "false"), "awake")
        return DONE
    p.set_duality(provider, 1)
    return await p.relay(True, target=(pod_ip, port))


async def put_to_sleep(p: Pass, provider: pods.Pod) -> bool | Problem:
    """Before an unbind: the provider sleeps, so that no unbound provider holds its GPUs awake. False if it
    could not be put to sleep (not serving, hung, or refusing) and was deleted instead."""
    pod_ip = pods.pod_ip(provider)
    if pod_ip is None or not pods.is_ready(provider):
        await p.delete(provider, "unbinding a provider that does not serve, so cannot sleep")
        return False
    if _asleep(p, provider) is True:
        return True
    port = server_port_of(provider)
    if isinstance(port, Problem):
        return port
    try:
        await p.clients.servers.sleep(pod_ip, port, _requester_name(provider))
    except HttpError as err:
        refused = err.reply is not None and err.reply.status < 500
        if not (refused or err.timed_out or p.s.patience_over):
            raise  # unreachable for a moment, or failing: try again (a hung one is not waited for)
        await p.warn(provider, "CannotSleep", f"deleting it instead of unbinding: {err}")
        await p.delete(provider, "unbinding a provider that does not sleep")
        return False
    _note(p, provider, asleep=True)
    return True


def _serves_a_departing_requester(p: Pass, provider: pods.Pod) -> bool:
    """Bound to a requester that is gone or going (a set replacing a Pod, say): soon a sleeper to reuse."""
    binding = pods.binding(provider)
    if binding is None:
        return False
    requester = p.world.caches.pods.get(f"{p.s.namespace}/{binding.requester_name}")
    return requester is None or pods.is_deleting(requester) or pods.uid(requester) != binding.requester_uid


def server_port_of(provider: pods.Pod) -> int | Problem:
    """The port its model server listens on."""
    try:
        return server_port(provider)
    except NominalError as err:  # not a Pod this controller made
        return Problem.of(f"provider {pods.name(provider)}: {err}")


def _asleep(p: Pass, provider: pods.Pod) -> bool | None:
    known = p.memory.asleep.get(pods.uid(provider))
    return known[1] if known is not None and known[0] == pods.restart_count(provider) else None


def _note(p: Pass, provider: pods.Pod, asleep: bool) -> None:
    p.memory.asleep[pods.uid(provider)] = (pods.restart_count(provider), asleep)


def _requester_name(provider: pods.Pod) -> str:
    binding = pods.binding(provider)
    return binding.requester_name if binding else ""


def _last_used(pod: pods.Pod) -> tuple[str, str]:
    """When the controller last changed the Pod, else its creation; then its name."""
    return pods.last_used(pod), pods.name(pod)
