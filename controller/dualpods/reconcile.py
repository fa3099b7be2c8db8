"""Reconciling one inference server: a server-requesting Pod and the provider bound to it.

Each pass is observe → classify → act. `observe` freezes what the caches and the launcher views hold
about the requester (snapshot.py); the pure `classify` names its phase (phases.py); the phase's one step
does the work and the pass ends in an Outcome (status.py): the errors it met, when to look again, what
it changed. A step makes one decisive change (a write, a launcher call) and returns; the watch event that
change causes brings the next pass. The few steps that must do more say so in their docstrings; each of
their parts is idempotent. Every durable fact lives in API objects — the binding in the provider's
`requester` annotation, the instance in the launcher's annotations, the GPUs in the requester's
`accelerators` annotation, what the user was told in its status annotation — so a restarted controller
carries on where it stopped, and reports nothing twice.

The status annotation and its Events are computed from the outcome and compared with what the requester
already shows: written only when it differs, an Event only for an error not shown yet.
"""

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from api.crds import InferenceServerConfig
from api.launcher import InstanceStatus
from controller import pods
from controller.dualpods import binding, release, serving
from controller.dualpods.direct import DirectProviders
from controller.dualpods.identity import VLLM, instance_id
from controller.dualpods.isc_status import isc_status, observe_isc
from controller.dualpods.memory import Memory
from controller.dualpods.passes import Pass, World
from controller.dualpods.phases import NOT_SERVING, Phase, classify
from controller.dualpods.requester_client import RequesterError
from controller.dualpods.snapshot import observe, parse, settled
from controller.dualpods.status import Outcome, RequesterProblem, new_errors, reported_errors, status_json
from controller.dualpods.writer import set_annotation, set_finalizer
from controller.http import HttpError
from controller.kube import refusal

log = logging.getLogger(__name__)

LAUNCHERS = "launchers"  # pod index: "true" -> every launcher Pod
SPI_STARTUP_RETRY_S = 0.05
SPI_STARTUP_WINDOW_S = 60.0

Step = Callable[[Pass], Awaitable[float | None]]


class Reconciler:
    def __init__(self, world: World) -> None:
        self.world = world
        self.direct = DirectProviders()
        self._steps: dict[Phase, Step] = {
            Phase.GONE: self._forget,
            Phase.PROVIDER_DELETED: release.relay_deletion,
            Phase.DISCARDING: release.discard,
            Phase.UNROUTING: release.unroute,
            Phase.RELEASE_WAITING: release.wait_for_launcher,
            Phase.RELEASING: lambda p: release.release(p, self.direct),
            Phase.CONFLICTED: _conflicted,
            Phase.UNHOLDING: _unhold,
            Phase.DEPARTING: _nothing,
            Phase.UNSCHEDULED: _nothing,  # not scheduled yet, or its node is going away: Kubernetes will act
            Phase.STARTING: _nothing,  # a normal moment of a Pod's start: its IP arrives with an update
            Phase.INVALID: _invalid,
            Phase.NEEDS_GPUS: _record_gpus,
            Phase.CORDONED: _cordoned,
            Phase.ACQUIRING: self.direct.acquire,
            Phase.UNBOUND: binding.bind,
            Phase.WAKE_FAILED: serving.replace_failed_wake,
            Phase.LOST: _lost,
            Phase.SETTLING: _settle,
            Phase.DIRECT_SERVING: self.direct.actuate,
            Phase.LAUNCHER_STARTING: _nothing,  # its readiness or watch brings us back
            Phase.RECREATING: serving.recreate,
            Phase.CREATING: serving.create,
            Phase.LOADING: _nothing,  # its READY event brings us back
            Phase.ASLEEP: serving.wake,
            Phase.MISROUTED: serving.misrouted,
            Phase.SERVING: serving.serve,
        }
        assert set(self._steps) == set(Phase), "every phase has a step"

    @property
    def memory(self) -> Memory:
        return self.world.memory

    # ----- one inference server

    async def reconcile_requester(self, name: str) -> float | None:
        """One pass; returns when to look again. A problem is raised after it is reported (the queue's
        back-off), unless only a change to some object can settle it."""
        w = self.world
        p = Pass(w, observe(w.namespace, name, w.caches, w.views))
        phase = classify(p.s)
        log.debug("requester %s: %s", name, phase)
        outcome = await self._act(p, phase)
        if outcome.changed:
            log.debug("requester %s (%s) changed: %s", name, phase, "; ".join(outcome.changed))
        await self._report(p, outcome)
        if outcome.failure is not None:
            raise outcome.failure
        return outcome.again_after

    async def _act(self, p: Pass, phase: Phase) -> Outcome:
        try:
            again = await self._steps[phase](p)
            if phase in NOT_SERVING and p.s.requester is not None and not p.written:
                again = _sooner(again, await p.relay(False))  # its instance does not serve: not Ready
        except RequesterProblem as problem:
            return Outcome(problem.errors, failure=problem if problem.retry else None, changed=p.changed)
        except RequesterError as problem:
            return Outcome([str(problem)], failure=problem, changed=p.changed)
        except ApiException as err:
            if err.status in (404, 409) or err.status < 400 or err.status >= 500:
                return Outcome(None, failure=err, changed=p.changed)  # gone, raced or failing: try again
            # The API server refused a write made for this requester: only a change can help, but it is
            # retried with back-off (the change may be to something this controller does not watch).
            _, message = refusal(err)
            error = f"the API server refused a write for this requester ({err.status}): {message}"
            return Outcome([error], failure=RequesterProblem(error), changed=p.changed)
        except Exception as err:  # a launcher or model server that did not answer, a conflict: try again
            return Outcome(None, failure=err, changed=p.changed)
        # A pass about a binding left by an earlier requester of the name says nothing about this one.
        return Outcome(None if p.s.stale else [], again_after=again, changed=p.changed)

    async def _report(self, p: Pass, outcome: Outcome) -> None:
        """Bring the requester's status annotation (and Events) in line with the outcome, if the pass
        did not write the requester itself (that write carried the status, see _settle)."""
        requester = p.s.requester
        if outcome.errors is None or requester is None or pods.is_deleting(requester) or p.written & {p.s.name}:
            return
        if reported_errors(requester) == outcome.errors:
            return
        for error in new_errors(requester, outcome.errors):
            await p.event(requester, "Warning", "ActuationProblem", error)
        status = status_json(outcome.errors)
        try:
            await p.update(requester, lambda pod: set_annotation(pod, keys.STATUS_ANNOTATION, status), "status")
        except ApiException as err:
            if err.status not in (404, 409):  # gone, or changed meanwhile: the next pass reports
                raise

    async def _forget(self, p: Pass) -> float | None:
        """Both Pods are gone: forget what memory holds of them (as FMA drops an inference server's state)."""
        self.world.memory.keep_only({pods.uid(pod) for pod in self.world.caches.pods.items()})
        return None

    # ----- an InferenceServerConfig's status

    async def reconcile_isc_status(self, isc_name: str) -> float | None:
        """Bring the ISC's status in line with its LauncherConfig and its requesters (isc_status.py)."""
        w = self.world
        s = observe_isc(w.namespace, isc_name, w.caches)
        status = isc_status(s, w.options.launcher_token_secret, datetime.now(UTC))
        if s.obj is not None and status is not None:
            await w.clients.statuses.write(InferenceServerConfig, s.obj, status)
        return None

    # ----- instances of a changed InferenceServerConfig

    async def reconcile_isc(self, isc_name: str) -> float | None:
        """Delete sleeping instances made from an older version of this ISC (awake ones go at unbind)."""
        w = self.world
        isc = parse(InferenceServerConfig, w.caches.iscs, w.namespace, isc_name)
        for launcher in w.caches.pods.by_index(LAUNCHERS, "true"):
            view = w.views.get(pods.name(launcher))
            pod_ip = pods.pod_ip(launcher)
            if view is None or not view.synced or pod_ip is None:
                continue
            bound_instance = pods.annotations(launcher).get(keys.INSTANCE_ID_ANNOTATION)
            for state in list(view.instances.values()):
                mine = (state.annotations or {}).get(keys.INSTANCE_ISC_NAME) == isc_name
                idle = state.sleeping or state.status is InstanceStatus.STOPPED
                current = isc.value is not None and (
                    instance_id(isc.value, state.gpu_uuids or [], state.runtime or VLLM) == state.instance_id
                )
                if mine and idle and state.instance_id != bound_instance and not current:
                    log.info("deleting obsolete instance %s of ISC %s on launcher %s", state.instance_id, isc_name,
                             pods.name(launcher))  # fmt: skip
                    await w.clients.launchers.delete_instance(pod_ip, state.instance_id, isc_name)
        return None


