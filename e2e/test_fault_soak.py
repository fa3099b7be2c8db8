"""The fault soak (issue 10 item 7): 100 swaps between two models on the loopback cluster with the stand-in,
and 20 faults at random moments of them, drawn from: SIGKILL of the dual-pods controller, of a launcher
process (its container restarts), of an instance, of an engine-core process, of a requester; SIGSTOP of
an instance for 40 s; one kube-apiserver restart; one cut of the controllers' watch connections to a
launcher. After each fault and at the end the invariants must hold within 10 s of convergence:

- no GPU with two awake instances;
- every Ready requester is bound both ways to exactly one awake instance that serves its model;
- no binding names a missing Pod;
- no leaked process: every instance process belongs to a launcher that reports it, none stays stopped;
  a launcher's only other children are its zygotes, one per runtime.

Convergence is timed from the end of each fault (the kill, the resume after 40 s, the API server ready
again) until the invariants hold and the requester's proxy answers 200. The test's bound on it is one of
correctness, CONVERGE_WITHIN_S: 180 s, 37 times the quiet p99 (4.9 s; docs/reliability.md), so a fault the
system never recovers from fails, however busy the machine. How fast it recovers (the goal: p99 within 10 s)
is a performance figure, measured by `bench/fault_soak.py`, which runs this test and reads its report. The
report (faults by kind, violations, convergence p50/p99/max) is printed and written to $DUALPODS_SOAK_REPORT
when set; its figures go in docs/reliability.md. The draw is seeded ($DUALPODS_SOAK_SEED, default 10) so a failure can
be replayed.
"""

import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import time
from asyncio.subprocess import DEVNULL
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from api import keys
from controller import pods
from e2e.chart import DUAL_PODS
from e2e.cluster.cluster import LoopbackCluster
from e2e.dualpods_env import DualPodsEnv, Obj, installed
from e2e.faults import (
    engine_process,
    instance_process,
    launcher_process,
    namespace_pid,
    proxy_answers,
    requester_process,
    signal_tree,
)
from e2e.fixtures import fresh_namespace
from e2e.waiting import wait_for
from kube.client import API_FAILURES
from launcher import zygote

pytestmark = pytest.mark.asyncio(loop_scope="session")

SWAPS = 100
FAULTS = 20
RS = "soak"
MODELS = {"isc-a": "a", "isc-b": "b"}
DELAYS = "--startup-delay 0.3 --sleep-delay 0.1 --wake-delay 0.1"
INVARIANT_WITHIN_S = 10.0
CONVERGE_WITHIN_S = 180.0  # a correctness bound: 37 x the quiet p99 of 4.9 s
STOP_S = 40.0
SOAK_WITHIN_S = 900  # the whole soak; it takes about 6 minutes
# Each kind as many times as the issue asks (the API-server restart and the watch cut once), the rest
# drawn evenly from the kinds that can repeat.
ONCE = ("apiserver-restart", "watch-cut")
REPEATED = ("controller", "launcher", "instance", "engine-core", "requester", "instance-stop")


def draw(rng: random.Random) -> tuple[dict[int, str], dict[int, float]]:
    """Which swaps get a fault, of which kind, and how far into the swap it lands (seconds)."""
    kinds = [*ONCE, *(REPEATED[i % len(REPEATED)] for i in range(FAULTS - len(ONCE)))]
    rng.shuffle(kinds)
    at = sorted(rng.sample(range(1, SWAPS), FAULTS))
    return dict(zip(at, kinds, strict=True)), {i: rng.uniform(0.0, 2.0) for i in at}


