"""What a warm pool needs now, from what the launchers hold: a pure plan (the keeper, keeper.py, carries it out).

A pool's copy is a sleeping instance of its InferenceServerConfig's current version. It is *ready* when a requester
could wake it now: asleep in a launcher that is Ready, unbound and not promised to a requester, on a GPU nothing
holds, of a schedulable Node the pool selects. A copy in the making is *loading*: made by this keeper (or a drain),
awake and not serving anyone; once ready it is put to sleep (if the host budget can hold it; else it goes). When
ready + loading fall short of the declared count, copies are created on *idle* GPUs (no awake instance, no requester
holding them or on its way) of Nodes that hold fewest copies yet (so that they spread over `minNodes` at least), in
a launcher with room for one more instance (`maxInstances`, its port, the host budget without deleting a sleeper,
the GPU sleeper budget). A copy in the making whose GPUs a requester of another model got meanwhile goes: a pool never
competes with real demand. A copy a requester of its model took over (on its way to it, or bound to it) has left the
pool: it serves.
"""

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from api import keys
from api.crds import InferenceServerConfig, WarmPool
from api.launcher import InstanceState, InstanceStatus
from controller.dualpods.copies import Create, LauncherFacts, Sleep, as_created, no_room
from controller.dualpods.drain_plan import INSTANCE_REWARMED_FROM
from controller.dualpods.identity import instance_id, launcher_instance_config
from controller.dualpods.memory_budget import SLEEPER_GPU_BYTES, host_victims
from controller.dualpods.pools.filling import Verdict
from controller.dualpods.sleepers import sleepers


@dataclass(frozen=True)
class NodeFacts:
    """A Node as the pool sees it: whether it may hold copies, its GPUs and which of them are held."""

    name: str
    selected: bool  # schedulable, and the pool's selector picks it
    gpus: Sequence[str]
    # GPU -> the ISCs ("": not known) of the requesters that hold it, or are on their way to it (placed, or
    # promised at admission)
    held: Mapping[str, frozenset[str]]
    awake: frozenset[str]  # by instances that are awake or starting, of any launcher there
    room: int  # GPUs free beyond those held and those of requesters whose GPUs are not known yet
    sleepers: Mapping[str, int]  # GPU -> sleeping instances on it

    def free(self, gpus: Sequence[str]) -> bool:
        return not set(gpus) & (self.held.keys() | self.awake)

    def holders(self, gpus: Sequence[str]) -> set[str]:
        """The ISCs of the requesters holding any of `gpus`."""
        return {isc for gpu in gpus for isc in self.held.get(gpu, ())}


@dataclass(frozen=True)
class Copy:
    launcher: str
    node: str
    instance: InstanceState


@dataclass
class PoolPlan:
    ready: list[Copy] = field(default_factory=list)
    loading: list[Copy] = field(default_factory=list)
    creates: list[Create] = field(default_factory=list)
    sleeps: list[Sleep] = field(default_factory=list)
    deletes: list[Copy] = field(default_factory=list)  # copies in the making that a requester's GPU or a budget ends
    verdict: Verdict = Verdict.FILLED
    why: str = ""

    def nodes(self) -> set[str]:
        return {c.node for c in self.ready}


