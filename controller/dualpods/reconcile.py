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

import itertools
import logging
from datetime import UTC, datetime

from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from api.crds import InferenceServerConfig
from api.launcher import InstanceStatus
from api.log_format import PASS_FIELD, PHASE_FIELD, REQUESTER_FIELD, log_context
from controller import pods
from controller.dualpods.identity import VLLM, instance_id
from controller.dualpods.isc_status import isc_status, observe_isc
from controller.dualpods.memory import Memory
from controller.dualpods.passes import Pass, World
from controller.dualpods.phases import ROW, Phase, classify
from controller.dualpods.requester_client import RequesterError
from controller.dualpods.snapshot import observe, parse
from controller.dualpods.status import Outcome, RequesterProblem, new_errors, reported_errors, status_json
from controller.dualpods.writer import set_annotation
from controller.kube import refusal

log = logging.getLogger(__name__)

LAUNCHERS = "launchers"  # pod index: "true" -> every launcher Pod


class Reconciler:
    def __init__(self, world: World) -> None:
        self.world = world
        self._pass_ids = itertools.count(1)

    @property
    def memory(self) -> Memory:
        return self.world.memory

    # ----- one inference server

    async def reconcile_requester(self, name: str) -> float | None:
        """One pass; returns when to look again. A problem is raised after it is reported (the queue's
        back-off), unless only a change to some object can settle it."""
        w = self.world
        with log_context(**{REQUESTER_FIELD: name, PASS_FIELD: str(next(self._pass_ids))}):
            p = Pass(w, observe(w.namespace, name, w.caches, w.views))
            phase = classify(p.s)
            with log_context(**{PHASE_FIELD: phase.value}):
                self._note_phase(name, phase)
                outcome = await self._act(p, phase)
                if outcome.changed:
                    log.debug("changed: %s", "; ".join(outcome.changed))
                await self._report(p, outcome)
        if outcome.failure is not None:
            raise outcome.failure
        return outcome.again_after

    def _note_phase(self, name: str, phase: Phase) -> None:
        """Log a requester's change of phase at INFO, once (a pass that stays in its phase logs at debug)."""
        before = self.memory.phases.get(name)
        if before == phase.value:
            log.debug("requester %s: %s", name, phase.value)
            return
        log.info("requester %s: %s → %s", name, before or "(new)", phase.value)
        self.memory.phases[name] = phase.value

    async def _act(self, p: Pass, phase: Phase) -> Outcome:
        try:
            again = await ROW[phase].step(p)
            if ROW[phase].serves is False and p.s.requester is not None and not p.written:
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
            await p.warn(requester, "ActuationProblem", error)
        status = status_json(outcome.errors)
        try:
            await p.update(requester, lambda pod: set_annotation(pod, keys.STATUS_ANNOTATION, status), "status")
        except ApiException as err:
            if err.status not in (404, 409):  # gone, or changed meanwhile: the next pass reports
                raise

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
