"""What is hot where: a launcher's instance summary (api/launcher_summary.py), the controller loop that keeps it on
the launcher Pod (controller/dualpods/drains.py, over the fakes of tests/test_dualpods_fakes.py), and
`kubectl dualpods status`'s arrangement of it (controller/fleet_view.py). The plugin against a real API server is in
e2e/test_dualpods_launcher.py."""

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from api import keys, launcher_summary
from api.launcher import InstanceState
from api.launcher_summary import MAX_INSTANCES, SummaryState, model_name, summarize
from controller import pods
from controller.fleet_view import as_json, as_table, fleet_status
from kube.informer import Obj
from tests.test_dualpods_fakes import (
    GPU0,
    GPU1,
    ISC,
    LAUNCHER,
    NODE,
    Harness,
    harness,
    inst,
    isc_obj,
    launcher_obj,
    node_obj,
    summarized,
    wanted_id,
)

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with harness() as made:
        made.put(node_obj())
        yield made


def test_an_instances_model_is_its_served_name_else_its_path() -> None:
    assert model_name("--model /models/a --served-model-name a-chat b --port 8000") == "a-chat"
    assert model_name("--served-model-name=a-chat --model=/models/a") == "a-chat"
    assert model_name("--model /models/a --port 8000") == "/models/a"
    assert model_name("--port 8000") == "?"
    assert model_name("--model '/models/a b") == "'/models/a"  # an unbalanced quote: split on spaces, no error


def test_states_and_order_busiest_first() -> None:
    instances = [
        inst("asleep", sleeping=True),
        inst("serving", sleeping=False),
        inst("loading", ready=False, sleeping=False),
        inst("stopped", stopped=True),
    ]
    summary = summarize(instances, None, T0)
    assert [(e.id, e.state) for e in summary.instances] == [
        ("serving", SummaryState.SERVING),
        ("loading", SummaryState.LOADING),
        ("asleep", SummaryState.ASLEEP),
        ("stopped", SummaryState.STOPPED),
    ]
    assert summary.instances[0].isc == "isc"
    assert summary.instances[0].gpus == [GPU0]


def test_since_holds_while_the_state_does_and_bytes_outlive_a_list() -> None:
    first = summarize([inst("a", sleeping=False, rss=5 << 30, gpu_bytes=7 << 30)], None, T0)
    later = T0 + timedelta(minutes=5)
    same = summarize([inst("a", sleeping=False)], first, later)  # an event: no process statistics
    assert same.instances[0].since == T0
    assert (same.instances[0].host_bytes, same.instances[0].gpu_bytes) == (5 << 30, 7 << 30)
    slept = summarize([inst("a", sleeping=True)], same, later)
    assert slept.instances[0].since == later
    assert slept.instances[0].host_bytes is None


def test_the_summary_is_bounded_and_counts_what_it_left_out() -> None:
    many = [inst(f"i{n:02}") for n in range(MAX_INSTANCES + 3)]
    summary = summarize(many, None, T0)
    assert len(summary.instances) == MAX_INSTANCES
    assert summary.omitted == 3
    assert len(summary.annotation()) < 8192


def test_an_annotation_that_is_not_a_summary_reads_as_none() -> None:
    assert launcher_summary.parse(None) is None
    assert launcher_summary.parse("not json") is None
    assert launcher_summary.parse('{"instances": [{"id": 1}]}') is None
    text = summarize([inst("a")], None, T0).annotation()
    assert launcher_summary.parse(text) == summarize([inst("a")], None, T0)
    assert json.loads(text)["instances"][0]["since"].startswith("2026-12-02T06:00:00")


def test_a_launchers_summary_is_parsed_once_per_text_it_carries() -> None:
    parsed = launcher_summary.ParsedSummaries()
    before = _launcher("l1", "node-a", inst("a"))
    first = parsed.of_pod(before)
    assert first == summarize([inst("a")], None, T0)
    assert parsed.of_pod(json.loads(json.dumps(before))) is first, "the same text, from a later event"
    after = _launcher("l1", "node-a", inst("a"), inst("b"))
    second = parsed.of_pod(after)
    assert second == summarize([inst("a"), inst("b")], None, T0)
    parsed.forget("l1")
    again = parsed.of_pod(after)
    assert again == second
    assert again is not second, "read again once forgotten"


