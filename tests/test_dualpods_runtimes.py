"""What the dual-pods controller adds for the runtimes work: runtime selection (E4), the sleepers'
GPU reserve (E6), pointing the requester's proxy at its server (E7) and LoRA adapters (E8)."""

import json
from collections.abc import AsyncIterator

import pytest

from api import keys
from api.crds import InferenceServerConfig
from controller.dualpods.identity import instance_id, runtime_of, vllm_config
from controller.pods import annotations
from tests.results import terminal
from tests.test_dualpods_fakes import (
    GPU0,
    LAUNCHER,
    PORT,
    REQ,
    WANTED,
    Harness,
    bound,
    harness,
    inst,
    isc_obj,
    launcher_obj,
    lc_obj,
    node_obj,
    requester_obj,
    settled,
    status_errors,
)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with harness() as made:
        made.put(node_obj(), isc_obj(), lc_obj())
        yield made


@pytest.mark.parametrize(
    ("requester", "isc", "expected"),
    [
        ({}, {}, "vllm"),  # absent means vLLM
        ({}, {keys.RUNTIME_ANNOTATION: "huggingface"}, "transformers"),
        ({}, {keys.RUNTIME_ANNOTATION_ALIAS: "transformers"}, "transformers"),  # KAITO's shipped spelling
        ({keys.RUNTIME_ANNOTATION: "vllm"}, {keys.RUNTIME_ANNOTATION: "huggingface"}, "vllm"),  # the Pod wins
        ({keys.RUNTIME_ANNOTATION_ALIAS: "Transformers"}, {}, "transformers"),
    ],
)
def test_the_runtime_asked_for(requester: dict[str, str], isc: dict[str, str], expected: str) -> None:
    assert runtime_of(requester, isc) == expected


@pytest.mark.parametrize(
    ("requester", "message"),
    [
        ({keys.RUNTIME_ANNOTATION: "tgi"}, "'tgi' on the requester Pod is not a runtime; use one of vllm, huggingface"),
        ({keys.RUNTIME_ANNOTATION: "vllm", keys.RUNTIME_ANNOTATION_ALIAS: "transformers"}, "asks for two runtimes"),
    ],
)
def test_an_unknown_runtime_is_an_error_never_a_default(requester: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        runtime_of(requester, {})


def isc_with(**spec: object) -> InferenceServerConfig:
    obj = isc_obj()
    obj["spec"].update(spec)
    return InferenceServerConfig.from_k8s(obj)


def test_the_runtime_and_lora_are_part_of_the_instance_but_the_adapters_are_not() -> None:
    plain = isc_with()
    assert instance_id(plain, [GPU0], "transformers") != instance_id(plain, [GPU0])
    one = isc_with(loraAdapters=[{"name": "a", "path": "/a"}])
    two = isc_with(loraAdapters=[{"name": "a", "path": "/a"}, {"name": "b", "path": "/b"}])
    assert instance_id(one, [GPU0]) != instance_id(plain, [GPU0])
    assert instance_id(one, [GPU0]) == instance_id(two, [GPU0])


def test_adapters_are_loaded_at_start() -> None:
    config = vllm_config(isc_with(loraAdapters=[{"name": "a", "path": "/lora a"}]), [GPU0], "transformers", 7)
    assert config.options == f"--model /models/a --port {PORT} --enable-lora --lora-modules 'a=/lora a'"
    assert config.env_vars == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    assert (config.runtime, config.gpu_sleeper_reserve_bytes) == ("transformers", 7)


async def test_an_unknown_runtime_is_a_status_error_and_an_event(h: Harness) -> None:
    isc = isc_obj()
    isc["metadata"]["annotations"] = {keys.RUNTIME_ANNOTATION: "sglang"}
    h.put(requester_obj(), launcher_obj(), isc)
    h.views.put(launcher_obj())
    assert terminal(await h.reconcile())  # until the ISC (or the requester) changes
    (error,) = status_errors(h.pod(REQ)) or []
    assert "'sglang' on the InferenceServerConfig is not a runtime" in error
    assert any(c.kind == "event" and "sglang" in c.detail[2] for c in h.journal)
    assert h.journal.of("update") == [] or all(c.target == REQ for c in h.journal.of("update"))  # nothing bound


async def test_the_bound_instance_asks_for_the_runtime_and_the_sleepers_reserve(h: Harness) -> None:
    requester = requester_obj()
    requester["metadata"]["annotations"][keys.RUNTIME_ANNOTATION] = "huggingface"
    h.put(requester, launcher_obj(), lc_obj(max_instances=3, budget={"gpuMemoryBytes": 5 * 1024**3}))
    h.views.put(launcher_obj())
    await h.reconcile()
    config = json.loads(annotations(h.journal.written(LAUNCHER))[keys.VLLM_CONFIG_ANNOTATION])
    assert config["runtime"] == "transformers"
    assert config["gpu_sleeper_reserve_bytes"] == 5 * 1024**3  # the byte budget wins over 2 GiB x 2


async def test_the_requesters_proxy_points_at_the_serving_instance_before_it_is_told_ready(h: Harness) -> None:
    requester = settled(requester_obj())
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, sleeping=False))
    await h.reconcile()
    assert h.requesters.proxied[REQ] == ("127.0.1.1", PORT)
    assert h.journal.of("relay")


async def test_lora_adapters_follow_the_isc_without_a_restart(h: Harness) -> None:
    isc = isc_obj()
    isc["spec"]["loraAdapters"] = [{"name": "keep", "path": "/k"}, {"name": "new", "path": "/n"}]
    requester = settled(requester_obj())
    launcher = bound(launcher_obj(), requester)
    h.put(isc, requester, launcher)
    state = inst(WANTED, sleeping=False).model_copy(update={"options": "--model /models/a --enable-lora"})
    h.views.put(launcher, state)
    h.providers.adapters["127.0.1.1"] = {"keep", "gone"}
    await h.reconcile()
    assert [(c.kind, c.target) for c in h.journal if "lora" in c.kind] == [
        ("unload_lora", "gone"),
        ("load_lora", "new"),
    ]
    assert h.providers.adapters["127.0.1.1"] == {"keep", "new"}


async def test_an_instance_of_another_runtime_is_not_taken_for_obsolete(h: Harness) -> None:
    h.put(launcher_obj())
    isc = InferenceServerConfig.from_k8s(isc_obj())
    hf = inst(instance_id(isc, [GPU0], "transformers")).model_copy(update={"runtime": "transformers"})
    h.views.put(launcher_obj(), hf)
    await h.reconciler.reconcile_isc(isc.metadata.name)
    assert h.journal.of("delete_instance") == []


async def test_a_ready_requesters_proxy_is_pointed_again_when_its_server_moves(h: Harness) -> None:
    """Readiness unchanged, but the serving server is another (a controller restart, a recreated instance):
    the proxy is re-pointed without a readiness relay."""
    requester = settled(requester_obj(ready=True))
    launcher = bound(launcher_obj(), requester, serving=True)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, sleeping=False))
    h.requesters.proxied[REQ] = ("127.0.9.9", 1)  # where it pointed before
    await h.reconcile()
    assert h.requesters.proxied[REQ] == ("127.0.1.1", PORT)
    assert h.journal.of("relay") == []
