"""The fleet hit-rate scenario (issue 44, `bench/hits.py`): how often a requester that could start hot does, in
a fleet of simulated GPU Nodes with the real controllers and the real kube-scheduler, with sleeper-aware
placement off (the stock scheduler alone, as FMA places requesters) and on, over the same waves.

Per shape (Nodes x GPUs, device plugin or DRA): a loopback cluster of simulated Nodes (`e2e/scale.py`), the chart,
one launcher per GPU (2 instances at most each), M models (InferenceServerConfigs) and a ReplicaSet of requesters
per model at 0. Warm-up waves leave sleepers where the stock scheduler happened to put earlier traffic. Then the
same seeded waves run twice, placement off and then on (the ISCs' placement annotation): each wave scales a few
models 0 -> k, as KEDA drives them, waits until every requester is told ready, scales them back to 0 and waits
until the fleet settles (every requester gone, every launcher unbound, their summaries showing sleepers only).

For each requester of a measured wave, read from the API objects as a user would:
- hot: bound to a launcher whose summary showed its instance asleep when the wave began (a sleeper woken);
  warm: bound to a launcher that existed then, with a new instance; cold: bound to a launcher made for it;
- possible-hot: when the wave began, a sleeper of its model sat on a free GPU in an unbound launcher. Requesters
  compete for sleepers: a GPU and a launcher count for one requester each (a greedy matching, the models with the
  fewest sleepers first), and a model's hot starts are counted up to its possible ones;
- placement time: its Pod's creation -> scheduled (this harness's watch).
"""

import asyncio
import collections
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kubernetes_asyncio import client

from api import keys, launcher_summary
from api.launcher_summary import SummaryState
from controller import pods
from controller.dualpods.placement.choice import decided, opted_in_expression
from e2e.dualpods_env import Obj
from e2e.kubelet.config import GpuMode
from e2e.scale import ScaleSpec, Scenario, quantile, simulated_fleet
from e2e.waiting import wait_for

Start = Literal["hot", "warm", "cold", "not ready"]
SETTLE_LOOKS = 3  # the fleet must look settled this many times in a row, LOOK_S apart
LOOK_S = 0.5


@dataclass(frozen=True)
class Shape:
    name: str
    nodes: int
    gpus_per_node: int
    gpu_mode: GpuMode

    @property
    def names_gpu(self) -> bool:
        """Whether Kubernetes can be told the GPU, not only the Node: one GPU per Node, or DRA's allocator."""
        return self.gpus_per_node == 1 or self.gpu_mode == "dra"


SHAPES = {
    shape.name: shape
    for shape in (
        Shape("200x1-dp", 200, 1, "device-plugin"),
        Shape("50x4-dra", 50, 4, "dra"),
        Shape("50x4-dp", 50, 4, "device-plugin"),
    )
}


@dataclass(frozen=True)
class HitsSpec:
    shapes: tuple[Shape, ...]
    models: int = 20
    warmup_waves: int = 3
    waves: int = 8
    models_per_wave: int = 6
    max_replicas: int = 3
    seed: int = 44
    wave_timeout: float = 180.0
    chart_values: tuple[str, ...] = ()

    def plan(self, count: int, rng: random.Random, models: list[str], per_wave: int) -> list[dict[str, int]]:
        """`count` waves, each scaling `per_wave` of `models` to 1..max_replicas."""
        return [
            {m: rng.randint(1, self.max_replicas) for m in rng.sample(models, min(per_wave, len(models)))}
            for _ in range(count)
        ]


@dataclass(frozen=True)
class Sleeper:
    """An instance asleep on one GPU, as its launcher's summary says."""

    launcher: str
    node: str
    gpu: str
    isc: str
    instance: str


@dataclass
class Outcome:
    """One requester of a measured wave."""

    model: str
    start: Start
    placement_s: float | None  # created -> scheduled
    decision: str | None = None  # the placement webhook's result (PlacedOnSleeper, NoSleeper, ...), if it decided
    landed: bool = False  # scheduled on the Node the decision preferred


@dataclass
class Run:
    """The measured waves of one shape, with placement off or on."""

    placement: bool
    outcomes: list[Outcome] = field(default_factory=list)
    possible: int = 0  # P
    hot_of_possible: int = 0  # H: hot starts, counted per model up to its possible ones
    timed_out_waves: int = 0

    def count(self, start: Start) -> int:
        return sum(1 for o in self.outcomes if o.start == start)

    def placement_times(self) -> list[float]:
        return [o.placement_s for o in self.outcomes if o.placement_s is not None]


@dataclass
class ShapeResult:
    shape: Shape
    cluster_up_seconds: float
    launchers_ready_seconds: float
    sleepers_after_warmup: int
    runs: list[Run] = field(default_factory=list)
    seconds: float = 0.0


