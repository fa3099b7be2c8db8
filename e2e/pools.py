"""The warm-pool scenario (issue 45, `bench/pools.py`): models that declare warm pools in a fleet of simulated GPU
Nodes with the real controllers and the real kube-scheduler, scaled 0 -> k -> 0 in waves as KEDA drives them.

The models (InferenceServerConfigs) declare their pools before any requester exists and opt in to sleeper-aware
placement; the scenario waits until every pool is filled (its ISC's `status.pool`). Then each wave scales every model
to `replicas` at once, waits until each requester is told ready, holds them until every pool is filled again (the
keeper makes new copies on idle GPUs while the woken ones serve), scales back to 0 and waits for the fleet to settle.

What is counted, as a user would read it:
- hot first starts: a wave's requesters bound to a launcher whose summary showed their instance asleep when the wave
  began (e2e/hits.py's classification);
- refilled: per model and wave whose pool fell below its count, the seconds from the wave's start until its ISC's
  `status.pool.ready` was back at the count (a pool not refilled by the wave's timeout counts as that);
- over budget: the moments (ledger entries, e2e/simulation) at which a simulated launcher held more instances than
  `maxInstances` or more sleeper bytes than its host budget, from the launchers' own record;
- displaced: instances that were not a pool's copy and went from awake to asleep, stopped or deleted while their
  wave held its requesters (the only instances awake then are the requesters'), from the same record.
"""

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.crds import GROUP, POOL_READY, VERSION, InferenceServerConfig
from api.launcher import EventType
from e2e.dualpods_env import DualPodsEnv
from e2e.hits import FleetWaves, HitsSpec, Outcome
from e2e.scale import ScaleSpec, Scenario, quantile, simulated_fleet
from e2e.simulation.instances import SIMULATED_RSS_BYTES
from e2e.simulation.protocol import LauncherReport

LOOK_S = 0.5
AWAKE = frozenset({EventType.READY, EventType.AWAKE})
GONE = frozenset({EventType.SLEEPING, EventType.STOPPED, EventType.DELETED})


@dataclass(frozen=True)
class PoolsSpec:
    nodes: int = 20
    gpus_per_node: int = 4
    models: int = 5
    pool: int = 4
    min_nodes: int = 2
    replicas: int = 4
    waves: int = 3
    max_instances: int = 2
    sleepers_per_launcher: int = 2  # the host budget: this many simulated sleepers' bytes
    wave_timeout: float = 180.0
    chart_values: tuple[str, ...] = ()

    @property
    def host_budget(self) -> int:
        return self.sleepers_per_launcher * SIMULATED_RSS_BYTES


@dataclass
class PoolsResult:
    cluster_up_s: float = 0.0
    filled_s: float = 0.0  # the pools declared -> every one filled, before any requester
    outcomes: list[Outcome] = field(default_factory=list)
    refills: list[float] = field(default_factory=list)
    over_budget: int = 0
    displaced: int = 0
    timed_out_waves: int = 0
    seconds: float = 0.0

    @property
    def hot(self) -> int:
        return sum(1 for o in self.outcomes if o.start == "hot")


