"""Killing the dual-pods controller (SIGKILL) at different points of a swap, many times: after the
kubelet restarts it, the system converges to a correct state, because every durable fact lives in
API objects and every reconcile is idempotent.

Launchers run the stand-in server with start-up, sleep and wake delays, so each swap has windows
(binding, instance creation, waking, relaying readiness, unbinding, sleeping) for a kill to land in.
"""

import asyncio
from collections.abc import Awaitable, Callable

from api import keys
from e2e.chart import DUAL_PODS
from e2e.dualpods_env import DualPodsEnv
from e2e.waiting import wait_for

RS = "swapper"
DELAYS = "--startup-delay 0.8 --sleep-delay 0.3 --wake-delay 0.3"
# Seconds after starting a swap step at which the controller is killed.
KILL_AFTER = (0.05, 0.3, 0.6, 1.0, 1.5, 0.15, 0.8, 2.0)


async def assert_consistent(env: DualPodsEnv, isc: str) -> None:
    """The one requester is Ready and bound both ways to a launcher whose one awake instance is the
    requester's; every other instance sleeps; no unbound launcher serves; no binding dangles."""
    requester = await env.ready_requester(RS, within=60)
    launcher = await env.launcher_of(requester)
    meta, requester_meta = launcher["metadata"], requester["metadata"]
    assert meta["annotations"][keys.REQUESTER_ANNOTATION] == f"{requester_meta['uid']} {requester_meta['name']}"
    assert meta["labels"][keys.SLEEPING_LABEL] == "false"
    assert keys.PROVIDER_FINALIZER in meta.get("finalizers", [])
    assert keys.REQUESTER_FINALIZER in requester_meta.get("finalizers", [])
    wanted = meta["annotations"][keys.INSTANCE_ID_ANNOTATION]
    assert requester_meta["labels"][keys.INSTANCE_LABEL] == wanted
    for other in await env.launchers():
        listing = await env.instances(other)
        awake = [i["instance_id"] for i in listing["instances"] if not i["sleeping"]]
        if other["metadata"]["name"] == meta["name"]:
            assert awake == [wanted]
            states = {i["instance_id"]: i for i in listing["instances"]}
            assert states[wanted]["annotations"]["isc-name"] == isc
        else:
            assert awake == [], f"unbound launcher {other['metadata']['name']} serves {awake}"
            assert keys.REQUESTER_ANNOTATION not in (other["metadata"].get("annotations") or {})


async def kill_after(env: DualPodsEnv, delay: float) -> None:
    await asyncio.sleep(delay)
    await wait_for(lambda: env.controllers.kill(DUAL_PODS), what="a running controller to kill", within=60)


async def test_swaps_converge_after_controller_kills(env: DualPodsEnv) -> None:
    await env.create_launcher_config("lc", max_instances=2, launcher_args=["--stand-in"])
    await env.create_population_policy("keep-one", "lc", count=1)
    await env.create_isc("isc-a", "lc", port=8005, options=f"--model a {DELAYS}")
    await env.create_isc("isc-b", "lc", port=8006, options=f"--model b {DELAYS}")
    node = (await env.cluster.kubelet.nodes())[0]
    await env.create_requesters(RS, "isc-a", node=node.name, gpu=sorted(node.gpus)[0])
    await assert_consistent(env, "isc-a")

    for round_, delay in enumerate(KILL_AFTER):
        target = "isc-b" if round_ % 2 == 0 else "isc-a"
        # Unbind step (sleep the instance, clear the binding), with a kill during it on odd rounds.
        await env.scale(RS, 0)
        if round_ % 2:
            await kill_after(env, delay)
        await env.wait_gone(RS, within=90)
        await env.wait_launchers_unbound(within=90)
        # Bind step (select, bind, create or wake, relay readiness), with a kill during it on even rounds.
        await env.set_requester_isc(RS, target)
        await env.scale(RS, 1)
        if round_ % 2 == 0:
            await kill_after(env, delay)
        await assert_consistent(env, target)

    async def restarts() -> int:
        pods = await env.controllers.pods(DUAL_PODS)
        return sum(s.restart_count for p in pods for s in p.status.container_statuses or [])

    await wait_for(lambda: _equals(restarts, len(KILL_AFTER)), what="a restart per kill", within=30)


async def _equals(count: Callable[[], Awaitable[int]], expected: int) -> bool:
    return await count() == expected