def sleepers(launchers: list[Obj]) -> list[Sleeper]:
    """The single-GPU sleepers of InferenceServerConfigs that the launchers' summaries show."""
    found = []
    for launcher in launchers:
        summary = launcher_summary.of_pod(launcher)
        for entry in summary.instances if summary is not None else []:
            if entry.state is SummaryState.ASLEEP and entry.isc is not None and len(entry.gpus) == 1:
                node = str(pods.node_name(launcher))
                found.append(Sleeper(pods.name(launcher), node, entry.gpus[0], entry.isc, entry.id))
    return found


def possible_hot(wanted: dict[str, int], found: list[Sleeper]) -> dict[str, int]:
    """How many of each model's requesters could start hot, when every GPU is free and every launcher unbound:
    each GPU and each launcher serves one requester (greedy, the models with the fewest sleepers first)."""
    by_model: dict[str, list[Sleeper]] = collections.defaultdict(list)
    for sleeper in found:
        by_model[sleeper.isc].append(sleeper)
    gpus: set[tuple[str, str]] = set()
    launchers: set[str] = set()
    matched: collections.Counter[str] = collections.Counter()
    for model in sorted(wanted, key=lambda m: (len(by_model[m]), m)):
        for sleeper in by_model[model]:
            if matched[model] >= wanted[model]:
                break
            if (sleeper.node, sleeper.gpu) in gpus or sleeper.launcher in launchers:
                continue
            gpus.add((sleeper.node, sleeper.gpu))
            launchers.add(sleeper.launcher)
            matched[model] += 1
    return dict(matched)


class FleetWaves:
    """Drives one shape's waves on a running scenario and classifies their requesters."""

    def __init__(self, scenario: Scenario, spec: HitsSpec, progress: Callable[[str], None]) -> None:
        self.scenario = scenario
        self.spec = spec
        self.progress = progress

    async def create_models(self) -> None:
        """The ISCs and, for each, its ReplicaSet of requesters at 0."""
        await self.scenario.create_models()
        for model in self.scenario.models:
            await self.scenario.create_requesters(model, 0)

    async def set_placement(self, on: bool) -> None:
        """Every model opts in to sleeper-aware placement (on), or says nothing (off: the chart's default); then
        until the webhook's match condition, which the leader keeps, says so (a user's next requesters may come
        a moment before it does; the waves must not)."""
        value = keys.PLACEMENT_PREFER_SLEEPER if on else None
        env = self.scenario.env
        for model in self.scenario.models:
            await env.objects.patch_namespaced_custom_object(
                "fma.llm-d.ai", "v1alpha1", env.namespace, "inferenceserverconfigs", model,
                {"metadata": {"annotations": {keys.PLACEMENT_ANNOTATION: value}}},
                _content_type="application/merge-patch+json",
            )  # fmt: skip
        wanted = opted_in_expression({m: value for m in self.scenario.models} if value else {}, default_on=False)
        admission = client.AdmissionregistrationV1Api(env.api)

        async def current() -> bool:
            for configuration in (await admission.list_mutating_webhook_configuration()).items:
                for webhook in configuration.webhooks or []:
                    if any(c.expression == wanted for c in webhook.match_conditions or []):
                        return True
            return False

        await wait_for(current, what="the placement webhook's match condition", within=60, interval=0.2)

    async def wave(
        self, counts: dict[str, int], hold: Callable[[], Awaitable[None]] | None = None
    ) -> tuple[list[Outcome], dict[str, int], bool]:
        """Scale `counts`' models up, until each requester is told ready, classify them, await `hold` (if any), scale
        back to 0 and wait for the fleet to settle. Returns the outcomes, the possible-hot count per model and whether
        it timed out."""
        watch = self.scenario.pods
        before = watch.launchers()
        asleep = {(s.launcher, s.instance) for s in sleepers(before)}
        existing = {pods.name(p) for p in before}
        possible = possible_hot(counts, sleepers(before))
        started = time.time()
        for model, count in counts.items():
            await self.scenario.env.scale(model, count)
        ready, timed_out = await self._told_ready(counts, started)
        bound = {b.requester_uid: p for p in watch.launchers() if (b := pods.binding(p)) is not None}
        outcomes = []
        for model in counts:
            for requester in watch.requesters(model):
                uid = pods.uid(requester)
                reached = watch.milestones.get(uid, {})
                placed = reached["scheduled"] - reached["created"] if {"scheduled", "created"} <= set(reached) else None
                start = _start(uid in ready, bound.get(uid), asleep, existing)
                decision = decided(requester)
                spot = decision.spot if decision is not None else None
                landed = spot is not None and spot.node == pods.node_name(requester)
                outcomes.append(Outcome(model, start, placed, decision.result.value if decision else None, landed))
        if hold is not None:
            await hold()
        for model in counts:
            await self.scenario.env.scale(model, 0)
        await self._settled(started)
        return outcomes, possible, timed_out

    async def _told_ready(self, counts: dict[str, int], started: float) -> tuple[set[str], bool]:
        """The UIDs of the wave's requesters told ready, once all are (or the wave timed out)."""
        wanted = sum(counts.values())
        while True:
            report = await self.scenario.report("requester")
            current = {pods.uid(p) for m in counts for p in self.scenario.pods.requesters(m) if not pods.is_deleting(p)}
            ready = {r.uid for r in report.requesters if r.ready and r.uid in current}
            if len(ready) >= wanted:
                return ready, False
            if time.time() - started > self.spec.wave_timeout:
                return ready, True
            await asyncio.sleep(LOOK_S)

    async def _settled(self, started: float) -> None:
        """Until no requester is left, no launcher is bound and every summary shows sleepers only, SETTLE_LOOKS
        looks in a row (a summary is written a second after its launcher's change)."""
        calm = 0
        while calm < SETTLE_LOOKS:
            await asyncio.sleep(LOOK_S)
            calm = calm + 1 if self._calm() else 0
            if time.time() - started > 2 * self.spec.wave_timeout:
                raise TimeoutError("the fleet did not settle after a wave")

    def _calm(self) -> bool:
        watch = self.scenario.pods
        if watch.requesters():
            return False
        for launcher in watch.launchers():
            summary = launcher_summary.of_pod(launcher)
            busy = summary is not None and any(e.state is not SummaryState.ASLEEP for e in summary.instances)
            if pods.binding(launcher) is not None or busy:
                return False
        return True

    async def run(self, waves: list[dict[str, int]], placement: bool) -> Run:
        await self.set_placement(placement)
        run = Run(placement)
        for i, counts in enumerate(waves):
            outcomes, possible, timed_out = await self.wave(counts)
            run.outcomes += outcomes
            run.possible += sum(possible.values())
            hot = collections.Counter(o.model for o in outcomes if o.start == "hot")
            run.hot_of_possible += sum(min(hot[m], n) for m, n in possible.items())
            run.timed_out_waves += timed_out
            self.progress(f"  placement {'on' if placement else 'off'}, wave {i + 1}/{len(waves)}: "
                          f"{sum(counts.values())} requesters, {hot.total()} hot of {sum(possible.values())} "
                          "possible")  # fmt: skip
        return run


