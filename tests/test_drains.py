"""Drains keep the fleet warm: the plan for a draining launcher's sleepers (controller/dualpods/drain_plan.py) and
the loop that keeps the warm label its PodDisruptionBudget selects (controller/dualpods/drains.py), over the fakes of
tests/test_dualpods_fakes.py. A real drain of the loopback cluster is in e2e/test_drains.py."""

import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from api import keys
from api.crds import InferenceServerConfig, LauncherConfig
from api.launcher import InstanceState
from controller import pods
from controller.dualpods.copies import LauncherFacts
from controller.dualpods.drain_plan import INSTANCE_REWARMED_FROM, plan
from kube.informer import Obj
from kube.workqueue import DONE
from tests.results import again
from tests.test_dualpods_fakes import (
    GPU0,
    GPU1,
    ISC,
    NODE,
    NS,
    Harness,
    harness,
    inst,
    isc_obj,
    launcher_obj,
    lc_obj,
    node_obj,
    wanted_id,
)

OTHER_NODE = "node-b"
GPU2, GPU3 = "GPU-2222", "GPU-3333"
ISC_B = "isc-b"
T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)


def model(isc: Obj | None = None) -> InferenceServerConfig:
    return InferenceServerConfig.from_k8s(isc or isc_obj())


def sleeper(isc: Obj | None = None, gpus: tuple[str, ...] = (GPU0,), **state: object) -> InstanceState:
    isc = isc or isc_obj()
    return inst(wanted_id(isc, gpus), isc=isc["metadata"]["name"], port=model(isc).spec.model_server_config.port,
                gpus=gpus, **state)  # type: ignore[arg-type]  # fmt: skip


def facts(
    name: str, *instances: InstanceState, node: str = OTHER_NODE, max_instances: int = 2, **more: object
) -> LauncherFacts:
    fields: dict[str, object] = {"gpus": (GPU2, GPU3), "bound_instance": None, **more}
    return LauncherFacts(name=name, node=node, config_name="lc", config=LauncherConfig.from_k8s(lc_obj(max_instances)),
                         instances=list(instances), **fields)  # type: ignore[arg-type]  # fmt: skip


ISC_B_OBJ = isc_obj(ISC_B, port=8006)
ISCS = {ISC: model(), ISC_B: model(ISC_B_OBJ)}


def test_a_sleeper_gets_a_copy_on_the_least_used_gpu_of_another_launcher() -> None:
    source = facts("l1", sleeper(), node=NODE)
    busy = sleeper(ISC_B_OBJ, (GPU2,))
    drain = plan(source, [facts("l2", busy)], ISCS)
    (create,) = drain.creates
    assert (create.target, create.isc, create.config.gpu_uuids) == ("l2", ISC, [GPU3])
    assert create.instance_id == wanted_id(isc_obj(), (GPU3,))
    assert (create.config.annotations or {})[INSTANCE_REWARMED_FROM] == "l1"
    assert not drain.done


def test_a_copy_is_slept_when_ready_waited_for_while_loading_and_done_asleep_or_serving() -> None:
    source = facts("l1", sleeper(), node=NODE)
    copy_id = wanted_id(isc_obj(), (GPU2,))
    marked = {keys.INSTANCE_ISC_NAME: ISC, keys.INSTANCE_INFERENCE_PORT: "8005", INSTANCE_REWARMED_FROM: "l1"}
    loading = sleeper(gpus=(GPU2,), ready=False, sleeping=False).model_copy(update={"annotations": marked})
    assert plan(source, [facts("l2", loading)], ISCS).waiting == [sleeper().instance_id]
    ready = loading.model_copy(update={"ready": True})
    (sleep,) = plan(source, [facts("l2", ready)], ISCS).sleeps
    assert (sleep.target, sleep.instance.instance_id) == ("l2", copy_id)
    asleep = plan(source, [facts("l2", ready.model_copy(update={"sleeping": True}))], ISCS)
    assert (asleep.covered, asleep.done) == ({sleeper().instance_id: "l2"}, True)
    serving = sleeper(gpus=(GPU2,), sleeping=False)  # it moved with its requester
    assert plan(source, [facts("l2", serving, bound_instance=copy_id)], ISCS).covered == {sleeper().instance_id: "l2"}
    unmarked = plan(source, [facts("l2", serving)], ISCS)  # awake, unbound, not ours: someone else's transition
    assert unmarked.waiting == [sleeper().instance_id]