def plan_pool(
    isc: InferenceServerConfig,
    runtime: str,
    launchers: Sequence[LauncherFacts],
    nodes: Mapping[str, NodeFacts],
    copy_bytes: int,
) -> PoolPlan:
    """What to do now for `isc`'s pool. `launchers`: those of its LauncherConfig with the current template (their
    `available` says Ready, synced, unbound, not promised); `copy_bytes`: what a copy holds asleep, where known."""
    pool = isc.spec.warm_pool or WarmPool(sleepers=0)
    name = isc.metadata.name
    result = PoolPlan()
    wanted: dict[tuple[str, ...], str] = {}
    held: dict[str, list[InstanceState]] = {}
    for launcher in launchers:
        held[launcher.name] = list(launcher.instances)
        node = nodes.get(launcher.node)
        for state in launcher.instances:
            gpus = tuple(state.gpu_uuids or ())
            if (
                state.status is not InstanceStatus.RUNNING
                or (state.annotations or {}).get(keys.INSTANCE_ISC_NAME) != name
            ):
                continue
            if state.instance_id != wanted.setdefault(gpus, instance_id(isc, list(gpus), runtime)):
                continue  # of an older version, or another runtime: not a copy of this pool
            copy = Copy(launcher.name, launcher.node, state)
            if state.sleeping:
                if launcher.available and node is not None and node.selected and node.free(gpus):
                    result.ready.append(copy)
            elif state.instance_id != launcher.bound_instance and _made_as_copy(state):
                _in_the_making(result, copy, launcher, node, name)
    missing = pool.sleepers - len(result.ready) - len(result.loading)
    covered = {c.node for c in (*result.ready, *result.loading)}
    spread_short = min(pool.min_nodes, pool.sleepers) - len(covered)
    reasons: collections.Counter[Verdict] = collections.Counter()
    for _ in range(max(missing, spread_short)):
        create = _place(isc, runtime, pool, launchers, nodes, held, covered if spread_short > 0 else set(), copy_bytes,
                        reasons)  # fmt: skip
        if create is None:
            break
        result.creates.append(create)
        covered.add(next(launcher.node for launcher in launchers if launcher.name == create.target))
        spread_short -= 1
    short = pool.sleepers - len(result.ready)
    if short <= 0:
        result.verdict = Verdict.FILLED
        result.why = f"{len(result.ready)} of {pool.sleepers} copies asleep on {len(result.nodes())} Node(s)"
    elif result.loading or result.creates:
        result.verdict = Verdict.FILLING
        result.why = (f"{len(result.ready)} of {pool.sleepers} copies asleep, "
                      f"{len(result.loading) + len(result.creates)} loading")  # fmt: skip
    else:
        result.verdict = max(reasons, key=lambda v: (reasons[v], v)) if reasons else Verdict.NO_LAUNCHER
        result.why = f"{len(result.ready)} of {pool.sleepers} copies asleep; {_explained(result.verdict)}"
    return result


def _isc_of(state: InstanceState) -> str | None:
    return (state.annotations or {}).get(keys.INSTANCE_ISC_NAME)


def _made_as_copy(state: InstanceState) -> bool:
    annotations = state.annotations or {}
    return keys.INSTANCE_POOL in annotations or INSTANCE_REWARMED_FROM in annotations


def _in_the_making(result: PoolPlan, copy: Copy, launcher: LauncherFacts, node: NodeFacts | None, name: str) -> None:
    """A copy awake and serving no one: it sleeps once ready, else loads. A requester of the same model that got its
    GPUs is on its way to take it over (its bind finds the instance there): it has left the pool, and is left alone.
    A requester of another model that got them needs them: the copy goes."""
    state = copy.instance
    holders = node.holders(state.gpu_uuids or ()) if node is not None else set()
    if holders == {name}:
        return
    if holders:
        result.deletes.append(copy)
        return
    result.loading.append(copy)
    if not state.ready:
        return
    budget = launcher.config.spec.sleeper_budget.host_memory_bytes if launcher.config is not None else None
    incoming = state.process.rss_bytes if state.process else 0
    others = sleepers(list(launcher.instances), exclude=state.instance_id)
    if budget is not None and host_victims(others, incoming, int(budget)) != []:
        result.loading.remove(copy)
        result.deletes.append(copy)  # asleep it would push another sleeper out, or not fit at all
        return
    result.sleeps.append(Sleep(copy.launcher, state, name))