def _start(ready: bool, launcher: Obj | None, asleep: set[tuple[str, str]], existing: set[str]) -> Start:
    if not ready or launcher is None:
        return "not ready"
    name = pods.name(launcher)
    if (name, pods.annotations(launcher).get(keys.INSTANCE_ID_ANNOTATION, "")) in asleep:
        return "hot"
    return "warm" if name in existing else "cold"


async def run_shape(
    spec: HitsSpec, shape: Shape, work_dir: Path, progress: Callable[[str], None] = lambda line: None
) -> ShapeResult:
    """One shape: the cluster, the warm-up, and the same waves with placement off, then on."""
    started = time.monotonic()
    scale = ScaleSpec(
        nodes=shape.nodes,
        gpus_per_node=shape.gpus_per_node,
        requesters=0,
        models=spec.models,
        probe_period=1,
        wave_timeout=spec.wave_timeout,
        chart_values=spec.chart_values,
        gpu_mode=shape.gpu_mode,
    )
    rng = random.Random(f"{spec.seed}/{shape.name}")
    async with simulated_fleet(scale, work_dir / shape.name, progress) as (scenario, up_seconds):
        fleet = FleetWaves(scenario, spec, progress)
        await fleet.create_models()
        _, ready_seconds, _ = await scenario.populate()
        progress(f"{shape.name}: cluster up in {up_seconds:.0f} s, {len(scenario.pods.launchers())} launchers "
                 f"Ready in {ready_seconds:.0f} s; warm-up")  # fmt: skip
        models = scenario.models
        for counts in spec.plan(spec.warmup_waves, rng, models, len(models)):
            await fleet.wave(counts)
        result = ShapeResult(shape, up_seconds, ready_seconds, len(sleepers(scenario.pods.launchers())))
        progress(f"{shape.name}: {result.sleepers_after_warmup} sleepers after the warm-up")
        waves = spec.plan(spec.waves, rng, models, spec.models_per_wave)
        for placement in (False, True):
            result.runs.append(await fleet.run(waves, placement))
    result.seconds = time.monotonic() - started
    return result


def hits_line(label: str, results: list[ShapeResult]) -> str:
    """`hits[SHAPE]: hot H of P possible (R%), baseline B of P (Rb%); placement p50 X s, p99 Y s` over `results`
    (the placement-on run's figures first, the placement-off run's as the baseline)."""
    placed = [r.runs[1] for r in results if len(r.runs) == 2]
    baseline = [r.runs[0] for r in results if r.runs]
    h, p = sum(r.hot_of_possible for r in placed), sum(r.possible for r in placed)
    b, pb = sum(r.hot_of_possible for r in baseline), sum(r.possible for r in baseline)
    times = [t for r in placed for t in r.placement_times()]
    return (
        f"{label}: hot {h} of {p} possible ({_percent(h, p)}), baseline {b} of {pb} ({_percent(b, pb)}); "
        f"placement p50 {quantile(times, 0.5):.2f} s, p99 {quantile(times, 0.99):.2f} s"
    )


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "n/a"