def test_a_sleeper_with_nowhere_to_go_is_stranded_with_every_reason_and_does_not_hold_the_drain() -> None:
    source = facts("l1", sleeper(), node=NODE)
    full = facts("full", sleeper(ISC_B_OBJ, (GPU2,)), max_instances=1)
    port = facts("port", sleeper(gpus=(GPU2,), ready=False).model_copy(update={"instance_id": "old-version"}))
    no_gpus = facts("no-gpus", gpus=())
    elsewhere = facts("unavailable", available=False)
    drain = plan(source, [full, port, no_gpus, elsewhere], ISCS)
    why = drain.stranded[sleeper().instance_id]
    assert "full holds maxInstances (1)" in why
    assert "port has an instance on port 8005" in why
    assert "no-gpus's node node-b has fewer than 1 known GPUs" in why
    assert "unavailable" not in why
    assert drain.done


def test_obsolete_and_orphaned_sleepers_are_not_copied() -> None:
    old = sleeper().model_copy(update={"instance_id": "made-from-an-older-isc"})
    orphan = sleeper(ISC_B_OBJ)
    drain = plan(facts("l1", old, orphan, node=NODE), [facts("l2")], {ISC: model()})
    assert drain.creates == []
    assert "older version" in drain.stranded["made-from-an-older-isc"]
    assert "is gone" in drain.stranded[orphan.instance_id]


def test_two_sleepers_share_out_over_the_targets_as_planned() -> None:
    source = facts("l1", sleeper(), sleeper(ISC_B_OBJ, (GPU1,)), node=NODE)
    drain = plan(source, [facts("l2", max_instances=1), facts("l3", max_instances=1)], ISCS)
    assert sorted((c.target, c.isc) for c in drain.creates) == [("l2", ISC), ("l3", ISC_B)]


# ----- the loop, over the fakes


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with harness() as made:
        made.put(node_obj(), node_obj(OTHER_NODE), isc_obj(), lc_obj())
        yield made


def on(pod: Obj, node: str, ip: str) -> Obj:
    pod["spec"]["nodeName"] = node
    pod["status"]["podIP"] = ip
    return pod


def warm(h: Harness, name: str) -> bool:
    return pods.labels(h.pod(name)).get(keys.LAUNCHER_WARM_LABEL) == "true"


def events(h: Harness) -> list[tuple[str, str]]:
    return [(c.detail[1], c.detail[2]) for c in h.journal.of("event")]


async def test_a_launcher_is_warm_while_it_holds_a_sleeper(h: Harness) -> None:
    h.put(launcher_obj("l1"))
    h.views.put(h.pod("l1"), sleeper())
    await h.controller.drains.reconcile("l1")
    assert warm(h, "l1")
    h.views.put(h.pod("l1"), sleeper(sleeping=False))
    await h.controller.drains.reconcile("l1")
    assert not warm(h, "l1")


async def test_a_drain_copies_the_sleepers_then_lets_the_launcher_go(h: Harness) -> None:
    h.put(launcher_obj("l1"), on(launcher_obj("l2", ip="127.0.2.1"), OTHER_NODE, "127.0.2.1"))
    h.views.put(h.pod("l1"), sleeper())
    h.views.put(h.pod("l2"))
    h.put(node_obj(NODE, unschedulable=True), gpu_map({OTHER_NODE: [GPU2, GPU3], NODE: [GPU0, GPU1]}))
    drains = h.controller.drains
    drains.now = lambda: T0

    assert again(await drains.reconcile("l1")) == pytest.approx(1.0)
    (create,) = h.journal.of("create_instance")
    copy_id = wanted_id(isc_obj(), (GPU2,))
    assert create.target == copy_id
    assert warm(h, "l1")
    assert pods.annotations(h.pod("l1"))[keys.DRAIN_STARTED_ANNOTATION] == T0.isoformat()

    h.views.views["l2"].instances[copy_id] = h.views.views["l2"].instances[copy_id].model_copy(update={"ready": True})
    await drains.reconcile("l1")
    assert [c.target for c in h.journal.of("sleep")] == [copy_id]
    assert await drains.reconcile("l1") == DONE
    assert not warm(h, "l1")
    assert ("DrainRewarmed", f"its sleepers are asleep on other nodes: {sleeper().instance_id} on l2") in events(h)

    h.put(node_obj(NODE))  # uncordoned: the drain's mark goes, the sleeper holds it again
    await drains.reconcile("l1")
    assert warm(h, "l1")
    assert keys.DRAIN_STARTED_ANNOTATION not in pods.annotations(h.pod("l1"))


