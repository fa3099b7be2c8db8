"""The steps of a requester bound to a launcher, from an absent instance to a serving one.

WAKE_FAILED reports an instance its launcher killed for failing its post-wake check (an Event, a metric,
the requester's status) and deletes it, so that CREATING makes a fresh one for the same requester, which is
not told it is ready before that one serves (the requester's instance label goes with it, so the fresh
instance's absence is not taken for a lost one); RECREATING deletes an instance that stopped before it served;
CREATING makes room (FMA's reclaim) and
creates the instance from the config committed at the bind; ASLEEP wakes it, first deleting a sleeper
when its GPUs hold more than the sleeper budget (E3); SERVING makes the launcher an inference endpoint,
keeps LoRA adapters in step (E8), and relays readiness after pointing the requester's proxy at the
server (E7).
"""

import logging
from datetime import UTC, datetime

from api import keys, launcher_summary
from api.crds import InferenceServerConfig
from api.launcher import ErrorReason, InstanceState, VllmConfig
from controller import pods
from controller.dualpods import instance_sleep
from controller.dualpods.launcher_summaries import summary_text
from controller.dualpods.memory_budget import gpu_victim, gpus_over_budget
from controller.dualpods.metrics import BudgetAction
from controller.dualpods.outcomes import DONE, Problem, StepResult, Wait
from controller.dualpods.passes import Pass
from controller.dualpods.routing import RoutingMetadata, committed_routing, outdated_routing
from controller.dualpods.selection import Candidate, plan_for
from controller.dualpods.sleepers import count_budget_action, first_to_go, note_budget, sleepers
from controller.dualpods.snapshot import BoundNow, own_metadata
from controller.dualpods.status import reported_errors
from controller.dualpods.writer import set_annotation, set_label
from controller.http import HttpError
from controller.launcher_client import error_reason
from controller.launcher_views import LauncherView

log = logging.getLogger(__name__)


def launcher_ip(p: Pass) -> str:
    ip = pods.pod_ip(p.provider)
    assert ip is not None  # the launcher is reachable in these steps
    return ip


def server_port(launcher: pods.Pod) -> int:
    """The port of the instance bound on this launcher (0 before a binding)."""
    return int(pods.annotations(launcher).get(keys.SERVER_PORT_ANNOTATION, "0"))


async def replace_failed_wake(p: Pass) -> StepResult:
    """Its launcher killed the instance for failing its post-wake check (a corrupt model). The requester is
    told it is not ready; one write makes it unserved (no instance label, so the fresh instance is not taken
    for a lost one) and shows the failure in its status; an Event and the metric record it once; then the
    instance is deleted, and its DELETED event brings CREATING: a fresh instance for the same requester.
    Each part is idempotent, so a pass that fails part-way is run again."""
    s, launcher, requester = p.s, p.provider, p.requester
    assert s.instance is not None
    check = s.instance.wake_check
    detail = check.detail if check is not None and check.detail else "its output differed from its recorded probe"
    why = (
        f"instance {s.wanted} on launcher {pods.name(launcher)} failed its post-wake check ({detail}); "
        "the launcher killed it and a fresh instance is created"
    )
    first = why not in reported_errors(requester)
    await p.relay(False)
    p.want("its instance failed its post-wake check", unserved=True)
    await p.write_requester([why])  # before the deletion, whose event must not find it served
    if first:
        p.world.metrics.wake_check_failures.labels(p.world.namespace, s.isc_name).inc()
        await p.warn(requester, "WakeCheckFailed", why)
    await p.clients.launchers.delete_instance(launcher_ip(p), s.wanted, s.isc_name, pods.name(requester))
    return Problem.of(why, retry=False)  # what the status shows until the next pass


async def await_launcher(p: Pass) -> StepResult:
    """The bound launcher is not reachable: its readiness, or its view's listing, brings the next pass; one
    that never comes is the requester's status error once the phase's budget runs out."""
    name = pods.name(p.provider)
    return Wait(None, f"launcher {name} does not answer (it is not Ready, or its instances cannot be listed)")


