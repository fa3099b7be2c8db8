"""The UNBOUND step: bind a requester to a launcher, or create one bound from birth (fma.md §2.7). The
NEEDS_GPUS step binds too, in the pass that records the requester's GPUs (phases.py): one requester write
for both.

The requester's ISC and LauncherConfig (parsed in the snapshot) give the launcher Pod it needs and the
instance it wants; the unbound launchers of that (LauncherConfig, node) whose instances are known are the
candidates, tidied first (a stopped or portless instance goes; an awake one that nobody serves is put to
sleep, so an unbound launcher never holds its GPU awake); selection.py picks P1/P2/P3. The bind write is
the claim: optimistic, so of two requesters choosing one launcher only one wins. The winner alone then makes
room for the instance and creates it, in the same pass (serving.py; CREATING does it where that fails), so
that the requester's binding and its instance label go in one write. A requester whose GPUs come through
ResourceClaims (DRA) gets a Normal Event naming the devices its instance runs on.
"""

import logging
import time

from api import keys
from api.launcher import InstanceState, InstanceStatus, VllmConfig
from controller import pods
from controller.dualpods import instance_sleep, serving
from controller.dualpods.identity import instance_id, launcher_instance_config, runtime_of
from controller.dualpods.outcomes import DONE, Problem, StepResult, Wait
from controller.dualpods.passes import Pass
from controller.dualpods.routing import RoutingMetadata, from_isc, problems
from controller.dualpods.selection import Candidate, choose
from controller.dualpods.sleepers import first_to_go
from controller.dualpods.snapshot import BoundNow, launcher_reachable, own_metadata
from controller.dualpods.writer import set_annotation, set_binding
from controller.http import HttpError
from controller.instance_probe import instance_port
from controller.launcher_template import TemplateError, launcher_config_hash, node_independent_pod, pod_for_node
from controller.launcher_views import LauncherView

log = logging.getLogger(__name__)

LAUNCHERS_BY_CONFIG_HASH = "launchers-by-config-hash"  # pod index: launcher config hash -> launchers
# A launcher created for a requester is awaited in the Pod cache this long (the watch's lag) before the requester
# may get another; each look waits LAUNCHER_SEEN_RECHECK_S.
LAUNCHER_SEEN_WITHIN_S = 30.0
LAUNCHER_SEEN_RECHECK_S = 0.2


async def bind(p: Pass, gpus: list[str] | None = None) -> StepResult:
    """Bind the best unbound launcher, or create one: one write, whose event brings the next pass. `gpus`: the
    requester's, asked in this pass (its snapshot does not show them yet)."""
    s, requester = p.s, p.requester
    # What the requester's ISC and LauncherConfig say settles only when one of them (or the requester) changes,
    # and those changes queue the requester again: terminal problems, not retried.
    if s.isc.value is None or s.launcher_config.value is None:
        return Problem.of(str(s.isc.problem or s.launcher_config.problem), retry=False)
    isc, lc = s.isc.value, s.launcher_config.value
    try:
        template, template_hash = node_independent_pod(
            lc, p.world.options.launcher_token_secret, p.world.options.launcher_runtime_class
        )
    except TemplateError as err:
        return Problem.of(str(err), retry=False)
    routing = from_isc(isc)
    if found := problems(routing, template["metadata"]["labels"], template["metadata"]["annotations"]):
        return Problem.of(f"InferenceServerConfig {s.isc_name}: " + "; ".join(found), retry=False)
    try:
        runtime = runtime_of(pods.annotations(requester), isc.metadata.annotations)
    except ValueError as err:
        return Problem.of(str(err), retry=False)
    gpus, node = gpus if gpus is not None else s.gpus or [], str(pods.node_name(requester))
    wanted = instance_id(isc, gpus, runtime)
    config = launcher_instance_config(isc, lc, gpus, runtime)
    candidates, waiting = await _candidates(p, launcher_config_hash(template_hash, node), wanted)
    uid = pods.uid(requester)
    if (awaited := _launcher_awaited(p, uid)) is not None:
        return Wait(LAUNCHER_SEEN_RECHECK_S, f"launcher {awaited} was created for it; waiting for the watch to show it")
    first = first_to_go((state for c in candidates for state in c.running), p.memory.pools)
    plan = choose(candidates, wanted, isc.spec.model_server_config.port, lc.spec.max_instances, uid, first)
    if plan is None:
        if waiting:
            return DONE  # a launcher is starting; its readiness or watch brings us back
        p.memory.paths[uid] = "cold"
        new = pod_for_node(template, template_hash, node)
        bind_metadata(new, requester, wanted, config, routing)  # bound from birth: never taken for a spare
        created = await _create_launcher(p, new, lc.metadata.name)
        p.memory.launching[uid] = (pods.name(created), time.monotonic())
        await _announce_devices(p, pods.name(created), wanted, gpus, node)
        return DONE
    launcher = p.world.caches.pods.get(f"{s.namespace}/{plan.launcher}")
    assert launcher is not None
    if found := problems(routing, pods.labels(launcher), pods.annotations(launcher)):
        return Problem.of(f"InferenceServerConfig {s.isc_name} on launcher {plan.launcher}: " + "; ".join(found))
    p.memory.paths.setdefault(uid, "hot" if plan.priority == "P1" else "warm")
    log.info("binding requester %s to launcher %s (%s)", pods.name(requester), plan.launcher, plan.priority)
    bound = own_metadata(launcher)
    bind_metadata(bound, requester, wanted, config, routing)
    if not await p.update(launcher, lambda pod: pod.update(bound), "bind"):
        return DONE
    view = p.world.views.get(plan.launcher)
    instance = view.instances.get(wanted) if view is not None else None
    result: StepResult = DONE
    if instance is None and view is not None and launcher_reachable(launcher, view):
        result = await _create_after_bind(p, bound, view, lc.spec.max_instances)
        instance = view.instances.get(wanted)
    p.want("binding", settled=True, bound_now=BoundNow(launcher, instance))  # one requester write fewer
    await _announce_devices(p, plan.launcher, wanted, gpus, node)
    return result


