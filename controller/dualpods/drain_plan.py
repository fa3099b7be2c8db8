"""Where the sleepers of a draining launcher go: a pure plan, from what the launchers hold now.

A launcher on a cordoned Node (a drain, a node-pool upgrade) holds sleeping instances that a scale-up would
wake in seconds; when the launcher goes, they go with it and the next scale-up starts cold. Before it may go
(controller/dualpods/drains.py), each of its sleepers gets a copy, asleep, on a launcher of the same
LauncherConfig on a schedulable Node: the same InferenceServerConfig (its current version) on GPUs of that
Node, so that a requester scheduled there onto those GPUs binds to it hot.

A sleeper is *covered* when another launcher on a schedulable Node holds an instance of its ISC's current
version: asleep, or awake serving a requester (it moved with its requester). Otherwise the plan either sleeps
a copy that is ready (one made for this drain, marked with the INSTANCE_REWARMED_FROM annotation), waits for
one that loads, or creates one on the launcher with the most room (fewest instances) that fits every limit:
`maxInstances`, a free port, the host sleeper budget without deleting another sleeper, and as many known GPUs
of its Node as the sleeper has, the least used first. A sleeper no launcher can take is *stranded*, with why;
it does not hold the drain.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from api import keys
from api.crds import InferenceServerConfig
from api.launcher import InstanceState, InstanceStatus
from controller.dualpods.copies import Create, LauncherFacts, Sleep, as_created, no_room
from controller.dualpods.identity import VLLM, instance_id, launcher_instance_config

INSTANCE_REWARMED_FROM = "rewarmed-from"  # instance annotation: the launcher whose sleeper this copies


@dataclass
class DrainPlan:
    creates: list[Create] = field(default_factory=list)
    sleeps: list[Sleep] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # sleepers whose copy is loading
    covered: dict[str, str] = field(default_factory=dict)  # sleeper -> the launcher holding its copy
    stranded: dict[str, str] = field(default_factory=dict)  # sleeper -> why no launcher can take it

    @property
    def done(self) -> bool:
        """Nothing left to do or wait for: the launcher may go."""
        return not (self.creates or self.sleeps or self.waiting)


def sleeping(states: Sequence[InstanceState]) -> list[InstanceState]:
    return [s for s in states if s.sleeping and s.status is InstanceStatus.RUNNING]


def plan(
    source: LauncherFacts, others: Sequence[LauncherFacts], iscs: Mapping[str, InferenceServerConfig]
) -> DrainPlan:
    """What to do now for each sleeper of `source`, given the other launchers (`available` ones may take copies)."""
    result = DrainPlan()
    targets = [o for o in others if o.available and o.config_name == source.config_name and o.config is not None]
    planned: dict[str, list[InstanceState]] = {t.name: list(t.instances) for t in targets}
    for sleeper in sleeping(source.instances):
        isc_name = (sleeper.annotations or {}).get(keys.INSTANCE_ISC_NAME)
        isc = iscs.get(isc_name or "")
        runtime = sleeper.runtime or VLLM
        if isc_name is None or isc is None:
            result.stranded[sleeper.instance_id] = f"its InferenceServerConfig {isc_name or '(none)'} is gone"
            continue
        if instance_id(isc, list(sleeper.gpu_uuids or []), runtime) != sleeper.instance_id:
            result.stranded[sleeper.instance_id] = f"it is of an older version of {isc_name}"
            continue
        copies = [
            (target, state)
            for target in targets
            for state in planned[target.name]
            if _copy_of(state, isc, isc_name, runtime)
        ]
        if not copies:
            _create(result, source.name, sleeper, isc, isc_name, runtime, targets, planned)
            continue
        target, copy = min(copies, key=lambda found: _progress(found[0], found[1]))
        if copy.sleeping or copy.instance_id == target.bound_instance:
            result.covered[sleeper.instance_id] = target.name
        elif copy.ready and (copy.annotations or {}).get(INSTANCE_REWARMED_FROM) == source.name:
            result.sleeps.append(Sleep(target.name, copy, isc_name))
        else:
            result.waiting.append(sleeper.instance_id)
    return result


def _copy_of(state: InstanceState, isc: InferenceServerConfig, isc_name: str, runtime: str) -> bool:
    """An instance of the current version of `isc` (on whatever GPUs), running."""
    if state.status is not InstanceStatus.RUNNING or (state.annotations or {}).get(keys.INSTANCE_ISC_NAME) != isc_name:
        return False
    return instance_id(isc, list(state.gpu_uuids or []), state.runtime or VLLM) == state.instance_id and (
        (state.runtime or VLLM) == runtime
    )


def _progress(target: LauncherFacts, state: InstanceState) -> int:
    """Which copy tells the most: asleep or serving (0), ready (1), loading (2)."""
    if state.sleeping or state.instance_id == target.bound_instance:
        return 0
    return 1 if state.ready else 2


def _create(
    result: DrainPlan,
    source: str,
    sleeper: InstanceState,
    isc: InferenceServerConfig,
    isc_name: str,
    runtime: str,
    targets: Sequence[LauncherFacts],
    planned: dict[str, list[InstanceState]],
) -> None:
    wanted_gpus = len(sleeper.gpu_uuids or [])
    port = isc.spec.model_server_config.port
    incoming = sleeper.process.rss_bytes if sleeper.process else 0
    reasons = []
    for target in sorted(targets, key=lambda t: (len(planned[t.name]), t.name)):
        assert target.config is not None
        held = planned[target.name]
        gpus = _least_used(target.gpus, held, wanted_gpus)
        if (why := no_room(target, held, port, incoming)) is not None:
            reasons.append(why)
        elif gpus is None:
            reasons.append(f"{target.name}'s node {target.node} has fewer than {wanted_gpus} known GPUs")
        else:
            config = launcher_instance_config(isc, target.config, gpus, runtime)
            config.annotations = {**(config.annotations or {}), INSTANCE_REWARMED_FROM: source}
            created = instance_id(isc, gpus, runtime)
            result.creates.append(Create(target.name, created, config, isc_name))
            held.append(as_created(created, config))
            return
    result.stranded[sleeper.instance_id] = (
        "; ".join(reasons) or "no launcher of its LauncherConfig on a schedulable node"
    )


def _least_used(gpus: Sequence[str], held: Sequence[InstanceState], count: int) -> list[str] | None:
    """`count` of `gpus`, those with the fewest instances on them first (None: not enough known)."""
    if len(gpus) < count:
        return None
    load = {gpu: sum(gpu in (s.gpu_uuids or []) for s in held) for gpu in gpus}
    return sorted(sorted(gpus, key=lambda g: (load[g], g))[:count])
