"""Warm pools: what the keeper plans for a pool from what the launchers hold (controller/dualpods/pools/plan.py), and
which sleepers budgets and reclaims make go first (sleepers.first_to_go). The keeper's loop against the real
apiserver and scheduler, with simulated and with real vLLM launchers, is in e2e/test_pools.py."""

from collections.abc import Sequence

from api import keys
from api.crds import InferenceServerConfig, LauncherConfig
from api.launcher import InstanceState
from controller.dualpods.copies import LauncherFacts
from controller.dualpods.identity import VLLM
from controller.dualpods.memory_budget import Sleeper, gpu_victim, host_victims
from controller.dualpods.pools.filling import Filling, Verdict
from controller.dualpods.pools.plan import NodeFacts, PoolPlan, plan_pool
from controller.dualpods.selection import Candidate, plan_for
from controller.dualpods.sleepers import first_to_go
from kube.informer import Obj
from tests.test_dualpods_fakes import GPU0, GPU1, ISC, inst, isc_obj, lc_obj, wanted_id

NODE_A, NODE_B = "node-a", "node-b"
GPU2, GPU3 = "GPU-2222", "GPU-3333"
GPUS = {NODE_A: (GPU0, GPU1), NODE_B: (GPU2, GPU3)}


def pooled(sleepers: int, min_nodes: int = 1, selector: dict[str, str] | None = None) -> Obj:
    obj = isc_obj()
    obj["spec"]["warmPool"] = {"sleepers": sleepers, "minNodes": min_nodes}
    if selector is not None:
        obj["spec"]["warmPool"]["nodeSelector"] = {"matchLabels": selector}
    return obj


def copy(gpus: tuple[str, ...], *, pool: bool = True, **state: object) -> InstanceState:
    made = inst(wanted_id(isc_obj(), gpus), gpus=gpus, **state)  # type: ignore[arg-type]
    if pool:
        made.annotations = {**(made.annotations or {}), keys.INSTANCE_POOL: ISC}
    return made


def launcher(name: str, node: str, *instances: InstanceState, max_instances: int = 2, **more: object) -> LauncherFacts:
    lc = LauncherConfig.from_k8s(lc_obj(max_instances, budget=more.pop("budget", None)))  # type: ignore[arg-type]
    fields: dict[str, object] = {"bound_instance": None, "available": True, **more}
    return LauncherFacts(name=name, node=node, config_name="lc", config=lc, instances=list(instances),
                         **fields)  # type: ignore[arg-type]  # fmt: skip


def node(
    name: str, *, held: Sequence[str] = (), awake: Sequence[str] = (), selected: bool = True, held_for: str = "other"
) -> NodeFacts:
    """`held`: GPUs that requesters of the ISC `held_for` hold."""
    gpus = GPUS[name]
    room = len(gpus) - len(set(held) | set(awake))
    return NodeFacts(name, selected, gpus, {gpu: frozenset({held_for}) for gpu in held}, frozenset(awake), room, {})


def plan(obj: Obj, launchers: Sequence[LauncherFacts], *nodes: NodeFacts, copy_bytes: int = 0) -> PoolPlan:
    facts = {n.name: n for n in nodes} or {name: node(name) for name in GPUS}
    return plan_pool(InferenceServerConfig.from_k8s(obj), VLLM, launchers, facts, copy_bytes)


def test_an_empty_fleet_gets_copies_on_idle_gpus_spread_over_nodes() -> None:
    found = plan(pooled(2, min_nodes=2), [launcher("a1", NODE_A), launcher("a2", NODE_A), launcher("b1", NODE_B)])
    assert sorted(c.target for c in found.creates)[-1] == "b1"
    assert len({c.target[0] for c in found.creates}) == 2, "one copy on each Node"
    assert {c.config.annotations[keys.INSTANCE_POOL] for c in found.creates if c.config.annotations} == {ISC}
    assert found.verdict is Verdict.FILLING
    assert not found.ready


def test_copies_that_loaded_are_put_to_sleep_and_sleeping_ones_count() -> None:
    loaded = copy((GPU0,), sleeping=False, ready=True)
    asleep = copy((GPU2,))
    found = plan(pooled(2), [launcher("a1", NODE_A, loaded), launcher("b1", NODE_B, asleep)])
    assert [s.instance.instance_id for s in found.sleeps] == [loaded.instance_id]
    assert [c.instance.instance_id for c in found.ready] == [asleep.instance_id]
    assert not found.creates, "one asleep and one loading make the declared two"
    assert found.verdict is Verdict.FILLING


def test_a_full_pool_does_nothing_and_says_so() -> None:
    found = plan(pooled(2), [launcher("a1", NODE_A, copy((GPU0,))), launcher("b1", NODE_B, copy((GPU2,)))])
    assert (found.creates, found.sleeps, found.deletes) == ([], [], [])
    assert found.verdict is Verdict.FILLED
    assert found.nodes() == {NODE_A, NODE_B}


def test_a_copy_taken_over_by_a_requester_leaves_the_pool_and_another_is_made() -> None:
    taken = copy((GPU0,), sleeping=False, ready=True)
    found = plan(pooled(1), [launcher("a1", NODE_A, taken, bound_instance=taken.instance_id, available=False),
                             launcher("b1", NODE_B)],
                 node(NODE_A, awake=[GPU0]), node(NODE_B))  # fmt: skip
    assert not found.sleeps, "the instance serves its requester: never put to sleep"
    assert [c.target for c in found.creates] == ["b1"]


