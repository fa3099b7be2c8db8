"""The post-wake check end to end on the loopback cluster (issue 11 item 4): a stand-in whose first wake
corrupts its output on purpose (`--corrupt-after-wake 1`) fails its check at a hot start; the requester is
not told ready on it, gets a `WakeCheckFailed` Event and is served by a fresh instance on the same launcher,
which answers as the model did before its sleep."""

import datetime
from typing import Any

import aiohttp

from api import keys
from controller import pods
from e2e.dualpods_env import DualPodsEnv, Obj
from e2e.waiting import wait_for

RS = "requesters"
ISC = "fragile"
PORT = 8005


async def completion(launcher: Obj) -> list[int]:
    """A greedy completion's token IDs, straight from the instance serving on the launcher."""
    body = {"model": "a", "prompt": "The sky is", "max_tokens": 4, "temperature": 0, "return_token_ids": True}
    url = f"http://{pods.pod_ip(launcher)}:{PORT}/v1/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
    return [int(t) for t in answer["choices"][0]["token_ids"]]


async def events(env: DualPodsEnv, name: str, reason: str) -> list[Any]:
    found = await env.core.list_namespaced_event(env.namespace, field_selector=f"involvedObject.name={name}")
    return [e for e in found.items if e.reason == reason]


async def test_a_wake_that_corrupts_the_model_is_never_served(env: DualPodsEnv) -> None:
    await env.create_launcher_config("lc", max_instances=2, launcher_args=["--stand-in"])
    await env.create_population_policy("keep-one", "lc", count=1)  # the launcher outlives its requesters
    await env.create_isc(ISC, "lc", port=PORT, options="--model a --corrupt-after-wake 1")
    node = (await env.cluster.kubelet.nodes())[0]
    await env.create_requesters(RS, ISC, node=node.name, gpu=sorted(node.gpus)[0])
    first = await env.ready_requester(RS)
    launcher = await env.launcher_of(first)
    before = await completion(launcher)
    await env.scale(RS, 0)
    await env.wait_gone(RS)
    await env.wait_launchers_unbound(within=60)
    [asleep] = (await env.instances(launcher))["instances"]
    assert asleep["sleeping"]
    assert asleep["wake_check"]["status"] == "recorded", "its probe was recorded at its first ready"

    await env.scale(RS, 1)  # a hot start: its wake corrupts the model
    second = await env.ready_requester(RS)
    assert (await env.launcher_of(second))["metadata"]["name"] == launcher["metadata"]["name"]
    [failed] = await wait_for(lambda: events(env, second["metadata"]["name"], "WakeCheckFailed"),
                              what="the WakeCheckFailed Event", within=30)  # fmt: skip
    assert "failed its post-wake check" in failed.message
    ready_since = next(c for c in second["status"]["conditions"] if c["type"] == "Ready")["lastTransitionTime"]
    # Both are whole seconds (the Pod's condition and the Event's first timestamp): ready in the same second or later.
    told_ready = datetime.datetime.fromisoformat(ready_since.replace("Z", "+00:00"))
    assert told_ready >= failed.first_timestamp, "told ready only afterwards"
    assert [p["metadata"]["uid"] for p in await env.requesters(RS)] == [second["metadata"]["uid"]], (
        "the same requester was served, not replaced"
    )
    [fresh] = (await env.instances(launcher))["instances"]
    assert (fresh["status"], fresh["sleeping"], fresh.get("stop_reason")) == ("running", False, None)
    assert fresh["instance_id"] == asleep["instance_id"] == pods.labels(second)[keys.INSTANCE_LABEL]
    assert fresh["revision"] > asleep["revision"]
    assert await completion(launcher) == before, "the fresh instance answers as the model did before its sleep"
    assert not any(e.type == "Warning" and e.reason == "InstanceLost" for e in
                   (await env.core.list_namespaced_event(env.namespace)).items)  # fmt: skip
    metrics = await env.controllers.metrics()
    assert f'dualpods_wake_check_failures_total{{exported_namespace="{env.namespace}",isc_name="{ISC}"}} 1.0' in metrics