async def recreate(p: Pass) -> StepResult:
    """It stopped before it ever served this requester (e.g. on a spare launcher): nothing was lost."""
    await p.clients.launchers.delete_instance(launcher_ip(p), p.s.wanted, p.s.isc_name, pods.name(p.requester))
    return DONE


async def create(p: Pass) -> StepResult:
    """Make room, then create the instance from the config committed at the bind (two or more launcher
    calls: the deletions of the reclaim, then the creation)."""
    s, launcher = p.s, p.provider
    assert s.view is not None
    lc = s.provider_config.value
    created = await create_on(p, launcher, s.view, lc.spec.max_instances if lc is not None else None)
    if not isinstance(created, InstanceState):
        return created
    p.want("instance created", settled=True, bound_now=BoundNow(launcher, created))  # its label, in this pass
    return DONE


async def create_on(
    p: Pass, launcher: pods.Pod, view: LauncherView, max_instances: int | None
) -> InstanceState | StepResult:
    """Make room on `launcher` (bound to the pass's requester: its instance annotations are the binding's) and
    create the wanted instance there; the instance as created, or why not (DONE: it exists already)."""
    config = VllmConfig.model_validate_json(pods.annotations(launcher)[keys.VLLM_CONFIG_ANNOTATION])
    wanted = pods.annotations(launcher)[keys.INSTANCE_ID_ANNOTATION]
    ip = pods.pod_ip(launcher)
    assert ip is not None  # the launcher is reachable where an instance is created
    await _make_room(p, launcher, ip, view, wanted, max_instances)
    p.memory.paths.setdefault(pods.uid(p.requester), "warm")
    try:
        created = await p.clients.launchers.create_instance(ip, wanted, config, p.s.isc_name, pods.name(p.requester))
    except HttpError as err:
        if error_reason(err) is ErrorReason.ALREADY_EXISTS:
            return DONE  # created by an earlier pass; its events have not arrived yet
        if err.reply is not None and err.reply.status < 500:
            return Problem.of(f"launcher {pods.name(launcher)} refused the instance: {err}")
        raise
    view.created(created)  # the next pass must find it, whether or not its event has arrived by then
    return created


async def _make_room(
    p: Pass, launcher: pods.Pod, ip: str, view: LauncherView, wanted: str, max_instances: int | None
) -> None:
    """Delete the instances on the wanted port and the least recently used others beyond the
    LauncherConfig's maxInstances (FMA's reclaim)."""
    others = [state for state in view.instances.values() if state.instance_id != wanted]
    plan = plan_for(
        Candidate(pods.name(launcher), others),
        wanted,
        server_port(launcher),
        max_instances if max_instances is not None else len(others) + 1,
        first_to_go(others, p.memory.pools),
    )
    uid = pods.uid(p.requester)
    for victim in plan.victims:
        log.info("deleting instance %s on launcher %s to make room for %s", victim, pods.name(launcher), wanted)
        await p.clients.launchers.delete_instance(ip, victim, p.s.isc_name, pods.name(p.requester))
    if plan.victims:
        p.memory.victims[uid] = p.memory.victims.get(uid, 0) + len(plan.victims)