async def test_the_controller_writes_a_launchers_summary_once_and_again_when_it_changes(h: Harness) -> None:
    h.put(launcher_obj())
    h.views.put(h.pod(LAUNCHER), inst("a", sleeping=False), inst("b", sleeping=True, gpus=(GPU1,)))
    await h.controller.drains.reconcile(LAUNCHER)
    summary = launcher_summary.parse(pods.annotations(h.pod(LAUNCHER)).get(launcher_summary.ANNOTATION))
    assert summary is not None
    assert [(e.id, e.state, e.gpus) for e in summary.instances] == [
        ("a", SummaryState.SERVING, [GPU0]),
        ("b", SummaryState.ASLEEP, [GPU1]),
    ]
    written = len(h.journal)
    await h.controller.drains.reconcile(LAUNCHER)
    assert len(h.journal) == written, "an unchanged launcher is not written"

    h.views.put(h.pod(LAUNCHER), inst("a", sleeping=True))
    await h.controller.drains.reconcile(LAUNCHER)
    summary = launcher_summary.parse(pods.annotations(h.pod(LAUNCHER)).get(launcher_summary.ANNOTATION))
    assert summary is not None
    assert [(e.id, e.state) for e in summary.instances] == [("a", SummaryState.ASLEEP)]


async def test_an_instance_gone_to_sleep_changes_the_summary_and_the_warm_label_in_one_write(h: Harness) -> None:
    h.put(launcher_obj())
    h.views.put(h.pod(LAUNCHER), inst("a", sleeping=False))
    await h.controller.drains.reconcile(LAUNCHER)
    assert keys.LAUNCHER_WARM_LABEL not in pods.labels(h.pod(LAUNCHER))
    written = len(h.journal)

    h.views.put(h.pod(LAUNCHER), inst("a", sleeping=True))
    await h.controller.drains.reconcile(LAUNCHER)
    assert len(h.journal) == written + 1
    summary = launcher_summary.of_pod(h.pod(LAUNCHER))
    assert summary is not None
    assert [e.state for e in summary.instances] == [SummaryState.ASLEEP]
    assert pods.labels(h.pod(LAUNCHER)).get(keys.LAUNCHER_WARM_LABEL) == "true"


async def test_an_unreached_launcher_keeps_its_last_summary(h: Harness) -> None:
    h.put(launcher_obj())
    h.views.put(h.pod(LAUNCHER), inst("a"))
    await h.controller.drains.reconcile(LAUNCHER)
    written = len(h.journal)
    h.views.put(h.pod(LAUNCHER), synced=False)
    await h.controller.drains.reconcile(LAUNCHER)
    assert len(h.journal) == written


async def test_a_views_change_queues_its_launcher_once_it_settled(h: Harness) -> None:
    launchers = h.controller.drains
    launchers.settle_s = 0.05
    h.views.changed(LAUNCHER)
    h.views.changed(LAUNCHER)
    assert len(launchers.queue) == 0, "not while the reconciler may still be writing the launcher"
    await asyncio.sleep(0.1)
    assert len(launchers.queue) == 1


def _launcher(name: str, node: str, *instances: InstanceState) -> Obj:
    pod = summarized(launcher_obj(name), *instances)
    pod["spec"]["nodeName"] = node
    return pod


def test_the_fleet_per_node_gpu_and_model() -> None:
    gpu_map = {"data": {NODE: json.dumps({GPU0: 0, GPU1: 1}), "node-b": json.dumps({"GPU-2222": 0})}}
    launchers = [
        _launcher("l1", NODE, inst("a1", sleeping=True), inst("b1", sleeping=False)),
        _launcher("l2", "node-b", inst("a2", sleeping=True, gpus=("GPU-2222",))),
        launcher_obj("l3"),  # no summary yet
    ]
    fleet = fleet_status(launchers, [gpu_map])
    node_a = next(n for n in fleet.nodes if n.name == NODE)
    gpu0, gpu1 = node_a.gpus
    assert (gpu0.uuid, gpu0.index, gpu0.free) == (GPU0, 0, False)
    assert [w.instance.id for w in gpu0.instances] == ["b1", "a1"]  # serving first
    assert (gpu1.uuid, gpu1.free, gpu1.instances) == (GPU1, True, [])
    assert node_a.launchers_unsummarized == ["l3"]
    node_b = next(n for n in fleet.nodes if n.name == "node-b")
    assert node_b.gpus[0].free is True  # only a sleeper there
    (model,) = fleet.models
    assert [w.launcher for w in model.serving] == ["l1"]
    assert [w.launcher for w in model.asleep] == ["l1", "l2"]

    table = as_table(fleet, T0 + timedelta(minutes=3))
    lines = table.splitlines()
    assert lines[0].split() == ["NODE", "GPU", "STATE", "MODEL", "LAUNCHER", "SINCE", "INSTANCE"]
    assert lines[1].split() == [NODE, f"0:{GPU0}", "serving", "/models/a", "l1", "3m", "b1"]
    assert lines[3].split() == [NODE, f"1:{GPU1}", "free"]
    assert f"{NODE}: no summary yet on l3" in lines
    assert json.loads(as_json(fleet))["models"][0]["asleep"][1]["node"] == "node-b"


