"""Reconciling one inference server: a server-requesting Pod and the provider bound to it.

Each pass is observe → classify → act. `observe` freezes what the caches and the launcher views hold about the
requester (snapshot.py); the pure `classify` names its phase (phases.py); the phase's one step does the work and
returns Done, Wait or Problem (outcomes.py), and the pass ends in an Outcome (status.py): the errors it met, what
the work queue does next (its Result: workqueue.py), what it changed. A wait or a transient failure that stands past
its phase's budget becomes an error too. Every line a pass logs carries the requester, the phase and the pass's ID
(workqueue.pass_context). A step makes one decisive change (a write, a launcher call) and returns; the watch event
that change causes brings the next pass (a pass that comes earlier, its cache not showing the change yet, waits for
it: memory.py). The few steps that must do more say so in their docstrings; each of their parts is idempotent. Every
durable fact lives in API objects — the binding in the provider's `requester` annotation, the instance in the
launcher's annotations, the GPUs in the requester's `accelerators` annotation, what the user was told in its status
annotation — so a restarted controller carries on where it stopped, and reports nothing twice.

The status annotation and its Events are computed from the outcome and compared with what the requester
already shows: written only when it differs, an Event only for an error not shown yet; the requester's
metadata the steps asked for goes in the same write (status.desired_requester).
"""

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from api.crds import InferenceServerConfig
from api.launcher import InstanceStatus
from api.log_format import ISC_FIELD, PHASE_FIELD, REQUESTER_FIELD, log_context
from controller import pods
from controller.dualpods.identity import VLLM, instance_id
from controller.dualpods.isc_status import isc_status, observe_isc
from controller.dualpods.memory import Memory, Trouble
from controller.dualpods.outcomes import DONE, Problem, TimeBudget, Wait, sooner
from controller.dualpods.passes import Pass, World
from controller.dualpods.phases import ROW, ROWS, Phase, Row, classify
from controller.dualpods.requester_client import RequesterError
from controller.dualpods.snapshot import observe, parse
from controller.dualpods.status import Ending, Outcome, new_errors
from controller.http import HttpError
from kube.client import API_FAILURES, refusal
from kube.workqueue import Result, pass_context

log = logging.getLogger(__name__)

LAUNCHERS = "launchers"  # pod index: "true" -> every launcher Pod
# A pass whose cache does not show this controller's last write of its Pods yet waits for that write's
# watch event (which brings the next pass); this long at most, should the event not come.
BEHIND_RECHECK_S = 1.0
# What a step may meet that says nothing about the requester: a launcher, requester or model server that does
# not answer (HttpError), an API server that does not answer or a conflict (API_FAILURES; an ApiException is a
# refusal the requester is told of when the API server refused the write for what it asked: `_refused`).
TRANSIENT = (HttpError, *API_FAILURES)


