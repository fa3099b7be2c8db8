"""What `kubectl get isc` shows: an InferenceServerConfig's status, computed by the dual-pods controller
(its only writer) from one frozen look at the ISC, its LauncherConfig and the requesters naming it.

`observe_isc` takes that look from the caches; the pure `isc_status` finds the ISC's problems (`InvalidSpec`:
it does not parse, asks for an unknown runtime, or routing metadata a launcher cannot carry;
`LauncherConfigNotFound`; `TemplateError`: its LauncherConfig cannot make a launcher Pod, which are the
checks a bind makes before it binds), counts its instances serving and asleep on launchers (from the launcher
Pods' summaries, api/launcher_summary.py) and counts the requesters it serves: bound, and told they are ready
(their container is ready, which only the controller's readiness relay makes it). Ready is `Serving` with at
least one; `Starting` while requesters wait; `NoRequesters` when none names it. The status is compared
with the one the ISC carries and written only when it differs (conditions.py, status_writer.py).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from api import keys, launcher_summary
from api.crds import POOL_READY, InferenceServerConfig, InferenceServerConfigStatus, LauncherConfig, PoolStatus
from controller import pods
from controller.conditions import Fault, Readiness, computed, current
from controller.dualpods.identity import runtime_of
from controller.dualpods.pools.filling import Filling, Verdict
from controller.dualpods.routing import from_isc, problems
from controller.dualpods.snapshot import Caches, Parsed, parse
from controller.launcher_template import TemplateError, node_independent_pod
from kube.informer import Obj

REQUESTERS_BY_ISC = "requesters-by-isc"  # pod index: ISC name -> the requesters naming it
LAUNCHERS_BY_SUMMARY_ISC = "launchers-by-summary-isc"  # pod index: ISC name -> launchers holding an instance of it


@dataclass(frozen=True)
class IscSnapshot:
    """One ISC at one moment: as cached (None when gone), parsed, its LauncherConfig, its requesters."""

    obj: Obj | None
    isc: Parsed[InferenceServerConfig]
    launcher_config_name: str
    launcher_config: Parsed[LauncherConfig]  # nothing parsed when the ISC names none
    requesters: tuple[pods.Pod, ...]
    instances: tuple[int, int]  # its instances serving, and sleeping (launcher_summary.counts)
    pool: Filling | None = None  # its warm pool, as its keeper last found it (None: none declared, or not looked at)


def observe_isc(namespace: str, name: str, caches: Caches, pools: Mapping[str, Filling]) -> IscSnapshot:
    obj = caches.iscs.get(f"{namespace}/{name}")
    isc = parse(InferenceServerConfig, caches.iscs, namespace, name)
    lc_name = str(((obj or {}).get("spec") or {}).get("launcherConfigName") or "")
    lc = parse(LauncherConfig, caches.lcs, namespace, lc_name) if lc_name else Parsed[LauncherConfig]()
    summaries = (launcher_summary.of_pod(pod) for pod in caches.pods.by_index(LAUNCHERS_BY_SUMMARY_ISC, name))
    instances = launcher_summary.counts((summary for summary in summaries if summary is not None), name)
    requesters = tuple(caches.pods.by_index(REQUESTERS_BY_ISC, name))
    return IscSnapshot(obj, isc, lc_name, lc, requesters, instances, pools.get(name))


def summary_iscs(pod: pods.Pod) -> list[str]:
    """The ISCs a launcher Pod's summary names (for LAUNCHERS_BY_SUMMARY_ISC)."""
    summary = launcher_summary.of_pod(pod) if pods.is_launcher(pod) else None
    return sorted({entry.isc for entry in summary.instances if entry.isc}) if summary else []


def served(requester: pods.Pod) -> bool:
    """Bound and told it is ready (and not on its way out)."""
    bound = keys.DUAL_LABEL in pods.labels(requester)
    return bound and pods.container_ready(requester) and not pods.is_deleting(requester)


def isc_status(s: IscSnapshot, token_secret: str | None, now: datetime) -> InferenceServerConfigStatus | None:
    """The status the ISC should carry (None when it is gone)."""
    if s.obj is None:
        return None
    requesters = [r for r in s.requesters if not pods.is_deleting(r)]
    count = sum(1 for r in requesters if served(r))
    if count:
        readiness = Readiness(True, "Serving", f"{count} of {len(requesters)} requesters served")
    elif requesters:
        readiness = Readiness(False, "Starting", f"0 of {len(requesters)} requesters served")
    else:
        readiness = Readiness(False, "NoRequesters", "no server-requesting Pod names it")
    generation = int(s.obj["metadata"].get("generation", 0))
    shown = current(InferenceServerConfigStatus, s.obj)
    serving, sleeping = s.instances
    pool, also = _pool(s)
    return computed(shown, generation, _problems(s, token_secret), readiness, now, also, served_requesters=count,
                    serving_instances=serving, sleeping_instances=sleeping, pool=pool)  # fmt: skip


def _pool(s: IscSnapshot) -> tuple[PoolStatus | None, dict[str, Readiness]]:
    """`status.pool` and the PoolReady condition, when the ISC declares a pool (until its keeper's first look, the
    pool is shown as declared and not filled yet)."""
    isc = s.isc.value
    declared = isc.spec.warm_pool if isc is not None else None
    if declared is None:
        return None, {}
    found = s.pool or Filling(declared.sleepers, 0, 0, 0, Verdict.FILLING, "the pool keeper has not looked yet")
    status = PoolStatus(declared=declared.sleepers, ready=found.ready, loading=found.loading, nodes=found.nodes)
    return status, {POOL_READY: Readiness(found.verdict is Verdict.FILLED, found.verdict.value, found.why)}


def _problems(s: IscSnapshot, token_secret: str | None) -> list[Fault]:
    isc, lc = s.isc.value, s.launcher_config.value
    if isc is None:
        return [Fault("InvalidSpec", str(s.isc.problem))]
    found: list[Fault] = []
    try:
        runtime_of({}, isc.metadata.annotations)
    except ValueError as err:
        found.append(Fault("InvalidSpec", str(err)))
    if not s.launcher_config_name or s.launcher_config.missing:
        return [*found, Fault("LauncherConfigNotFound", f"LauncherConfig {s.launcher_config_name} does not exist")]
    if lc is None:
        return [*found, Fault("TemplateError", str(s.launcher_config.problem))]
    try:
        template, _ = node_independent_pod(lc, token_secret)
    except TemplateError as err:
        return [*found, Fault("TemplateError", str(err))]
    meta: Mapping[str, Any] = template["metadata"]
    if routing := problems(from_isc(isc), meta["labels"], meta["annotations"]):
        found.append(Fault("InvalidSpec", f"InferenceServerConfig {isc.metadata.name}: " + "; ".join(routing)))
    return found