def _sooner(a: float | None, b: float | None) -> float | None:
    return min((x for x in (a, b) if x is not None), default=None)


# ----- the requester-level steps


async def _nothing(p: Pass) -> float | None:
    return None


async def _conflicted(p: Pass) -> float | None:
    raise RequesterProblem(f"requester {p.s.name} is bound to several providers: "
                           f"{', '.join((pods.name(p.provider), *p.s.others))}")  # fmt: skip


async def _invalid(p: Pass) -> float | None:
    raise RequesterProblem(
        f"the annotations {keys.SERVER_PATCH_ANNOTATION} and {keys.INFERENCE_SERVER_CONFIG_ANNOTATION} "
        "exclude each other",
        retry=False,
    )


async def _unhold(p: Pass) -> float | None:
    await p.update(p.requester, lambda pod: set_finalizer(pod, keys.REQUESTER_FINALIZER, False), "no running provider")
    return None


async def _cordoned(p: Pass) -> float | None:
    await p.delete(p.requester, f"node {pods.node_name(p.requester)} is cordoned and no provider is bound")
    return None


async def _lost(p: Pass) -> float | None:
    instance = p.s.instance
    if instance is not None and instance.status is InstanceStatus.STOPPED:
        why = f"its instance {p.s.wanted} stopped with exit code {instance.exit_code}"
        if instance.stop_reason is not None:
            why += f" ({instance.stop_reason})"
        await p.lose(why)
    else:
        await p.lose(f"its instance {p.s.wanted} vanished from launcher")
    return None


async def _settle(p: Pass) -> float | None:
    """Bring the requester's metadata in line with its binding, and its status with this (clean) pass."""
    target = settled(p.requester, p.s, status=status_json([]))
    await p.update(p.requester, lambda pod: pod.update(target), "binding")
    return None


async def _record_gpus(p: Pass) -> float | None:
    """Ask the requester for its GPUs once; the annotation keeps them for every later pass (its update
    brings the next one)."""
    requester = p.requester
    try:
        gpus = await p.clients.requesters.gpu_uuids(requester, p.s.isc_name)
    except HttpError as err:
        age = pods.container_age_s(requester)
        if err.reply is None and (age is None or age < SPI_STARTUP_WINDOW_S):
            # Its process is still starting and nothing announces when it listens: look again
            # soon rather than after an exponential back-off that would outlast the start-up.
            return SPI_STARTUP_RETRY_S
        raise RequesterProblem(f"cannot query the requester's GPUs: {err}") from None
    if not gpus:
        raise RequesterProblem("the assigned set of GPUs is empty")
    await p.update(
        requester, lambda pod: set_annotation(pod, keys.ACCELERATORS_ANNOTATION, ",".join(gpus)), "record GPUs"
    )
    return None