class Reconciler:
    def __init__(self, world: World, budgets: Mapping[Phase, TimeBudget] | None = None) -> None:
        """`budgets`: the phases whose time budget a flag sets (else their row's)."""
        self.world = world
        self.budgets = {row.phase: row.budget for row in ROWS} | dict(budgets or {})

    @property
    def memory(self) -> Memory:
        return self.world.memory

    # ----- one inference server

    async def reconcile_requester(self, name: str) -> Result:
        """One pass; its Result says what the work queue does next (workqueue.py). What the user must see
        (status, Events) is reported before it is returned."""
        w = self.world
        with pass_context(**{REQUESTER_FIELD: name}):
            p = Pass(w, observe(w.namespace, name, w.caches, w.views))
            if self.memory.behind(p.s.requester) or self.memory.behind(p.s.provider):
                log.debug("the cache does not show this controller's last write yet")
                return Wait(BEHIND_RECHECK_S, "the cache does not show this controller's last write yet")
            row = ROW[classify(p.s)]
            with log_context(**{PHASE_FIELD: row.phase.value}):
                self._note_phase(name, row.phase)
                outcome = self._within_budget(p, row, await self._act(p, row))
                w.metrics.passes.labels(row.phase.value, outcome.ending.value).inc()
                if outcome.changed:
                    log.debug("changed: %s", "; ".join(outcome.changed))
                await self._report(p, outcome)
        return outcome.next

    def _note_phase(self, name: str, phase: Phase) -> None:
        """Log a requester's change of phase at INFO, once (a pass that stays in its phase logs at debug)."""
        before = self.memory.phases.get(name)
        if before == phase.value:
            log.debug("requester %s: %s", name, phase.value)
            return
        log.info("requester %s: %s → %s", name, before or "(new)", phase.value)
        self.memory.phases[name] = phase.value

    async def _act(self, p: Pass, row: Row) -> Outcome:
        """Run the phase's step; its result as the pass's outcome. A failure the pass expects (a launcher, a
        requester or the API server that did not answer, a conflict, a refused write) is a back-off; any
        other exception is a bug, left to the work queue (logged with the pass's context, backed off)."""
        try:
            result = await row.step(p)
            untold = p.s.requester is not None and not p.written and not p.wants
            if row.serves is False and untold and not isinstance(result, Problem):
                result = sooner(result, await p.relay(False))  # its instance does not serve: not Ready
        except RequesterError as problem:  # it answered, but not usefully: shown, and asked again
            result = Problem.of(str(problem))
        except ApiException as err:
            if not _refused(err):  # gone, raced, failing
                return Outcome(None, Problem.of(str(err)), p.changed, Ending.ERROR)
            # The API server refused a write made for this requester: only a change can help, but it is
            # retried with back-off (the change may be to something this controller does not watch).
            _, message = refusal(err)
            result = Problem.of(f"the API server refused a write for this requester ({err.status}): {message}")
        except TRANSIENT as err:  # a launcher or model server that did not answer: try again
            return Outcome(None, Problem.of(str(err)), p.changed, Ending.ERROR)
        if isinstance(result, Problem):
            return Outcome(list(result.errors), result, p.changed, Ending.PROBLEM)
        # A pass about a binding left by an earlier requester of the name says nothing about this one.
        errors: list[str] | None = None if p.s.stale else []
        return Outcome(errors, result, p.changed, Ending.WAIT if isinstance(result, Wait) else Ending.DONE)

    def _within_budget(self, p: Pass, row: Row, outcome: Outcome) -> Outcome:
        """A wait or a transient failure that has stood past its phase's budget becomes the requester's status
        error (and so an Event). Since when it stands is kept in memory, per requester UID: a restarted
        controller starts the budget afresh, which only delays the report. A wait is looked at again when its
        budget runs out."""
        requester = p.s.requester
        if requester is None or p.s.stale:
            return outcome
        uid = pods.uid(requester)
        if outcome.ending not in (Ending.WAIT, Ending.ERROR):
            self.memory.troubles.pop(uid, None)
            return outcome
        now, phase = time.monotonic(), row.phase
        known = self.memory.troubles.get(uid)
        trouble = known if known is not None and known.phase == phase else Trouble(phase, now, 0)
        failed = outcome.ending is Ending.ERROR
        trouble = trouble._replace(failures=trouble.failures + failed)
        self.memory.troubles[uid] = trouble
        since, failures, budget = trouble.since, trouble.failures, self.budgets[phase]
        left = budget.seconds - (now - since)  # not since + budget - now: its rounding can exceed the budget
        wait = outcome.next if isinstance(outcome.next, Wait) else None
        if left > 0 or (failed and failures < budget.retries):
            if wait is not None:
                outcome.next = Wait(min(wait.after_s or left, max(left, 0.0)), wait.why)
            return outcome
        what = wait.why if wait is not None else f"{phase}: {outcome.next}"
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

    async def reconcile_isc_status(self, isc_name: str) -> Result:
        """Bring the ISC's status in line with its LauncherConfig and its requesters (isc_status.py)."""
        w = self.world
        with pass_context(**{ISC_FIELD: isc_name}):
            s = observe_isc(w.namespace, isc_name, w.caches, w.memory.pools)
            status = isc_status(s, w.options.launcher_token_secret, datetime.now(UTC))
            if s.obj is not None and status is not None:
                await w.clients.statuses.write(InferenceServerConfig, s.obj, status)
        return DONE

    # ----- instances of a changed InferenceServerConfig

    async def reconcile_isc(self, isc_name: str) -> Result:
        """Delete sleeping instances made from an older version of this ISC (awake ones go at unbind)."""
        with pass_context(**{ISC_FIELD: isc_name}):
            await self._delete_obsolete(isc_name)
        return DONE

    async def _delete_obsolete(self, isc_name: str) -> None:
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


def _refused(err: ApiException) -> bool:
    """The API server refused the call for what it asked (a 4xx other than gone or conflict)."""
    return 400 <= err.status < 500 and err.status not in (404, 409)
