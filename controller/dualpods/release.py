"""Releasing a provider from a requester that is gone or going (fma.md §2.5, §2.9), and relaying a
provider's deletion.

The routing labels go first (UNROUTING), so request routers drop the endpoint while it still serves.
Then RELEASING puts the instance away — asleep, or deleted when it is stopped, still loading, outdated,
too big for the host budget, or hung (a sleep that fails or times out) — and unbinds in one write. A
launcher that cannot be reached is waited for (RELEASE_WAITING) only within UNBIND_PATIENCE_S; past it,
the provider is unbound as it is, with an Event, and the instance is tidied when a later bind finds it
awake. Only a provider that is really lost (its node gone, its Pod failed, its container failing) is
deleted (DISCARDING): never for a NotReady spell or a past restart, which would throw warm sleepers away.
"""

from api import keys
from api.launcher import InstanceState, InstanceStatus
from controller import pods
from controller.dualpods import direct, instance_sleep
from controller.dualpods.identity import VLLM, instance_id
from controller.dualpods.memory_budget import host_victims
from controller.dualpods.outcomes import DONE, Problem, StepResult, Wait
from controller.dualpods.passes import Pass
from controller.dualpods.routing import RoutingMetadata, committed_routing
from controller.dualpods.sleepers import first_to_go, note_budget, sleepers
from controller.dualpods.snapshot import UNBIND_PATIENCE_S
from controller.dualpods.writer import set_annotation, set_finalizer, set_label
from controller.http import HttpError

RELEASE_POLL_S = 1.0  # how often a release looks again for a launcher whose instances are not known

INSTANCE_ANNOTATIONS = (
    keys.INSTANCE_ID_ANNOTATION,
    keys.SERVER_PORT_ANNOTATION,
    keys.VLLM_CONFIG_ANNOTATION,
    keys.ISC_ROUTING_METADATA_ANNOTATION,
)


def _waiting_requester(p: Pass) -> pods.Pod | None:
    """The requester whose finalizer waits on this release (none for a stale binding)."""
    return None if p.s.stale else p.s.requester


async def relay_deletion(p: Pass) -> StepResult:
    """The provider is being deleted: its requester goes too, then the provider's finalizer is dropped."""
    requester = _waiting_requester(p)
    if requester is not None and not pods.is_deleting(requester):
        await p.delete(requester, f"its provider {pods.name(p.provider)} is being deleted")
    await p.update(p.provider, lambda pod: set_finalizer(pod, keys.PROVIDER_FINALIZER, False), "deletion relayed")
    return DONE


async def discard(p: Pass) -> StepResult:
    await p.delete(p.provider, "unbinding a provider that is lost (its node gone, or its Pod or container failing)")
    return DONE


async def unroute(p: Pass) -> StepResult:
    routing = committed_routing(p.provider)
    await p.update(p.provider, lambda pod: _remove_routing_labels(pod, routing), "unbind: routing")
    return DONE


async def wait_for_launcher(p: Pass) -> StepResult:
    """Not a failure: look again soon (its listing may come without an event this pass hears), and at the
    latest when patience runs out (RELEASING then unbinds without it)."""
    why = f"launcher {pods.name(p.provider)}'s instances are not known yet; cannot unbind"
    deadline = p.s.release_deadline
    return Wait(RELEASE_POLL_S if deadline is None else max(0.0, min(RELEASE_POLL_S, deadline - p.s.now)), why)


async def release(p: Pass) -> StepResult:
    """Put the instance away, then unbind (the provider's write, then the requester's finalizer)."""
    provider, s = p.provider, p.s
    if s.direct_provider:
        slept = await direct.put_to_sleep(p, provider)
        if isinstance(slept, Problem):
            return slept
        if slept:
            await _unbind(p)
        return DONE
    pod_ip = pods.pod_ip(provider)
    known = s.view is not None and s.view.synced
    if pod_ip is not None and pods.container_running(provider) and known and s.view is not None:
        state = s.view.instances.get(s.wanted)
        try:
            if state is not None:
                await _put_away(p, pod_ip, state)
        except HttpError as err:
            if not s.patience_over:
                raise
            await _abandon(p, f"its launcher did not answer ({err})")
    elif s.patience_over and pods.container_running(provider):
        await _abandon(p, "its launcher's instances could not be listed")
    await _unbind(p)
    return DONE


