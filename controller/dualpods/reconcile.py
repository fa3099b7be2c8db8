"""Reconciling one inference server: a server-requesting Pod and the provider bound to it.

Each pass is observe → classify → act. `observe` freezes what the caches and the launcher views hold
about the requester (snapshot.py); the pure `classify` names its phase (phases.py); the phase's one step
does the work and returns Done, Wait or Problem (outcomes.py), and the pass ends in an Outcome (status.py):
the errors it met, when to look again, what it changed. A wait or a transient failure that stands past its
phase's budget becomes an error too. Every line a pass logs carries the requester, the phase and the pass's
ID (api/log_format.log_context). A step makes one decisive change (a write, a launcher call) and returns;
the watch event that change causes brings the next pass (a pass that comes earlier, its cache not showing
the change yet, waits for it: memory.py). The few steps that must do more say so in their
docstrings; each of their parts is idempotent. Every durable fact lives in API objects — the binding in the provider's
`requester` annotation, the instance in the launcher's annotations, the GPUs in the requester's
`accelerators` annotation, what the user was told in its status annotation — so a restarted controller
carries on where it stopped, and reports nothing twice.

The status annotation and its Events are computed from the outcome and compared with what the requester
already shows: written only when it differs, an Event only for an error not shown yet; the requester's
metadata the steps asked for goes in the same write (status.desired_requester).
"""

import itertools
import logging
import time
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
from controller.dualpods.outcomes import Problem, Wait, sooner
from controller.dualpods.passes import Pass, World
from controller.dualpods.phases import ROW, Phase, Row, classify
from controller.dualpods.requester_client import RequesterError
from controller.dualpods.snapshot import observe, parse
from controller.dualpods.status import Outcome, RequesterProblem, Result, new_errors
from controller.kube import refusal

log = logging.getLogger(__name__)

LAUNCHERS = "launchers"  # pod index: "true" -> every launcher Pod
# A pass whose cache does not show this controller's last write of its Pods yet waits for that write's
# watch event (which brings the next pass); this long at most, should the event not come.
BEHIND_RECHECK_S = 1.0


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
            if self.memory.behind(p.s.requester) or self.memory.behind(p.s.provider):
                log.debug("the cache does not show this controller's last write yet")
                return BEHIND_RECHECK_S
            row = ROW[classify(p.s)]
            with log_context(**{PHASE_FIELD: row.phase.value}):
                self._note_phase(name, row.phase)
                outcome = self._within_budget(p, row, await self._act(p, row))
                w.metrics.passes.labels(row.phase.value, outcome.result.value).inc()
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

    async def _act(self, p: Pass, row: Row) -> Outcome:
        """Run the phase's step; its result, or an exception (the unexpected), as the pass's outcome."""
        try:
            result = await row.step(p)
            untold = p.s.requester is not None and not p.written and not p.wants
            if row.serves is False and untold and not isinstance(result, Problem):
                result = sooner(result, await p.relay(False))  # its instance does not serve: not Ready
        except RequesterError as problem:
            return Outcome([str(problem)], failure=problem, changed=p.changed, result=Result.PROBLEM)
        except ApiException as err:
            if err.status in (404, 409) or err.status < 400 or err.status >= 500:
                return Outcome(None, failure=err, changed=p.changed, result=Result.ERROR)  # gone, raced, failing
            # The API server refused a write made for this requester: only a change can help, but it is
            # retried with back-off (the change may be to something this controller does not watch).
            _, message = refusal(err)
            error = f"the API server refused a write for this requester ({err.status}): {message}"
            return Outcome([error], failure=RequesterProblem(error), changed=p.changed, result=Result.PROBLEM)
        except Exception as err:  # a launcher or model server that did not answer, a conflict: try again
            return Outcome(None, failure=err, changed=p.changed, result=Result.ERROR)
        if isinstance(result, Problem):
            failure = RequesterProblem(*result.errors) if result.retry else None
            return Outcome(list(result.errors), failure=failure, changed=p.changed, result=Result.PROBLEM)
        # A pass about a binding left by an earlier requester of the name says nothing about this one.
        errors: list[str] | None = None if p.s.stale else []
        if isinstance(result, Wait):
            return Outcome(errors, again_after=result.after_s, changed=p.changed, result=Result.WAIT, why=result.why)
        return Outcome(errors, changed=p.changed)

    def _within_budget(self, p: Pass, row: Row, outcome: Outcome) -> Outcome:
        """A wait or a transient failure that has stood past its phase's budget becomes the requester's status
        error (and so an Event). Since when it stands is kept in memory, per requester UID: a restarted
        controller starts the budget afresh, which only delays the report. A wait is looked at again when its
        budget runs out."""
        requester = p.s.requester
        if requester is None or p.s.stale:
            return outcome
        uid = pods.uid(requester)
        if outcome.result not in (Result.WAIT, Result.ERROR):
            self.memory.troubles.pop(uid, None)
            return outcome
        now, phase = time.monotonic(), row.phase.value
        known = self.memory.troubles.get(uid)
        _, since, failures = known if known is not None and known[0] == phase else (phase, now, 0)
        failed = outcome.result is Result.ERROR
        failures += failed
        self.memory.troubles[uid] = (phase, since, failures)
        budget = self.world.options.budgets.get(phase, row.budget)
        left = budget.seconds - (now - since)  # not since + budget - now: its rounding can exceed the budget
        if left > 0 or (failed and failures < budget.retries):
            if not failed:
                outcome.again_after = min(outcome.again_after or left, max(left, 0.0))
            return outcome
        what = outcome.why if not failed else f"{phase}: {outcome.failure}"
        outcome.errors = [f"{what} (for more than {budget.seconds:.0f} s)"]
        return outcome

    async def _report(self, p: Pass, outcome: Outcome) -> None:
        """Write the requester the pass wants — the metadata its steps asked for, its status showing the outcome's
        errors — in one write (unless a step wrote it already, or deleted it); an Event for each error the
        status does not show yet."""
        requester = p.s.requester
        if requester is None or p.written & {p.s.name}:
            return
        errors = None if pods.is_deleting(requester) else outcome.errors
        if errors is None and not p.wants:
            return
        for error in new_errors(requester, errors or []):
            await p.warn(requester, "ActuationProblem", error)
        try:
            await p.write_requester(errors)
        except ApiException as err:
            if p.wants or err.status not in (404, 409):  # a status alone: gone, or changed meanwhile; the next
                raise  # pass reports

    # ----- an InferenceServerConfig's status

    async def reconcile_isc_status(self, isc_name: str) -> float | None:
        """Bring the ISC's status in line with its LauncherConfig and its requesters (isc_status.py)."""
        w = self.world
        s = observe_isc(w.namespace, isc_name, w.caches, w.memory.pools)
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