async def test_a_drain_waits_for_launchers_whose_instances_are_not_known_yet(h: Harness) -> None:
    # A controller that just started (its own Pod evicted by the drain) has not listed every launcher yet.
    h.put(launcher_obj("l1"), on(launcher_obj("l2", ip="127.0.2.1"), OTHER_NODE, "127.0.2.1"))
    h.views.put(h.pod("l1"), sleeper())
    h.put(node_obj(NODE, unschedulable=True), gpu_map({OTHER_NODE: [GPU2, GPU3], NODE: [GPU0, GPU1]}))
    drains = h.controller.drains
    drains.now = lambda: T0
    assert again(await drains.reconcile("l1")) == pytest.approx(1.0)
    assert warm(h, "l1"), "the sleeper still holds the drain"
    assert events(h) == [], "neither stranded nor rewarmed while l2's instances are unknown"
    h.views.put(h.pod("l2"))  # l2's view synced: the copy goes there
    await drains.reconcile("l1")
    assert [c.target for c in h.journal.of("create_instance")] == [wanted_id(isc_obj(), (GPU2,))]


async def test_a_launcher_not_known_yet_does_not_hold_up_copies_to_known_ones(h: Harness) -> None:
    h.put(launcher_obj("l1"), on(launcher_obj("l2", ip="127.0.2.1"), OTHER_NODE, "127.0.2.1"))
    h.put(on(launcher_obj("l3", ip="127.0.2.2"), OTHER_NODE, "127.0.2.2"))  # Ready, its view never synced
    h.views.put(h.pod("l1"), sleeper())
    h.views.put(h.pod("l2"))
    h.put(node_obj(NODE, unschedulable=True), gpu_map({OTHER_NODE: [GPU2, GPU3], NODE: [GPU0, GPU1]}))
    h.controller.drains.now = lambda: T0
    await h.controller.drains.reconcile("l1")
    assert [c.target for c in h.journal.of("create_instance")] == [wanted_id(isc_obj(), (GPU2,))]


async def test_a_drain_that_cannot_finish_in_time_lets_the_launcher_go(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h.put(launcher_obj("l1"), node_obj(NODE, unschedulable=True))
    h.views.put(h.pod("l1"), sleeper())
    drains = h.controller.drains
    drains.now = lambda: T0
    await drains.reconcile("l1")
    stranded = (f"sleeping instance {sleeper().instance_id} cannot be copied to another node: no launcher of its "
                "LauncherConfig on a schedulable node")  # fmt: skip
    assert ("DrainStranded", stranded) in events(h)
    (logged,) = [r for r in caplog.records if getattr(r, "reason", None) == "DrainStranded"]
    assert (logged.levelno, logged.getMessage().endswith(stranded)) == (logging.WARNING, True)
    assert not warm(h, "l1"), "a stranded sleeper does not hold the drain"

    h.put(on(launcher_obj("l2", ip="127.0.2.1"), OTHER_NODE, "127.0.2.1"))
    h.views.put(h.pod("l2"))  # a launcher that never makes the copy
    h.put(gpu_map({OTHER_NODE: [GPU2]}))
    await drains.reconcile("l1")
    assert warm(h, "l1")
    drains.now = lambda: T0 + timedelta(seconds=drains.timeout_s + 1)
    await drains.reconcile("l1")
    assert not warm(h, "l1")
    assert events(h)[-1][0] == "DrainRewarmTimeout"


def gpu_map(nodes: dict[str, list[str]]) -> Obj:
    data = {node: json.dumps({gpu: index for index, gpu in enumerate(gpus)}) for node, gpus in nodes.items()}
    metadata = {"name": keys.GPU_MAP_CONFIGMAP, "namespace": NS, "uid": "gm", "resourceVersion": "1"}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}