@pytest.fixture(scope="module")
async def soak_env(cluster: LoopbackCluster, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[DualPodsEnv]:
    async with (
        await cluster.api_client() as api,
        fresh_namespace(api, "fault-soak") as namespace,
        installed(cluster, api, namespace, tmp_path_factory.mktemp("soak")) as env,
    ):
        yield env


# ----- the invariants


async def violations(env: DualPodsEnv) -> list[str]:
    """What is wrong now (empty: every invariant holds)."""
    found: list[str] = []
    every = {p["metadata"]["name"]: p for p in await env.pods()}
    launchers = [p for p in every.values() if pods.is_launcher(p) and not pods.is_deleting(p)]
    awake_on_gpu: Counter[str] = Counter()
    listings: dict[str, dict[str, Any]] = {}
    for launcher in launchers:
        if not pods.is_ready(launcher):
            continue
        listing = await env.instances(launcher)
        listings[launcher["metadata"]["name"]] = listing
        for state in listing["instances"]:
            if state["status"] == "running" and not state["sleeping"]:
                for gpu in state.get("gpu_uuids") or []:
                    awake_on_gpu[f"{pods.node_name(launcher)}/{gpu}"] += 1
        binding = pods.binding(launcher)
        if binding is not None:
            bound_to = every.get(binding.requester_name)
            if bound_to is None or pods.uid(bound_to) != binding.requester_uid:
                found.append(f"launcher {launcher['metadata']['name']} is bound to a missing Pod {binding}")
    found += [f"GPU {gpu} has {n} awake instances" for gpu, n in awake_on_gpu.items() if n > 1]
    for requester in (p for p in every.values() if pods.is_requester(p) and pods.is_ready(p)):
        found += _served(requester, every, listings)
    found += _leaks(launchers, listings)
    return found


def _served(requester: Obj, every: dict[str, Obj], listings: dict[str, dict[str, Any]]) -> list[str]:
    name = requester["metadata"]["name"]
    launcher = every.get(pods.labels(requester).get(keys.DUAL_LABEL, ""))
    binding = pods.binding(launcher) if launcher is not None else None
    if launcher is None or binding is None or binding.requester_uid != pods.uid(requester):
        return [f"Ready requester {name} is not bound both ways"]
    wanted = pods.annotations(launcher).get(keys.INSTANCE_ID_ANNOTATION)
    if pods.labels(requester).get(keys.INSTANCE_LABEL) != wanted:
        return [f"Ready requester {name} is labelled with another instance than its launcher's {wanted}"]
    listing = listings.get(launcher["metadata"]["name"])
    states = {s["instance_id"]: s for s in (listing or {}).get("instances", [])}
    state = states.get(wanted or "")
    if state is None or state["status"] != "running" or state["sleeping"]:
        return [f"Ready requester {name}'s instance {wanted} is not awake"]
    isc = pods.annotations(requester).get(keys.INFERENCE_SERVER_CONFIG_ANNOTATION)
    if (state.get("annotations") or {}).get("isc-name") != isc:
        return [f"Ready requester {name}'s instance serves another model than {isc}"]
    return []


def _leaks(launchers: list[Obj], listings: dict[str, dict[str, Any]]) -> list[str]:
    """Instance processes that no launcher reports, or that stay stopped; more than one zygote of a runtime
    (a launcher's other child: instances fork from it)."""
    found: list[str] = []
    for launcher in launchers:
        listing = listings.get(launcher["metadata"]["name"])
        if listing is None:
            continue
        try:
            process = launcher_process(launcher["status"]["podIP"])
        except LookupError:
            continue
        reported = {s["process"]["pid"] for s in listing["instances"] if s.get("process")}
        zygotes: Counter[str] = Counter()
        for child in process.children():
            with _gone_ok():
                title = " ".join(child.cmdline())
                if title.startswith(zygote.TITLE_PREFIX):  # or an instance just forked from one, not yet renamed
                    zygotes[title] += 1
                elif namespace_pid(child) not in reported:
                    found.append(f"launcher {launcher['metadata']['name']} has an unreported child {child.pid}")
                elif child.status() == psutil.STATUS_STOPPED:
                    found.append(f"instance process {child.pid} stays stopped")
        name = launcher["metadata"]["name"]
        found += [f"launcher {name} has {n} processes titled {title!r}" for title, n in zygotes.items() if n > 1]
    return found


def _gone_ok() -> contextlib.suppress:
    """A process that exited meanwhile is no error."""
    return contextlib.suppress(psutil.NoSuchProcess, FileNotFoundError)


# ----- the faults


async def bound_launcher(env: DualPodsEnv) -> Obj | None:
    found = [p for p in await env.requesters(RS) if keys.DUAL_LABEL in pods.labels(p)]
    return await env.launcher_of(found[0]) if found else None


async def instance_of(env: DualPodsEnv, launcher: Obj) -> psutil.Process | None:
    wanted = pods.annotations(launcher).get(keys.INSTANCE_ID_ANNOTATION, "")
    try:
        return await instance_process(env, launcher, wanted)
    except (StopIteration, LookupError, KeyError, TypeError):
        return None


async def serving_launcher(env: DualPodsEnv) -> tuple[Obj, psutil.Process]:
    """The launcher bound to the soak's requester and its instance's process, once there are both (a fault
    that lands between an unbind and the next bind waits for them, so every fault hits something)."""

    async def found() -> tuple[Obj, psutil.Process] | None:
        launcher = await bound_launcher(env)
        if launcher is None or not pods.is_ready(launcher):
            return None
        instance = await instance_of(env, launcher)
        return (launcher, instance) if instance is not None else None

    result = await wait_for(found, what="a serving launcher to inject into", within=60, interval=0.1)
    assert result is not None
    return result


async def inject(env: DualPodsEnv, cluster: LoopbackCluster, kind: str) -> str:
    """Inject one fault; returns what was done (for the report). Returns once the fault is over."""
    if kind == "controller":
        env.controllers.kill(DUAL_PODS)
        return "killed the dual-pods controller"
    if kind == "apiserver-restart":
        cluster.stop_apiserver()
        took = await cluster.start_apiserver()
        return f"restarted the kube-apiserver (ready again after {took:.1f} s)"
    if kind == "requester":
        requester = await wait_for(lambda: _running_requester(env), what="a requester to kill", within=60)
        assert requester is not None
        name, pid = requester
        os.kill(pid, signal.SIGKILL)
        return f"killed requester {name}"
    launcher, instance = await serving_launcher(env)
    ip = launcher["status"]["podIP"]
    if kind == "launcher":
        launcher_process(ip).send_signal(signal.SIGKILL)
        return f"killed launcher {launcher['metadata']['name']}"
    if kind == "watch-cut":
        cut = await asyncio.create_subprocess_exec("ss", "-K", "dst", ip, "dport", "=", "8001", stdout=DEVNULL)
        await cut.wait()
        return f"cut the watch connections to launcher {launcher['metadata']['name']}"
    if kind == "instance":
        instance.send_signal(signal.SIGKILL)
        return f"killed instance process {instance.pid}"
    if kind == "engine-core":  # only the engine: its server stays up, wedged, until the launcher sees it
        # Forked by the instance as it starts, so a fault that lands at its start waits a moment for it.
        engine = await wait_for(lambda: engine_process(instance), what="its engine process", within=10, interval=0.05)
        engine.send_signal(signal.SIGKILL)
        return f"killed engine process {engine.pid} of instance {instance.pid}"
    signal_tree(instance, signal.SIGSTOP)
    await asyncio.sleep(STOP_S)
    with _gone_ok():
        signal_tree(instance, signal.SIGCONT)
    return f"stopped instance process {instance.pid} for {STOP_S:.0f} s"


async def _running_requester(env: DualPodsEnv) -> tuple[str, int] | None:
    for requester in await env.requesters(RS):
        with contextlib.suppress(LookupError, KeyError):
            return requester["metadata"]["name"], requester_process(requester["status"]["podIP"]).pid
    return None


# ----- the soak


async def swap(env: DualPodsEnv, isc: str) -> None:
    await env.scale(RS, 0)
    await env.wait_gone(RS, within=120)
    await env.wait_launchers_unbound(within=120)
    await env.set_requester_isc(RS, isc)
    await env.scale(RS, 1)


async def serving(env: DualPodsEnv, isc: str) -> bool:
    found = [p for p in await env.requesters(RS) if pods.is_ready(p)]
    return len(found) == 1 and await proxy_answers(found[0], MODELS[isc])


@pytest.mark.timeout(SOAK_WITHIN_S + 60)
async def test_fault_soak(soak_env: DualPodsEnv, cluster: LoopbackCluster) -> None:
    # Bounded inside the test's own task, so a soak that runs over fails here and now (pytest-timeout's
    # alarm would leave the task running on the session's loop, under the tests that follow).
    async with asyncio.timeout(SOAK_WITHIN_S):
        await soak(soak_env, cluster)


async def soak(env: DualPodsEnv, cluster: LoopbackCluster) -> None:
    rng = random.Random(int(os.environ.get("DUALPODS_SOAK_SEED", "10")))
    faults_at, delays = draw(rng)
    await env.create_launcher_config("lc", max_instances=2, launcher_args=["--stand-in"])
    await env.create_population_policy("keep-one", "lc", count=1)
    for isc, model in MODELS.items():
        await env.create_isc(isc, "lc", port=8005 if model == "a" else 8006, options=f"--model {model} {DELAYS}")
    node = (await cluster.kubelet.nodes())[0]
    await env.create_requesters(RS, "isc-a", node=node.name, gpu=sorted(node.gpus)[0])
    await wait_for(lambda: serving(env, "isc-a"), what="the first requester served", within=120)
    started = time.monotonic()
    done: list[dict[str, Any]] = []
    broken: list[str] = []
    isc = "isc-a"
    for i in range(SWAPS):
        isc = "isc-b" if isc == "isc-a" else "isc-a"
        print(f"soak: swap {i} to {isc} at {time.monotonic() - started:.1f} s", flush=True)
        stepping = asyncio.create_task(swap(env, isc))
        if i in faults_at:
            await asyncio.sleep(delays[i])
            what = await inject(env, cluster, faults_at[i])
            print(f"soak: fault {faults_at[i]}: {what}", flush=True)
            await _settle(env, stepping, isc)
            took, wrong = await converge(env, isc)
            done.append({"swap": i, "kind": faults_at[i], "what": what, "convergence_s": round(took, 2)})
            broken += [f"after fault {faults_at[i]} at swap {i}: {w}" for w in wrong]
        else:
            await _settle(env, stepping, isc)
            await wait_for(lambda: serving(env, isc), what=f"swap {i} served", within=120)  # noqa: B023
    _, wrong = await converge(env, isc)
    broken += [f"at the end: {w}" for w in wrong]
    report = summary(done, broken, time.monotonic() - started)
    print(json.dumps(report, indent=2))
    if path := os.environ.get("DUALPODS_SOAK_REPORT"):
        Path(path).write_text(json.dumps(report, indent=2))
    if broken:
        print(await env.controllers.log_tail(lines=200))
    assert broken == [], broken


async def _settle(env: DualPodsEnv, task: "asyncio.Task[None]", isc: str) -> None:
    """The swap that a fault cut into finishes; one whose wait timed out, or whose own call the API server's
    restart cut off, is done again (not a violation in itself: convergence is what counts)."""
    try:
        await task
    except API_FAILURES:  # TimeoutError among them
        await swap(env, isc)


async def converge(env: DualPodsEnv, isc: str) -> tuple[float, list[str]]:
    """Seconds until the requester serves `isc` and the invariants hold; then whatever still does not hold
    INVARIANT_WITHIN_S later (violations)."""
    started = time.monotonic()

    async def settled() -> bool:
        return await serving(env, isc) and not await violations(env)

    try:
        await wait_for(settled, what="convergence", within=CONVERGE_WITHIN_S, interval=0.2)
    except TimeoutError:
        return time.monotonic() - started, await violations(env) or ["the requester never served again"]
    took = time.monotonic() - started
    await asyncio.sleep(0.5)
    try:
        await wait_for(lambda: _none(env), what="the invariants", within=INVARIANT_WITHIN_S, interval=0.5)
    except TimeoutError:
        return took, await violations(env)
    return took, []


async def _none(env: DualPodsEnv) -> bool:
    return not await violations(env)


def summary(done: list[dict[str, Any]], broken: list[str], elapsed: float) -> dict[str, Any]:
    times = sorted(d["convergence_s"] for d in done)
    return {
        "swaps": SWAPS,
        "faults": len(done),
        "by_kind": dict(Counter(d["kind"] for d in done)),
        "violations": broken,
        "convergence_s": {
            "p50": round(statistics.median(times), 2) if times else 0.0,
            "p99": round(times[min(len(times) - 1, int(0.99 * len(times)))], 2) if times else 0.0,
            "max": round(times[-1], 2) if times else 0.0,
        },
        "elapsed_s": round(elapsed, 1),
        "faults_done": done,
    }