async def _create_after_bind(p: Pass, launcher: pods.Pod, view: LauncherView, max_instances: int) -> StepResult:
    """The instance the bind won, created in the same pass, so that the requester's binding and its instance
    label go in one write (CREATING's pass after the bind's event wrote the label on its own: one Pod write per
    requester). A launcher that fails to answer leaves it to CREATING, which reports what keeps failing."""
    try:
        created = await serving.create_on(p, launcher, view, max_instances)
    except HttpError as err:
        log.info(
            "instance on launcher %s not created after the bind (%s); CREATING tries again", pods.name(launcher), err
        )
        return DONE
    return DONE if isinstance(created, InstanceState) else created


def _launcher_awaited(p: Pass, uid: str) -> str | None:
    """The launcher this pass created for the requester that the Pod cache does not show yet (a pass right after
    the create sees the requester unbound still, and would create a second launcher, leaving it bound to two)."""
    launching = p.memory.launching.get(uid)
    if launching is None:
        return None
    name, since = launching
    if p.world.caches.pods.get(f"{p.s.namespace}/{name}") is None and time.monotonic() - since < LAUNCHER_SEEN_WITHIN_S:
        return name
    del p.memory.launching[uid]  # seen (and since unbound or gone), or lost: plan afresh
    return None


async def _announce_devices(p: Pass, launcher: str, wanted: str, gpus: list[str], node: str) -> None:
    """For a DRA requester, an Event naming each device its instance runs on (driver/pool/device and UUID), and
    dualpods_requester_device_info for each (its GPUs are its claims': the same for the requester's life)."""
    if not (p.requester.get("spec") or {}).get("resourceClaims"):
        return
    named = await p.clients.devices.named(node, gpus)
    for uuid, device in named.items():
        p.world.metrics.set_requester_device(
            p.world.namespace, pods.name(p.requester), uuid, device.driver, device.pool, device.name
        )
    devices = ", ".join(f"{named[u]} ({u})" if u in named else u for u in gpus)
    await p.event(p.requester, "Normal", "Bound", f"instance {wanted} on launcher {launcher} runs on {devices}")


async def _candidates(p: Pass, config_hash: str, wanted: str) -> tuple[list[Candidate], bool]:
    """Unbound launchers for this (LauncherConfig, node) whose instances are known, tidied, and whether
    some others are still starting."""
    candidates: list[Candidate] = []
    waiting = False
    for launcher in p.world.caches.pods.by_index(LAUNCHERS_BY_CONFIG_HASH, config_hash):
        if pods.is_failed(launcher) or pods.is_deleting(launcher) or pods.binding(launcher) is not None:
            continue
        view = p.world.views.get(pods.name(launcher))
        pod_ip = pods.pod_ip(launcher)
        if pod_ip is None or not pods.is_ready(launcher) or view is None or not view.synced:
            waiting = True
            continue
        gone: set[str] = set()
        for state in list(view.instances.values()):
            if state.status is InstanceStatus.STOPPED or instance_port(state) is None:
                await p.clients.launchers.delete_instance(pod_ip, state.instance_id, p.s.isc_name)
                gone.add(state.instance_id)
            elif not state.sleeping and state.instance_id != wanted:
                # Left awake by an unbind that could not reach it: nobody is served by it.
                log.info("launcher %s: putting unbound instance %s to sleep", pods.name(launcher), state.instance_id)
                await instance_sleep.sleep(p, launcher, state, p.s.isc_name, pods.name(launcher))
        running = [s for s in view.instances.values() if s.instance_id not in gone]
        candidates.append(Candidate(pods.name(launcher), running))
    return candidates, waiting


async def _create_launcher(p: Pass, launcher: pods.Pod, lc_name: str) -> pods.Pod:
    started = time.monotonic()
    success = "false"
    try:
        created = await p.create(launcher)
        success = "true"
    finally:
        p.world.metrics.launcher_create_seconds.labels(p.world.namespace, lc_name, success).observe(
            time.monotonic() - started
        )
    log.info("created launcher %s bound to requester %s", pods.name(created), pods.name(p.requester))
    return created


def bind_metadata(
    launcher: pods.Pod, requester: pods.Pod, wanted: str, config: VllmConfig, routing: RoutingMetadata
) -> None:
    set_binding(launcher, requester)
    set_annotation(launcher, keys.INSTANCE_ID_ANNOTATION, wanted)
    set_annotation(launcher, keys.SERVER_PORT_ANNOTATION, str((config.annotations or {})[keys.INSTANCE_INFERENCE_PORT]))
    set_annotation(launcher, keys.VLLM_CONFIG_ANNOTATION, config.model_dump_json(exclude_none=True))
    set_annotation(launcher, keys.ISC_ROUTING_METADATA_ANNOTATION, routing.model_dump_json())