async def pool_status(env: DualPodsEnv, isc: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An ISC's `status.pool` and its PoolReady condition, as the API server holds them (empty until written)."""
    obj = await env.objects.get_namespaced_custom_object(
        GROUP, VERSION, env.namespace, InferenceServerConfig.RESOURCE.plural, isc
    )
    status = obj.get("status") or {}
    condition: dict[str, Any] = next((c for c in status.get("conditions") or [] if c["type"] == POOL_READY), {})
    return status.get("pool") or {}, condition


class PoolWatch:
    """The pools as their ISCs' statuses show them (ready, declared), looked at every LOOK_S."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario

    async def ready(self) -> dict[str, tuple[int, int]]:
        env = self.scenario.env
        listed = await env.objects.list_namespaced_custom_object(
            GROUP, VERSION, env.namespace, "inferenceserverconfigs"
        )
        found = {}
        for isc in listed["items"]:
            pool = (isc.get("status") or {}).get("pool") or {}
            declared = ((isc.get("spec") or {}).get("warmPool") or {}).get("sleepers", 0)
            found[isc["metadata"]["name"]] = (int(pool.get("ready", 0)), int(declared))
        return found

    async def track(self, since: float, refilled: dict[str, float], held: asyncio.Event, within: float) -> bool:
        """Look at the pools until `held` is set and every pool is filled (False: not within `within` s). `refilled`
        collects, per model whose pool was seen below its count, the seconds from `since` until it was filled again
        (or until the time ran out)."""
        started = time.monotonic()
        below: set[str] = set()
        while True:
            pools = await self.ready()
            for model, (ready, declared) in pools.items():
                if ready < declared:
                    below.add(model)
                elif model in below and model not in refilled:
                    refilled[model] = time.time() - since
            if held.is_set() and pools and all(ready >= declared for ready, declared in pools.values()):
                return True
            if time.monotonic() - started > within:
                refilled.update({m: time.time() - since for m in below if m not in refilled})
                return False
            await asyncio.sleep(LOOK_S)


def over_budget(launchers: list[LauncherReport], max_instances: int, host_budget: int) -> int:
    return sum(
        1
        for launcher in launchers
        for e in launcher.ledger
        if e.running > max_instances or e.sleeping_bytes > host_budget
    )


def displaced(launchers: list[LauncherReport], windows: list[tuple[float, float]]) -> int:
    """Instances not made for a pool that left the awake state inside one of `windows` (epoch seconds)."""
    count = 0
    for launcher in launchers:
        last: dict[str, EventType] = {}
        for entry in launcher.ledger:
            before = last.get(entry.instance)
            last[entry.instance] = entry.event
            inside = any(start <= entry.at <= end for start, end in windows)
            if inside and not entry.pool and before in AWAKE and entry.event in GONE:
                count += 1
    return count


async def run_pools(
    spec: PoolsSpec, work_dir: Path, progress: Callable[[str], None] = lambda line: None
) -> PoolsResult:
    result = PoolsResult()
    started = time.monotonic()
    scale = ScaleSpec(
        nodes=spec.nodes, gpus_per_node=spec.gpus_per_node, requesters=0, models=spec.models, probe_period=1,
        wave_timeout=spec.wave_timeout, chart_values=spec.chart_values, gpu_mode="dra",
        warm_pool={"sleepers": spec.pool, "minNodes": spec.min_nodes} if spec.pool else None,
        max_instances=spec.max_instances,
        sleeper_budget={"hostMemoryBytes": spec.host_budget},
    )  # fmt: skip
    async with simulated_fleet(scale, work_dir / "pools", progress) as (scenario, up_seconds):
        result.cluster_up_s = up_seconds
        fleet = FleetWaves(scenario, HitsSpec(shapes=(), wave_timeout=spec.wave_timeout), progress)
        _, ready_seconds, _ = await scenario.populate()
        progress(f"cluster up in {up_seconds:.0f} s, {len(scenario.pods.launchers())} launchers Ready in "
                 f"{ready_seconds:.0f} s; {spec.models} models, " +
                 (f"each declaring a pool of {spec.pool}" if spec.pool else "no pool declared"))  # fmt: skip
        declared = time.monotonic()
        await fleet.create_models()
        await fleet.set_placement(True)
        watch = PoolWatch(scenario)
        held = asyncio.Event()
        held.set()
        if not await watch.track(time.time(), {}, held, spec.wave_timeout):
            raise TimeoutError(f"the pools were not filled within {spec.wave_timeout:g} s: {await watch.ready()}")
        result.filled_s = time.monotonic() - declared
        if spec.pool:
            progress(f"every pool filled {result.filled_s:.1f} s after it was declared")
        windows: list[tuple[float, float]] = []
        for i in range(spec.waves):
            counts = dict.fromkeys(scenario.models, spec.replicas)
            refilled: dict[str, float] = {}
            since, held = time.time(), asyncio.Event()
            looking = asyncio.create_task(watch.track(since, refilled, held, spec.wave_timeout))
            hold = functools.partial(_hold, looking, held, since, windows, result)
            outcomes, _, timed_out = await fleet.wave(counts, hold)
            result.outcomes += outcomes
            result.refills += refilled.values()
            result.timed_out_waves += timed_out
            hot = sum(1 for o in outcomes if o.start == "hot")
            refills = ", ".join(f"{s:.1f}" for s in refilled.values())
            progress(f"  wave {i + 1}/{spec.waves}: {hot} of {len(outcomes)} first starts hot; "
                     + (f"pools refilled in {refills} s" if refills else "no pool fell short"))  # fmt: skip
        launchers = (await scenario.report("launcher")).launchers
        result.over_budget = over_budget(launchers, spec.max_instances, spec.host_budget)
        result.displaced = displaced(launchers, windows)
    result.seconds = time.monotonic() - started
    return result


async def _hold(
    looking: "asyncio.Task[bool]",
    held: asyncio.Event,
    since: float,
    windows: list[tuple[float, float]],
    result: PoolsResult,
) -> None:
    """A wave's requesters, all told ready, are held until every pool is filled again: the wave's window ends then."""
    held.set()
    if not await looking:
        result.timed_out_waves += 1
    windows.append((since, time.time()))


def pools_line(result: PoolsResult) -> str:
    """`pools: hot H of N first starts (R%); refilled p99 X s; over budget V; displaced D`."""
    n = len(result.outcomes)
    rate = f"{100 * result.hot / n:.1f}%" if n else "n/a"
    refill = f"{quantile(result.refills, 0.99):.1f}" if result.refills else "0.0"
    return (
        f"pools: hot {result.hot} of {n} first starts ({rate}); refilled p99 {refill} s; "
        f"over budget {result.over_budget}; displaced {result.displaced}"
    )