def _place(
    isc: InferenceServerConfig,
    runtime: str,
    pool: WarmPool,
    launchers: Sequence[LauncherFacts],
    nodes: Mapping[str, NodeFacts],
    held: dict[str, list[InstanceState]],
    only_beyond: set[str],
    copy_bytes: int,
    reasons: collections.Counter[Verdict],
) -> Create | None:
    """One more copy where it fits best: the Node with fewest copies of the pool, then most idle GPUs holding no
    sleeper (a copy alone on its GPU is woken without blocking another model's), then most idle GPUs, the launcher
    with fewest instances; on its GPUs with fewest sleepers. With `only_beyond`, only on a Node not among those (to
    spread the pool)."""
    port = isc.spec.model_server_config.port
    copies = collections.Counter(
        launcher.node for launcher in launchers for state in held[launcher.name] if _isc_of(state) == isc.metadata.name
    )
    candidates = []
    any_launcher = any_idle = False  # on a selected Node, whether or not that launcher may take a copy now
    for launcher in launchers:
        node = nodes.get(launcher.node)
        if launcher.config is None or node is None or not node.selected or launcher.node in only_beyond:
            continue
        any_launcher = True
        idle = _idle_gpus(node, held, launchers, isc.metadata.name)
        any_idle = any_idle or (len(idle) >= pool.gpus and node.room >= pool.gpus)
        if launcher.available:
            empty = sum(1 for gpu in idle if not node.sleepers.get(gpu))
            rank = (copies[launcher.node], -empty, -len(idle), len(held[launcher.name]), launcher.name)
            candidates.append((rank, launcher, idle))
    if not candidates:
        reasons[Verdict.NO_IDLE_GPU if any_launcher and not any_idle else Verdict.NO_LAUNCHER] += 1
        return None
    for _, launcher, idle in sorted(candidates, key=lambda c: c[0]):
        assert launcher.config is not None
        node = nodes[launcher.node]
        gpus = sorted(sorted(idle, key=lambda g: (node.sleepers.get(g, 0), g))[: pool.gpus])
        if len(gpus) < pool.gpus or node.room < pool.gpus:
            reasons[Verdict.NO_IDLE_GPU] += 1
            continue
        gpu_budget = launcher.config.spec.sleeper_budget.gpu_memory_bytes
        over_gpu = gpu_budget is not None and any(
            (node.sleepers.get(g, 0) + 1) * SLEEPER_GPU_BYTES > int(gpu_budget) for g in gpus
        )
        if over_gpu or no_room(launcher, held[launcher.name], port, copy_bytes) is not None:
            reasons[Verdict.BUDGET] += 1
            continue
        config = launcher_instance_config(isc, launcher.config, gpus, runtime)
        config.annotations = {**(config.annotations or {}), keys.INSTANCE_POOL: isc.metadata.name}
        created = instance_id(isc, gpus, runtime)
        held[launcher.name].append(as_created(created, config))
        return Create(launcher.name, created, config, isc.metadata.name)
    return None


def _idle_gpus(
    node: NodeFacts, held: dict[str, list[InstanceState]], launchers: Sequence[LauncherFacts], isc_name: str
) -> list[str]:
    """The Node's GPUs that nothing holds (no requester, no awake instance, no copy this plan makes) and that hold
    no copy of the pool yet (two on one GPU could not both be woken)."""
    taken = {
        gpu
        for launcher in launchers
        if launcher.node == node.name
        for index, state in enumerate(held[launcher.name])
        if index >= len(launcher.instances) or _isc_of(state) == isc_name
        for gpu in state.gpu_uuids or ()
    }
    return [gpu for gpu in node.gpus if gpu not in node.held.keys() | node.awake | taken]


def _explained(verdict: Verdict) -> str:
    return {
        Verdict.NO_LAUNCHER: "no Ready, unbound launcher of its LauncherConfig on a schedulable Node the pool selects",
        Verdict.NO_IDLE_GPU: "no idle GPU (every GPU of those Nodes is held by an awake instance or a requester)",
        Verdict.BUDGET: "the launchers with an idle GPU hold maxInstances, or their sleeper budgets are full",
    }[verdict]
