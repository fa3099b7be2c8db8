"""Our controllers drive our launcher in its FMA-only mode (issue 13.1), on the loopback cluster.

The FMA-only mode is turned on the way an FMA user would pass it, through the LauncherConfig's container
environment (LAUNCHER_FMA_ONLY=true): its index lists no sleep or wake route, its instance states carry neither
readiness nor sleep, and its events are CREATED, STOPPED and DELETED only. A requester is served; a swap to another
model and back puts each instance to sleep and wakes it through vLLM's own endpoints on the instance's port (seen
there: `/is_sleeping`), the same instance each time, not made again; and a chat through the requester's proxy
answers. With stand-in model servers (which answer vLLM's dev-mode routes as vLLM does): FMA's own launcher, with
vLLM, is driven by our controllers in e2e/test_fma_mixed.py.
"""

from typing import Any

import aiohttp

from api import keys
from api.launcher import FMA_STATE_KEYS, SLEEP_ROUTE, WAKE_ROUTE
from controller import pods
from e2e.actuation import release
from e2e.dualpods_env import DualPodsEnv, Obj, proxy_chat

RS = "fma-served"
PORTS = {"model-a": 8005, "model-b": 8006}
READY_S = 240  # a new launcher preloads vLLM, then forks it: generous for a loaded 2-core machine


async def is_sleeping(launcher: Obj, port: int) -> bool:
    """What vLLM's own endpoint on the instance's port says."""
    url = f"http://{launcher['status']['podIP']}:{port}/is_sleeping"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200, await response.text()
        return bool((await response.json())["is_sleeping"])


async def instances(env: DualPodsEnv, launcher: Obj) -> dict[str, dict[str, Any]]:
    """The launcher's instances by ISC, as FMA's API lists them."""
    listing = await env.instances(launcher)
    return {i["annotations"][keys.INSTANCE_ISC_NAME]: i for i in listing["instances"]}


async def serve(env: DualPodsEnv, isc: str) -> tuple[Obj, Obj]:
    """Point the requester set at `isc` and scale it to 1: (its Ready requester, its launcher)."""
    await env.set_requester_isc(RS, isc)
    await env.scale(RS, 1)
    requester = await env.ready_requester(RS, within=READY_S)
    return requester, await env.launcher_of(requester)


async def wake_calls(env: DualPodsEnv) -> float:
    """How many wakes the dual-pods controller made (fma_http_latency_seconds, purpose `wake`)."""
    total = 0.0
    for line in (await env.controllers.metrics()).splitlines():
        if line.startswith("fma_http_latency_seconds_count{") and 'purpose="wake"' in line:
            total += float(line.split()[-1])
    return total


async def test_stand_in_servers_behind_a_launcher_speaking_only_fmas_api(env: DualPodsEnv) -> None:
    await swap_there_and_back(env, ["--stand-in"], {isc: f"--model {isc}" for isc in PORTS})


async def swap_there_and_back(env: DualPodsEnv, launcher_args: list[str], options: dict[str, str]) -> None:
    """Serve model A, swap to B and back to A on one FMA-only launcher, each swap through vLLM's sleep/wake."""
    await env.create_launcher_config(
        "lc-fma", max_instances=2, launcher_args=launcher_args, env={"LAUNCHER_FMA_ONLY": "true"}
    )
    await env.create_population_policy("keep", "lc-fma", count=1)  # the launcher outlives its binding
    for isc, port in PORTS.items():
        await env.create_isc(isc, "lc-fma", port=port, options=options[isc])
    node = (await env.cluster.kubelet.nodes())[0]
    await env.create_requesters(RS, "model-a", replicas=0, node=node.name, gpu=sorted(node.gpus)[0])

    requester, launcher = await serve(env, "model-a")
    index = await env.launcher_api(launcher, "GET", "/")
    assert not {SLEEP_ROUTE, WAKE_ROUTE} & index["endpoints"].keys(), "the launcher must speak FMA's API only"
    first = await instances(env, launcher)
    assert set(first) == {"model-a"}
    assert first["model-a"].keys() <= FMA_STATE_KEYS  # no readiness, no sleep state: learned from the instance
    assert not await is_sleeping(launcher, PORTS["model-a"])
    assert await proxy_chat(requester, "model-a")

    # A -> B: A is put to sleep through vLLM's /sleep, B made on the same launcher.
    await release(env, RS)
    assert await is_sleeping(launcher, PORTS["model-a"])
    requester, again = await serve(env, "model-b")
    assert pods.name(again) == pods.name(launcher), "the same launcher serves B"
    assert await proxy_chat(requester, "model-b")

    # B -> A: B sleeps, A is woken through vLLM's /wake_up: the same instance, not made again.
    wakes = await wake_calls(env)
    await release(env, RS)
    assert await is_sleeping(launcher, PORTS["model-b"])
    requester, again = await serve(env, "model-a")
    assert pods.name(again) == pods.name(launcher)
    now = await instances(env, launcher)
    assert now["model-a"]["instance_id"] == first["model-a"]["instance_id"]
    assert now["model-a"]["revision"] == first["model-a"]["revision"], "A was made again, not woken"
    assert not await is_sleeping(launcher, PORTS["model-a"])
    assert await is_sleeping(launcher, PORTS["model-b"])
    assert await wake_calls(env) == wakes + 1
    assert await proxy_chat(requester, "model-a")
    assert pods.labels(again)[keys.SLEEPING_LABEL] == "false"