async def wake(p: Pass) -> StepResult:
    """Wake the instance; or, when its GPUs hold more than the sleeper budget, delete the least recently
    used sleeper there first (its DELETED event brings the wake), or refuse with a reason."""
    s, launcher, requester = p.s, p.provider, p.requester
    budget = s.provider_config.value.spec.sleeper_budget if s.provider_config.value is not None else None
    if budget is not None and budget.gpu_memory_bytes is not None:
        usage = await p.clients.requesters.memory_usage(requester, s.isc_name)
        over = gpus_over_budget(usage, s.gpus or [], int(budget.gpu_memory_bytes))
        if over:
            listing = await p.clients.launchers.list_instances(launcher_ip(p), s.isc_name)
            first = first_to_go(listing.instances, p.memory.pools)
            victim = gpu_victim(sleepers(listing.instances, exclude=s.wanted), over, first)
            if victim is None:
                count_budget_action(p, BudgetAction.WAKE_REFUSED)
                used = ", ".join(f"{gpu}: {mib} MiB" for gpu, mib in over.items())
                return Problem.of(
                    f"not waking instance {s.wanted}: its GPUs already hold more than the sleeper budget "
                    f"{budget.gpu_memory_bytes} bytes ({used}) and no sleeping instance of this launcher can go"
                )
            await note_budget(p, launcher, f"deleting sleeping instance {victim} to free GPU memory for {s.wanted}")
            await p.clients.launchers.delete_instance(launcher_ip(p), victim, s.isc_name, pods.name(requester))
            return DONE
    assert s.instance is not None
    try:
        await instance_sleep.wake(p, launcher, s.instance, s.isc_name, pods.name(requester))
    except HttpError as err:
        if error_reason(err) is not ErrorReason.WAKE_CHECK_FAILED:
            raise
        # Not a warning here: the next pass (WAKE_FAILED) reports it, with its Event.
        log.info("instance %s on launcher %s failed its post-wake check", s.wanted, pods.name(launcher))
    return DONE  # its AWAKE event, the view's record of the wake or, failing its check, STOPPED brings us back


async def misrouted(p: Pass) -> StepResult:
    """The routing metadata committed at the bind no longer fits the launcher: a fresh requester rebinds."""
    message = "; ".join(outdated_routing(p.provider))
    await p.warn(p.requester, "OutdatedRoutingMetadata", message)
    await p.delete(p.requester, f"outdated routing metadata: {message}")
    return DONE


async def serve(p: Pass) -> StepResult:
    """The instance serves: make the launcher an endpoint (one write, which brings its instance summary up to
    date too), keep its LoRA adapters in step, and relay readiness (two requester calls). Each part is
    idempotent, so a pass that fails part-way is simply run again."""
    launcher, s = p.provider, p.s
    assert s.instance is not None
    assert s.view is not None
    endpoint = own_metadata(launcher)
    _serving_metadata(endpoint, committed_routing(launcher))
    if endpoint != launcher:
        set_annotation(endpoint, launcher_summary.ANNOTATION, summary_text(launcher, s.view, datetime.now(UTC)))
        await p.update(launcher, lambda pod: pod.update(endpoint), "instance serving")
    p.set_duality(launcher, 1)
    port = server_port(launcher)
    await _sync_lora(p, port, s.instance)
    return await p.relay(True, target=(launcher_ip(p), port))


async def _sync_lora(p: Pass, port: int, state: InstanceState) -> None:
    """Keep the serving instance's LoRA adapters in step with its ISC's current list (E8), without
    restarting it. A failing adapter is reported (Event) and does not stop the serving."""
    isc: InferenceServerConfig | None = p.s.instance_isc.value
    if isc is None or ("--enable-lora" not in state.options.split() and not isc.spec.lora_adapters):
        return
    wanted = {a.name: a.path for a in isc.spec.lora_adapters}
    name, ip, servers = pods.name(p.requester), launcher_ip(p), p.clients.servers
    loaded = await servers.lora_adapters(ip, port, name)
    try:
        for adapter in sorted(loaded - wanted.keys()):
            await servers.unload_lora(ip, port, adapter, name)
        for adapter in sorted(wanted.keys() - loaded):
            await servers.load_lora(ip, port, adapter, wanted[adapter], name)
    except HttpError as err:
        await p.warn(p.requester, "LoraAdapter", str(err))


def _serving_metadata(launcher: pods.Pod, routing: RoutingMetadata) -> None:
    set_label(launcher, keys.SLEEPING_LABEL, "false")
    for key, value in routing.labels.items():
        set_label(launcher, key, value)
    for key, value in routing.annotations.items():
        set_annotation(launcher, key, value)