async def _abandon(p: Pass, why: str) -> None:
    message = f"unbinding without putting instance {p.s.wanted} away: {why} within {UNBIND_PATIENCE_S:.0f} s"
    await p.warn(p.provider, "UnbindUnreachable", message)


async def _unbind(p: Pass) -> None:
    """One write clears the provider's binding (and the metadata that came with it); then the requester may go."""
    p.set_duality(p.provider, 0)
    await p.update(p.provider, _unbind_metadata, "unbind")
    requester = _waiting_requester(p)
    if requester is not None:
        p.want("unbound", finalizer=False)  # written after the provider's write, at the end of the pass


async def _put_away(p: Pass, pod_ip: str, state: InstanceState) -> None:
    state = await instance_sleep.as_it_is(p, p.provider, state, pods.name(p.provider))
    isc_name = (state.annotations or {}).get(keys.INSTANCE_ISC_NAME, "")
    launchers = p.clients.launchers
    current = p.s.instance_isc.value
    obsolete = (
        current is None or instance_id(current, state.gpu_uuids or [], state.runtime or VLLM) != state.instance_id
    )
    if state.status is InstanceStatus.STOPPED or not state.ready or obsolete:
        # A stopped, still loading or outdated instance is not worth keeping asleep; waiting for a
        # load to finish would hold the requester's deletion, and its GPUs, for that long.
        await launchers.delete_instance(pod_ip, state.instance_id, isc_name)
    elif not state.sleeping:
        if not await _fits_host_budget(p, pod_ip, state.instance_id, isc_name):
            await launchers.delete_instance(pod_ip, state.instance_id, isc_name)
            return
        try:
            await instance_sleep.sleep(p, p.provider, state, isc_name, pods.name(p.provider))
        except HttpError as err:
            # Hung (no answer in time), failing, or refusing: deleted, which kills it, rather than waited on.
            await p.warn(p.provider, "CannotSleep", f"instance {state.instance_id} did not sleep ({err}); deleting it")
            await launchers.delete_instance(pod_ip, state.instance_id, isc_name)


async def _fits_host_budget(p: Pass, pod_ip: str, instance: str, isc_name: str) -> bool:
    """Make room for one more sleeper in host memory: False if even alone it would not fit."""
    lc = p.s.provider_config.value
    budget = lc.spec.sleeper_budget if lc is not None else None
    if budget is None or budget.host_memory_bytes is None:
        return True
    launcher = p.provider
    listing = await p.clients.launchers.list_instances(pod_ip, isc_name)
    states = {s.instance_id: s for s in listing.instances}
    # What goes to sleep stays in host memory plus, at most, what it held on the GPU (its weights).
    process = states[instance].process if instance in states else None
    incoming = (process.rss_bytes + (process.gpu_memory_bytes or 0)) if process else 0
    first = first_to_go(listing.instances, p.memory.pools)
    victims = host_victims(
        sleepers(listing.instances, exclude=instance), incoming, int(budget.host_memory_bytes), first
    )
    if victims is None:
        await note_budget(p, launcher, f"instance {instance} would hold {incoming} bytes asleep, more than "
                          f"the host budget {budget.host_memory_bytes}; deleting it instead")  # fmt: skip
        return False
    for victim in victims:
        await note_budget(p, launcher, f"deleting sleeping instance {victim} to keep sleepers within the "
                          f"host budget {budget.host_memory_bytes}")  # fmt: skip
        await p.clients.launchers.delete_instance(pod_ip, victim, isc_name)
    return True


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