def test_a_loading_copy_goes_when_a_requester_of_another_model_gets_its_gpu() -> None:
    loading = copy((GPU0,), sleeping=False, ready=False)
    found = plan(pooled(1), [launcher("a1", NODE_A, loading), launcher("b1", NODE_B)],
                 node(NODE_A, held=[GPU0], awake=[GPU0]), node(NODE_B))  # fmt: skip
    assert [d.instance.instance_id for d in found.deletes] == [loading.instance_id]
    assert [c.target for c in found.creates] == ["b1"]


def test_a_copy_whose_gpu_a_requester_of_its_model_got_is_left_for_it_to_take_over() -> None:
    for ready in (False, True):
        coming = copy((GPU0,), sleeping=False, ready=ready)
        found = plan(pooled(1), [launcher("a1", NODE_A, coming), launcher("b1", NODE_B)],
                     node(NODE_A, held=[GPU0], awake=[GPU0], held_for=ISC), node(NODE_B))  # fmt: skip
        assert not found.deletes, "its requester binds to it: a second instance would load the model again"
        assert not found.sleeps, "its requester is about to be served by it"
        assert [c.target for c in found.creates] == ["b1"], "it left the pool: another copy is made"


def test_a_sleeper_on_a_held_gpu_or_in_a_bound_launcher_is_not_ready() -> None:
    found = plan(pooled(2), [launcher("a1", NODE_A, copy((GPU0,))), launcher("a2", NODE_A),
                             launcher("b1", NODE_B, copy((GPU2,)), available=False, bound_instance="other")],
                 node(NODE_A, held=[GPU0]), node(NODE_B, awake=[GPU3]))  # fmt: skip
    assert not found.ready
    assert found.verdict is Verdict.FILLING, "GPU1 is idle: a copy goes there"
    assert [(c.target, c.config.gpu_uuids) for c in found.creates] == [("a2", [GPU1])]


def test_every_gpu_busy_is_reported_as_no_idle_gpu() -> None:
    found = plan(pooled(1), [launcher("a1", NODE_A)], node(NODE_A, held=[GPU0], awake=[GPU1]))
    assert not found.creates
    assert found.verdict is Verdict.NO_IDLE_GPU
    assert found.verdict.unfillable
    assert "no idle GPU" in found.why


def test_launchers_without_room_are_reported_as_the_budget() -> None:
    other = inst("other-model", isc="isc-b", port=8006, gpus=(GPU1,))
    assert plan(pooled(1), [launcher("a1", NODE_A, other, max_instances=1)]).verdict is Verdict.BUDGET
    full = plan(pooled(1), [launcher("a1", NODE_A, inst("x", isc="isc-b", port=8006, gpus=(GPU1,), rss=900),
                                     budget={"hostMemoryBytes": 1000})], copy_bytes=200)  # fmt: skip
    assert full.verdict is Verdict.BUDGET
    assert not full.creates


def test_every_gpu_held_by_bound_launchers_is_no_idle_gpu_not_no_launcher() -> None:
    bound = [launcher(name, NODE_A, available=False, bound_instance="x") for name in ("a1", "a2")]
    found = plan(pooled(1), bound, node(NODE_A, held=[GPU0, GPU1], awake=[GPU0, GPU1]))
    assert found.verdict is Verdict.NO_IDLE_GPU


def test_no_launcher_where_the_pool_may_go() -> None:
    assert plan(pooled(1), []).verdict is Verdict.NO_LAUNCHER
    unselected = plan(pooled(1), [launcher("a1", NODE_A)], node(NODE_A, selected=False))
    assert unselected.verdict is Verdict.NO_LAUNCHER
    assert not unselected.creates


def test_a_loaded_copy_too_big_for_the_host_budget_goes_instead_of_sleeping() -> None:
    big = copy((GPU0,), sleeping=False, ready=True, rss=2000)
    found = plan(pooled(1), [launcher("a1", NODE_A, big, budget={"hostMemoryBytes": 1000})])
    assert [d.instance.instance_id for d in found.deletes] == [big.instance_id]
    assert not found.sleeps


def test_a_sleeper_of_an_older_version_is_no_copy() -> None:
    old = inst(wanted_id(isc_obj(options="--model /models/old"), (GPU0,)), gpus=(GPU0,))
    found = plan(pooled(1), [launcher("a1", NODE_A, old), launcher("a2", NODE_A)], node(NODE_A))
    assert not found.ready
    assert [(c.target, c.config.gpu_uuids) for c in found.creates] == [("a2", [GPU1])], "one instance per port"


def test_sleepers_of_a_pool_beyond_its_count_go_first() -> None:
    surplus = inst("pool-copy", gpus=(GPU0,), revision=9)
    older = inst("lru", isc="isc-b", port=8006, gpus=(GPU0,), revision=1)
    first = first_to_go([surplus, older], {ISC: Filling(1, 2, 0, 1, Verdict.FILLED, "")})
    assert first == {"pool-copy"}
    assert first_to_go([surplus, older], {ISC: Filling(2, 2, 0, 1, Verdict.FILLED, "")}) == set()
    sleepers = [Sleeper("pool-copy", 9, 100, frozenset({GPU0})), Sleeper("lru", 1, 100, frozenset({GPU0}))]
    assert host_victims(sleepers, 100, 200, first) == ["pool-copy"]
    assert host_victims(sleepers, 100, 200) == ["lru"], "without a pool: least recently used"
    assert gpu_victim(sleepers, {GPU0: 1}, first) == "pool-copy"
    reclaim = plan_for(Candidate("l", [surplus, older]), "wanted", 9999, max_instances=2, first=first)
    assert reclaim.victims == ["pool-copy"]
