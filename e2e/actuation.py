"""Scaling a requester set up and timing the new requester's actuation, from its own log.

The requester logs its process start (as `seconds_after_start` of its first become-ready), when its SPI
listens, and when its first become-ready arrived, all on this host's clock: exact to the millisecond.
The Pod's Ready condition, which the kubelet's readiness probe adds on top, is timed by polling.
"""

import json
import time
from dataclasses import dataclass
from datetime import datetime

from api import keys
from controller import pods
from e2e.dualpods_env import DualPodsEnv, Obj
from e2e.waiting import wait_for

LOGGED_WITHIN_S = 30.0  # a line reaches the log file within milliseconds on a quiet machine
VLLM_READY_S = 300  # a new launcher preloads vLLM, then forks it: generous for a loaded 2-core machine
# A bound on "woken, not loaded", not a goal: a quiet hot start with vLLM takes 0.4-0.6 s, a quiet cold one about
# 1 s (a new instance in a preloaded launcher), so a start above this cannot have been a wake.
HOT_WITHIN_S = 10.0


@dataclass
class Actuation:
    requester: str
    total: float  # requester process start -> first become-ready
    requester_startup: float  # requester process start -> its SPI listening
    pod_ready: float  # requester process start -> the Pod's Ready condition seen by the API


def log_times(text: str) -> tuple[float, float, float]:
    """(process start, SPI listening, first become-ready) as epoch seconds, from the requester's log."""
    serving = ready = after = None
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        at = datetime.fromisoformat(entry["time"]).timestamp()
        if entry.get("msg") == "serving" and entry.get("server") == "spi":
            serving = at
        elif entry.get("msg") == "first become-ready":
            ready, after = at, float(entry["seconds_after_start"])
    if serving is None or ready is None or after is None:
        raise RuntimeError(f"the requester's log lacks its timings:\n{text[-2000:]}")
    return ready - after, serving, ready


async def actuate(env: DualPodsEnv, replica_set: str, within: float = 300) -> Actuation:
    """Scale `replica_set` from 0 to 1 and time its new requester's actuation."""
    await env.scale(replica_set, 1)
    ready_seen = 0.0

    async def ready() -> Obj:
        nonlocal ready_seen
        found = await env.requesters(replica_set)
        if found and pods.is_ready(found[0]):
            ready_seen = time.time()
            return found[0]
        return {}

    pod = await wait_for(ready, what=f"a Ready requester of {replica_set}", within=within, interval=0.05)
    v1pod = await env.core.read_namespaced_pod(pod["metadata"]["name"], env.namespace)
    # A real container's output reaches its log file through its runtime's monitor (conmon), a moment after the
    # requester wrote it: the Pod can be seen Ready before its first become-ready line is in the file.
    started, serving, relayed = await wait_for(
        lambda: log_times(env.cluster.container_log(v1pod, keys.INFERENCE_SERVER_CONTAINER)),
        what="the requester's timings in its log",
        within=LOGGED_WITHIN_S,
    )
    return Actuation(
        requester=pod["metadata"]["name"],
        total=relayed - started,
        requester_startup=serving - started,
        pod_ready=ready_seen - started,
    )


async def release(env: DualPodsEnv, replica_set: str) -> None:
    """Scale `replica_set` to 0 and wait until every launcher is unbound (its instance asleep)."""
    await env.scale(replica_set, 0)
    await env.wait_gone(replica_set, within=120)
    await env.wait_launchers_unbound(within=120, interval=0.05)


async def release_one(env: DualPodsEnv, replica_set: str) -> None:
    """Scale `replica_set` (one requester) to 0 and wait until its launcher is unbound (its instance asleep); other
    launchers may stay bound."""
    (requester,) = await env.requesters(replica_set)
    launcher = pods.name(await env.launcher_of(requester))
    await env.scale(replica_set, 0)
    await env.wait_gone(replica_set, within=120)

    async def unbound() -> bool:
        return pods.binding(await env.pod(launcher)) is None

    await wait_for(unbound, what=f"launcher {launcher} unbound", within=120, interval=0.1)