def _pooled(sleepers: int, status: Obj | None = None) -> Obj:
    obj = isc_obj()
    obj["spec"]["warmPool"] = {"sleepers": sleepers, "minNodes": 2}
    if status is not None:
        obj["status"] = status
    return obj


def test_the_fleet_marks_the_copies_of_a_warm_pool_and_shows_the_pool() -> None:
    """A user sees which sleepers are copies of a model's warm pool (its ISC's current version asleep; not a
    sleeper of an older version, not an instance that serves) and the pool as its ISC's status says."""
    why = "2 of 3 copies asleep; no idle GPU (every GPU of those Nodes is held by an awake instance or a requester)"
    condition = {"type": "PoolReady", "status": "False", "reason": "NoIdleGPU", "message": why,
                 "lastTransitionTime": "2026-12-02T06:00:00Z"}  # fmt: skip
    isc = _pooled(3, {"pool": {"declared": 3, "ready": 2, "loading": 0, "nodes": 1}, "conditions": [condition]})
    copy0, copy1, serving = (wanted_id(isc, (gpu,)) for gpu in (GPU0, GPU1, "GPU-2222"))
    older = wanted_id(isc_obj(options="--model /models/a --max-model-len 4096"), (GPU1,))
    gpu_map = {"data": {NODE: json.dumps({GPU0: 0, GPU1: 1})}}
    launchers = [
        _launcher("l1", NODE, inst(copy0, gpus=(GPU0,)), inst("other-model", isc="isc-b", gpus=(GPU0,))),
        _launcher("l2", NODE, inst(copy1, gpus=(GPU1,)), inst(older, gpus=(GPU1,))),
        _launcher("l3", NODE, inst(serving, gpus=("GPU-2222",), sleeping=False)),
    ]
    fleet = fleet_status(launchers, [gpu_map], [], [isc, isc_obj("isc-b")])

    marked = {(w.launcher, w.instance.id) for n in fleet.nodes for g in n.gpus for w in g.instances if w.pool}
    assert marked == {("l1", copy0), ("l2", copy1)}
    (pool,) = fleet.pools  # isc-b declares none
    assert (pool.isc, pool.model, pool.ready, pool.declared, pool.reason) == (ISC, "/models/a", 2, 3, "NoIdleGPU")

    lines = as_table(fleet, T0 + timedelta(minutes=3)).splitlines()
    rows = {line.split()[-1]: line for line in lines if line.startswith(NODE)}
    assert rows[copy0].split()[2:4] == ["asleep", "(pool)"]
    assert rows[copy1].split()[2:4] == ["asleep", "(pool)"]
    assert rows[older].split()[2:4] == ["asleep", "/models/a"]  # an older version: no copy
    assert "(pool)" not in rows["other-model"]
    assert rows[serving].split()[2] == "serving"  # a copy woken by a requester has left the pool
    header = next(i for i, line in enumerate(lines) if line.startswith("POOL "))
    assert lines[header].split() == ["POOL", "MODEL", "READY", "LOADING", "NODES", "REASON", "MESSAGE"]
    assert lines[header + 1].split()[:6] == [ISC, "/models/a", "2/3", "0", "1", "NoIdleGPU"]
    assert lines[header + 1].endswith(why)
    (model,) = [line for line in lines if line.startswith("/models/a ")]  # the models table: where its copies sleep
    assert f"{NODE}/l1[{GPU0}] (pool)" in model

    shown = json.loads(as_json(fleet))
    assert (shown["pools"][0]["ready"], shown["pools"][0]["declared"]) == (2, 3)
    by_id = {w["instance"]["id"]: w for n in shown["nodes"] for g in n["gpus"] for w in g["instances"]}
    assert by_id[copy0]["pool"] is True
    assert "pool" not in by_id["other-model"]


def test_a_pool_the_controller_has_not_reported_yet_shows_what_it_declares() -> None:
    none = _pooled(0)
    none["metadata"]["name"] = "no-pool"
    fleet = fleet_status([_launcher("l1", NODE)], [], [], [_pooled(2), none])
    (pool,) = fleet.pools  # a pool of 0 copies is none
    assert (pool.declared, pool.ready, pool.reason) == (2, None, None)
    (row,) = [line for line in as_table(fleet, T0).splitlines() if line.startswith(f"{ISC} ")]
    assert row.split() == [ISC, "/models/a", "-/2", "-", "-", "-"]


def test_without_pools_the_table_has_no_pool_section() -> None:
    fleet = fleet_status([_launcher("l1", NODE, inst("a1"))], [], [], [isc_obj()])
    assert fleet.pools == []
    table = as_table(fleet, T0)
    assert "POOL" not in table
    assert "(pool)" not in table
