"""The scale scenario (issue 15), for `bench/scale.py` and its small e2e run: R requesters on N simulated
GPU Nodes, one launcher per GPU, with the real controllers installed by the Helm chart, or FMA's released
ones (issue 46: `ScaleSpec.controllers`).

A loopback cluster of simulated Nodes (`e2e/simulation`: the requesters' SPI and probes and the launchers'
API served by one process per role, TokenReviews and all) gets the chart (its defaults), a LauncherConfig,
a LauncherPopulationPolicy with one launcher per GPU, M InferenceServerConfigs and, for each, a
ReplicaSet of requesters asking for one GPU each. Measured, from outside, as a user would see it:

- the populator: LauncherPopulationPolicy created -> every launcher Pod created, and Ready;
- wave 1: the ReplicaSets created -> every requester told ready over its SPI (the simulation records
  the moment become-ready arrived); per requester, its Pod's creation (as this harness's watch saw it)
  -> told ready;
- the swap wave: half the models scaled to 0, the others up to take their GPUs -> the old requesters
  gone and every new one told ready, with the same per-requester figures;
- after each wave: requesters left unbound or bound twice (the launchers' `requester` annotations), GPUs
  with two awake instances (the simulated launchers' own state);
- per phase: CPU seconds of every process (the controllers, kube-apiserver, etcd, the cluster's own
  controllers, the kubelet, the simulations), the API server's own `apiserver_request_total` by verb
  and by resource, and each controller's own count of its API requests (its /metrics); at the end the
  controllers' RSS (now and peak) and their work-queue histograms.

FMA's controllers (v0.6.5-alpha.1, `e2e/fma_controllers.py`: its binaries with its chart's flags and RBAC, in
the namespace set up as FMA's e2e sets it up) drive the same simulated launchers and requesters: our launcher
with no token (FMA's controllers send none), its notifier sidecar run by the launcher simulation
(`e2e/simulation/notifier.py`), the requesters' SPI open (`REQUESTER_SPI_AUTH=none`). Their API requests are
client-go's `rest_client_requests_total`, ours `dualpods_kube_api_requests_total`.
"""

import asyncio
import collections
import contextlib
import functools
import itertools
import json
import re
import signal
import ssl
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn, Protocol

import aiohttp
import psutil
from kubernetes_asyncio import client
from prometheus_client.parser import text_string_to_metric_families

from api import keys
from controller import pods
from e2e.chart import DUAL_PODS, POPULATOR
from e2e.cluster.cluster import APISERVER, LoopbackCluster, default_nodes
from e2e.dra import DRA_NODES, allow_admin_access, create_claim_template
from e2e.dualpods_env import DualPodsEnv, Obj
from e2e.fixtures import fresh_namespace
from e2e.fma_controllers import OPEN_SPI, fma_running
from e2e.kubelet.config import GpuMode
from e2e.profiles import Profile, Summary
from e2e.simulation.protocol import Report, Role
from kube.gc_thresholds import tune_for_caches
from kube.informer import LAST_APPLIED, Informer

LAUNCHER_CONFIG = "scale"
# On DRA Nodes: a launcher sees every GPU of its Node through an admin-access claim, a requester gets one GPU.
ALL_GPUS_TEMPLATE = "all-gpus"
ONE_GPU_TEMPLATE = "one-gpu"
FIRST_PORT = 8005
REPORT_EVERY_S = 1.0
REPORT_OVERLAP_S = 1.0  # each look asks for the changes since a second before the last one was asked
PROGRESS_EVERY_S = 60.0  # a long run says how far each wave has come this often
CONTROLLERS = (DUAL_PODS, POPULATOR)
ControllerSet = Literal["ours", "fma"]  # the chart's controllers, or FMA's released ones


class Controllers(Protocol):
    """A running controller set: `InstalledControllers` (the chart's) or `FmaControllers`."""

    def running(self) -> dict[str, psutil.Process]: ...

    async def metrics(self, component: str) -> str: ...


@dataclass(frozen=True)
class ScaleSpec:
    nodes: int
    gpus_per_node: int
    requesters: int
    models: int = 4
    # The simulated instances' times (the stand-in's flags in the ISCs' options).
    startup_delay: float = 1.0
    sleep_delay: float = 0.1
    wake_delay: float = 0.2
    probe_period: int = 5  # of the requesters' readiness probes
    wave_timeout: float = 600.0
    chart_values: tuple[str, ...] = ()  # `helm --set` values, e.g. dualPodsController.workers=16
    idle_seconds: float = 20.0  # at rest before the waves: two Lease renewals and a few probes of every Pod
    gpu_mode: GpuMode = "device-plugin"  # "dra": the Nodes' GPUs come through ResourceClaims (NVIDIA's DRA driver)
    warm_pool: Obj | None = None  # the `spec.warmPool` every model declares (bench/pools.py)
    sleeper_budget: Obj | None = None  # the LauncherConfig's `spec.sleeperBudget`
    max_instances: int = 2  # the LauncherConfig's
    controllers: ControllerSet = "ours"

    def __post_init__(self) -> None:
        if self.controllers == "fma" and self.chart_values:
            raise ValueError("chart values are ours; FMA's controllers run with its chart's flags")
        if self.requesters > self.nodes * self.gpus_per_node:
            raise ValueError(f"{self.requesters} requesters need that many GPUs; the nodes have "
                             f"{self.nodes * self.gpus_per_node}")  # fmt: skip
        if self.models < 2:
            raise ValueError("the swap wave needs at least 2 models")
        if self.requesters < 0:
            raise ValueError("the number of requesters cannot be negative")

    def replicas(self, models: list[int]) -> dict[int, int]:
        """The requesters spread evenly over `models` (the first ones take the remainder)."""
        share, extra = divmod(self.requesters, len(models))
        return {m: share + (1 if i < extra else 0) for i, m in enumerate(models)}


@dataclass
class Phase:
    """What one phase cost: its wall time, every process's CPU seconds, the API server's requests."""

    seconds: float
    cpu: dict[str, float]
    requests_by_verb: dict[str, int]
    requests_by_call: dict[str, int]  # "VERB resource[/subresource]" -> count
    refusals_by_call: dict[str, int]  # "VERB resource[/subresource] CODE" -> count, for codes of 400 and up
    # Each controller's API requests in the phase, as it counts them (its /metrics).
    controller_requests: dict[str, int] = field(default_factory=dict)

    def controllers_cpu(self) -> float:
        """The controllers' CPU seconds in the phase."""
        return sum(self.cpu.get(c, 0.0) for c in CONTROLLERS)

    def controllers_share(self) -> float:
        """The controllers' CPU seconds over the API server's: a figure that does not depend on the machine."""
        return self.controllers_cpu() / max(self.cpu.get(APISERVER, 0.0), 1e-9)


@dataclass
class Wave:
    name: str
    seconds: float  # the wave's start -> its last requester told ready (and the old ones gone)
    latencies: list[float]  # per new requester: its Pod created -> told ready
    phase: Phase
    # Per new requester, seconds from one milestone to the next (MILESTONES, then told ready): p50, p99.
    steps: dict[str, tuple[float, float]] = field(default_factory=dict)
    unbound: int = 0
    double_bound: int = 0
    shared_gpus: int = 0  # GPUs with more than one awake instance
    not_ready: int = 0
    timed_out: bool = False
    # The errors in the status annotations of the requesters not told ready, with how many carry each.
    problems: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.timed_out or self.unbound or self.double_bound or self.shared_gpus or self.not_ready)


@dataclass
class ProcessFigures:
    rss_mib: float
    peak_rss_mib: float
    cpu_seconds: float  # over the whole measurement


@dataclass(frozen=True)
class Quantiles:
    """Of a Prometheus histogram: p50 and p99 as bucket upper bounds, and the count."""

    p50: float
    p99: float
    count: int

    @classmethod
    def of(cls, buckets: dict[float, float]) -> "Quantiles | None":
        total = buckets.get(float("inf"), 0)
        if not total:
            return None

        def bound(q: float) -> float:
            return next(le for le in sorted(buckets) if buckets[le] >= q * total)

        return cls(bound(0.5), bound(0.99), int(total))


@dataclass
class ControllerMetrics:
    own: Quantiles | None  # dualpods_reconcile_own_seconds: a pass less its calls
    work: Quantiles | None  # fma_dpc_innerqueue_work_duration_seconds: a pass, calls included (dual-pods)
    queued: Quantiles | None  # fma_dpc_innerqueue_queue_duration_seconds: added -> taken by a worker
    api_requests: dict[str, int]  # dualpods_kube_api_requests_total (FMA's: rest_client_requests_total) by method
    throttled_seconds: float  # the sum of dualpods_kube_api_rate_limit_wait_seconds
    # fma_http_latency_seconds by purpose: the controller's calls to launchers and requesters.
    calls: dict[str, Quantiles] = field(default_factory=dict)
    # fma_dpc_innerqueue_adds and _retries: work items added, and retried after a failed pass (dual-pods).
    queue_adds: int = 0
    queue_retries: int = 0

    @classmethod
    def parse(cls, text: str) -> "ControllerMetrics":
        buckets: dict[str, dict[float, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
        requests: collections.Counter[str] = collections.Counter()
        throttled = 0.0
        counts: collections.Counter[str] = collections.Counter()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "fma_http_latency_seconds_bucket":
                    buckets[f"call {sample.labels['purpose']}"][float(sample.labels["le"])] += sample.value
                elif sample.name == "dualpods_kube_api_request_seconds_bucket":
                    buckets[f"call API {sample.labels['method']}"][float(sample.labels["le"])] += sample.value
                elif sample.name.endswith("_bucket"):
                    buckets[sample.name.removesuffix("_bucket")][float(sample.labels["le"])] += sample.value
                elif sample.name in ("dualpods_kube_api_requests_total", "rest_client_requests_total"):
                    requests[sample.labels["method"]] += int(sample.value)
                elif sample.name == "dualpods_kube_api_rate_limit_wait_seconds_sum":
                    throttled += sample.value
                elif sample.name in ("fma_dpc_innerqueue_adds_total", "fma_dpc_innerqueue_retries_total"):
                    counts[sample.name] += int(sample.value)
        return cls(
            own=Quantiles.of(buckets["dualpods_reconcile_own_seconds"]),
            work=Quantiles.of(buckets["fma_dpc_innerqueue_work_duration_seconds"]),
            queued=Quantiles.of(buckets["fma_dpc_innerqueue_queue_duration_seconds"]),
            api_requests=dict(requests.most_common()),
            throttled_seconds=throttled,
            calls={
                name.removeprefix("call "): quantiles
                for name, found in sorted(buckets.items())
                if name.startswith("call ") and (quantiles := Quantiles.of(found)) is not None
            },
            queue_adds=counts["fma_dpc_innerqueue_adds_total"],
            queue_retries=counts["fma_dpc_innerqueue_retries_total"],
        )


@dataclass
class ScaleResult:
    spec: ScaleSpec
    cluster_up_seconds: float
    launchers_created_seconds: float
    launchers_ready_seconds: float
    populator_phase: Phase
    waves: list[Wave] = field(default_factory=list)
    controllers: dict[str, ProcessFigures] = field(default_factory=dict)
    # From the controllers' own /metrics at the end.
    controller_metrics: dict[str, "ControllerMetrics"] = field(default_factory=dict)
    # Each controller container's restarts: how it last ended, and the Warning Events about its Pod.
    restarts: dict[str, list[str]] = field(default_factory=dict)
    # py-spy profiles, when asked for: the populator's while it populates, the dual-pods controller's
    # during both waves.
    profiles: dict[str, Summary] = field(default_factory=dict)

    # The cluster at rest with every launcher up (no requesters yet): what its heartbeats and probes cost.
    idle_phase: Phase | None = None
    # Mean JSON size of a Pod as the API server sends it (what an informer caches), and the part of it
    # that is managedFields and the last-applied annotation, by kind of Pod, at the end.
    pod_bytes: dict[str, tuple[float, float]] = field(default_factory=dict)
    # Open file descriptors and RSS (MiB) of every process at the end: the machine's limits at this size.
    descriptors: dict[str, int] = field(default_factory=dict)
    rss_mib: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(w.ok for w in self.waves) and len(self.waves) == (2 if self.spec.requesters else 0)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


# The steps of a requester's start, in order, as this harness's watch sees them (then "told ready", from
# the simulation): the Pod created, scheduled, given its address (its container starting), its GPUs
# recorded by the controller, and bound to a launcher.
MILESTONES: dict[str, Any] = {
    "created": lambda pod: True,
    "scheduled": lambda pod: pods.node_name(pod) is not None,
    "addressed": lambda pod: pods.pod_ip(pod) is not None,
    "gpus recorded": lambda pod: keys.ACCELERATORS_ANNOTATION in pods.annotations(pod),
    "bound": lambda pod: keys.DUAL_LABEL in pods.labels(pod),
}
TOLD_READY = "told ready"
STEPS = list(itertools.pairwise([*MILESTONES, TOLD_READY]))


class PodTimes:
    """One watch on the namespace's Pods: when each first reached each milestone (its creation to within
    the watch's delay), and the Pods themselves for the invariants."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.informer = Informer("pods", functools.partial(core.list_namespaced_pod, namespace))
        self.milestones: dict[str, dict[str, float]] = {}
        self.informer.subscribe(self._seen)
        self._task: asyncio.Task[None] | None = None

    def _seen(self, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            return
        reached = self.milestones.setdefault(pods.uid(new), {})
        now = time.time()
        for milestone, check in MILESTONES.items():
            if milestone not in reached and check(new):
                reached[milestone] = now

    def created(self, uid: str) -> float | None:
        return self.milestones.get(uid, {}).get("created")

    async def start(self) -> None:
        self._task = asyncio.create_task(self.informer.run())
        await self.informer.synced.wait()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def pods(self) -> list[Obj]:
        return self.informer.items()

    def launchers(self) -> list[Obj]:
        return [p for p in self.pods() if pods.is_launcher(p) and not pods.is_deleting(p)]

    def requesters(self, model: str | None = None) -> list[Obj]:
        found = [p for p in self.pods() if pods.is_requester(p)]
        if model is None:
            return found
        return [p for p in found if pods.annotations(p).get(keys.INFERENCE_SERVER_CONFIG_ANNOTATION) == model]


class Processes:
    """The processes whose CPU a phase is charged with, found by what they run."""

    def __init__(self, cluster: LoopbackCluster, controllers: Controllers) -> None:
        self._cluster = cluster
        self._controllers = controllers

    def find(self) -> dict[str, psutil.Process]:
        found = {name: psutil.Process(pid) for name, pid in self._cluster.pids().items()}
        for process in found["kubelet"].children(recursive=True):
            with contextlib.suppress(psutil.Error):
                line = process.cmdline()
                if "e2e.simulation" in line:
                    found[Path(line[line.index("--url-file") + 1]).stem] = process  # its `process_name`
        return found | self._controllers.running()

    def cpu(self) -> dict[str, float]:
        times = {}
        for name, process in self.find().items():
            with contextlib.suppress(psutil.Error):
                used = process.cpu_times()
                times[name] = used.user + used.system
        return times


@dataclass
class ApiRequests:
    """The API server's own count of the requests it served (`apiserver_request_total`), by verb, by call (the
    verb and the resource[/subresource]: "PATCH pods/status"), and the refused ones by call and code."""

    by_verb: collections.Counter[str]
    by_call: collections.Counter[str]
    refusals: collections.Counter[str]


async def api_requests(cluster: LoopbackCluster) -> ApiRequests:
    state = cluster.state_dir
    tls = ssl.create_default_context(cafile=str(state / "pki" / "ca.crt"))
    tls.load_cert_chain(state / "pki" / "admin.crt", state / "pki" / "admin.key")
    async with aiohttp.ClientSession() as session, session.get(f"{cluster.state().apiserver_url}/metrics",
                                                               ssl=tls) as answer:  # fmt: skip
        text = await answer.text()
    counted = ApiRequests(collections.Counter(), collections.Counter(), collections.Counter())
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            labels = sample.labels
            verb, count = labels.get("verb", ""), int(sample.value)
            resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            counted.by_verb[verb] += count
            counted.by_call[f"{verb} {resource}"] += count
            if labels.get("code", "").isdigit() and int(labels["code"]) >= 400:
                counted.refusals[f"{verb} {resource} {labels['code']}"] += count
    return counted


class Meter:
    """Charges a phase with the CPU and API requests spent between `start` and `stop`."""

    def __init__(self, cluster: LoopbackCluster, processes: Processes, controllers: Controllers) -> None:
        self._cluster = cluster
        self._processes = processes
        self._controllers = controllers

    async def _controller_requests(self) -> dict[str, int]:
        """Each controller's API requests so far; one that cannot be scraped now (restarting) is left out."""
        counted = {}
        for component in CONTROLLERS:
            with contextlib.suppress(aiohttp.ClientError, IndexError):
                metrics = ControllerMetrics.parse(await self._controllers.metrics(component))
                counted[component] = sum(metrics.api_requests.values())
        return counted

    async def start(self) -> None:
        self._started = time.monotonic()
        self._cpu = self._processes.cpu()
        self._requests = await api_requests(self._cluster)
        self._by_controller = await self._controller_requests()

    async def stop(self) -> Phase:
        seconds = time.monotonic() - self._started
        cpu = self._processes.cpu()
        now, before = await api_requests(self._cluster), self._requests
        by_controller, before_by = await self._controller_requests(), self._by_controller
        return Phase(
            seconds=seconds,
            cpu={name: round(used - self._cpu.get(name, 0.0), 2) for name, used in cpu.items()},
            requests_by_verb=dict((now.by_verb - before.by_verb).most_common()),
            requests_by_call=dict((now.by_call - before.by_call).most_common()),
            refusals_by_call=dict((now.refusals - before.refusals).most_common()),
            controller_requests={c: n - before_by[c] for c, n in by_controller.items() if c in before_by},
        )


class Scenario:
    def __init__(
        self,
        spec: ScaleSpec,
        cluster: LoopbackCluster,
        env: DualPodsEnv,
        controllers: Controllers,
        session: aiohttp.ClientSession,
        progress: Callable[[str], None],
    ):
        self.spec = spec
        self.progress = progress
        self.cluster = cluster
        self.env = env
        self.controllers = controllers
        self.session = session
        self.pods = PodTimes(env.core, env.namespace)
        self.processes = Processes(cluster, controllers)
        self.meter = Meter(cluster, self.processes, controllers)
        self.models = [f"model-{i}" for i in range(spec.models)]

    async def populate(self) -> tuple[float, float, Phase]:
        """The LauncherConfig and the policy; seconds until every launcher exists, and until all are Ready."""
        spec, env = self.spec, self.env
        dra = spec.gpu_mode == "dra"
        if dra:
            await allow_admin_access(env.api, env.namespace)
            await create_claim_template(env.api, env.namespace, ALL_GPUS_TEMPLATE, None)
            await create_claim_template(env.api, env.namespace, ONE_GPU_TEMPLATE, 1)
        # Under FMA's controllers, a template as FMA's e2e writes it (no securityContext): the notifier sidecar they
        # add has none either.
        await env.create_launcher_config(
            LAUNCHER_CONFIG, max_instances=spec.max_instances, launcher_args=[],
            claim_template=ALL_GPUS_TEMPLATE if dra else None, sleeper_budget=spec.sleeper_budget,
            restricted=spec.controllers == "ours",
        )  # fmt: skip
        await self.meter.start()
        started = time.monotonic()
        await env.create_population_policy(
            "one-per-gpu", LAUNCHER_CONFIG, count=spec.gpus_per_node, selector=DRA_NODES if dra else None
        )
        wanted = spec.nodes * spec.gpus_per_node
        created = await self._until(lambda: len(self.pods.launchers()) >= wanted, started, "every launcher created")
        ready = await self._until(
            lambda: sum(pods.is_ready(p) for p in self.pods.launchers()) >= wanted, started, "every launcher Ready"
        )
        return created, ready, await self.meter.stop()

    async def idle(self) -> Phase:
        await self.meter.start()
        await asyncio.sleep(self.spec.idle_seconds)
        return await self.meter.stop()

    async def _until(self, check: Any, started: float, what: str, interval: float = 0.2) -> float:
        while not check():
            if time.monotonic() - started > self.spec.wave_timeout:
                raise TimeoutError(f"not {what} within {self.spec.wave_timeout:.0f} s")
            await asyncio.sleep(interval)
        return time.monotonic() - started

    async def create_models(self) -> None:
        spec = self.spec
        for i, model in enumerate(self.models):
            options = (f"--model {model} --startup-delay {spec.startup_delay:g} --sleep-delay {spec.sleep_delay:g} "
                       f"--wake-delay {spec.wake_delay:g}")  # fmt: skip
            await self.env.create_isc(model, LAUNCHER_CONFIG, port=FIRST_PORT + i, options=options,
                                      warm_pool=spec.warm_pool)  # fmt: skip

    async def create_requesters(self, model: str, count: int) -> None:
        """The ReplicaSet of `model`'s requesters (named after it), one GPU each."""
        template = ONE_GPU_TEMPLATE if self.spec.gpu_mode == "dra" else None
        await self.env.create_requesters(
            model, model, count, probe_period=self.spec.probe_period, claim_template=template
        )

    async def first_wave(self) -> Wave:
        await self.meter.start()
        started = time.time()
        for i, count in self.spec.replicas(list(range(len(self.models)))).items():
            await self.create_requesters(self.models[i], count)
        return await self._wave("first", started, set(self.models), set())

    async def swap_wave(self) -> Wave:
        half = len(self.models) // 2
        down, up = self.models[:half], self.models[half:]
        await self.meter.start()
        started = time.time()
        for model in down:
            await self.env.scale(model, 0)
        for i, count in self.spec.replicas(list(range(len(up)))).items():
            await self.env.scale(up[i], count)
        return await self._wave("swap", started, set(up), set(down))

    async def _wave(self, name: str, started: float, up: set[str], down: set[str]) -> Wave:
        """Until every requester of the `up` models is told ready and those of the `down` ones are gone.
        Requesters that were there before the wave began must stay ready; the figures are the new ones'."""
        ready_at: dict[str, float] = {}
        readiness: dict[str, tuple[bool, float]] = {}  # uid -> (ready, when it was last set), as the simulations say
        since: float | None = None  # the first look reads every requester, each later one those changed since
        old_gone = started
        timed_out = False
        said = started
        while True:
            asked = time.time()
            for r in (await self.report("requester", changed_since=since)).requesters:
                if r.transitions:
                    readiness[r.uid] = (r.ready, r.transitions[-1][0])
            since = asked - REPORT_OVERLAP_S
            current = {pods.uid(p) for m in up for p in self.pods.requesters(m) if not pods.is_deleting(p)}
            ready_at = {uid: at for uid, (ready, at) in readiness.items() if ready and uid in current}
            if [p for m in down for p in self.pods.requesters(m)]:
                old_gone = time.time()
            elif len(current) >= self.spec.requesters and len(ready_at) >= self.spec.requesters:
                break
            if time.time() - started > self.spec.wave_timeout:
                timed_out = True
                break
            if time.time() - said >= PROGRESS_EVERY_S:
                said = time.time()
                told = f"{len(ready_at)} of {len(current)} told ready after {said - started:.0f} s"
                self.progress(f"{name} wave: {told}; {self._controller_rss()}")
            await asyncio.sleep(REPORT_EVERY_S)
        new = {uid: at for uid, at in ready_at.items() if (self.pods.created(uid) or 0.0) >= started}
        finished = max([old_gone, *new.values()])
        latencies = [at - (self.pods.created(uid) or started) for uid, at in new.items()]
        wave = Wave(name, finished - started, latencies, await self.meter.stop(), timed_out=timed_out)
        wave.steps = self._steps(new)
        wave.not_ready = max(0, self.spec.requesters - len(ready_at))
        waiting = [p for m in up for p in self.pods.requesters(m) if pods.uid(p) not in ready_at]
        wave.problems = dict(collections.Counter(_problem(p) for p in waiting).most_common(5))
        await self._check(wave)
        self.progress(f"{name} wave over after {wave.seconds:.0f} s: {len(latencies)} told ready, not ready "
                      f"{wave.not_ready}, unbound {wave.unbound}, double-bound {wave.double_bound}, GPUs shared "
                      f"{wave.shared_gpus}; {self._controller_rss()}")  # fmt: skip
        return wave

    def _controller_rss(self) -> str:
        _, rss = self.footprint()
        return ", ".join(f"{name} RSS {rss[name]:.0f} MiB" for name in CONTROLLERS if name in rss)

    async def report(self, role: Role, changed_since: float | None = None) -> Report:
        """What the simulated containers of `role` hold now, from every simulation process of the role (with
        `changed_since`, only the requesters whose readiness changed since)."""
        simulations = self.cluster.simulations(role, self.session)
        reports = await asyncio.gather(*(c.report(changed_since) for c in simulations))
        return Report(
            role=role,
            requesters=[r for report in reports for r in report.requesters],
            launchers=[launcher for report in reports for launcher in report.launchers],
        )

    def _steps(self, told_ready: dict[str, float]) -> dict[str, tuple[float, float]]:
        gaps: dict[str, list[float]] = {f"{a} -> {b}": [] for a, b in STEPS}
        for uid, at in told_ready.items():
            reached = {**self.pods.milestones.get(uid, {}), TOLD_READY: at}
            for a, b in STEPS:
                if a in reached and b in reached:
                    gaps[f"{a} -> {b}"].append(reached[b] - reached[a])
        return {step: (quantile(values, 0.5), quantile(values, 0.99)) for step, values in gaps.items() if values}

    async def _check(self, wave: Wave) -> None:
        """Every live requester bound to exactly one launcher, and no GPU with two awake instances."""
        bound = collections.Counter(b.requester_uid for p in self.pods.launchers() if (b := pods.binding(p)))
        live = [pods.uid(p) for p in self.pods.requesters() if not pods.is_deleting(p)]
        wave.unbound = sum(1 for uid in live if bound[uid] == 0)
        wave.double_bound = sum(1 for uid in live if bound[uid] > 1)
        report = await self.report("launcher")
        nodes = {pods.uid(p): pods.node_name(p) for p in self.pods.launchers()}
        awake = collections.Counter(
            (nodes.get(launcher.uid), gpu)
            for launcher in report.launchers
            for instance in launcher.instances
            if instance.status == "running" and not instance.sleeping
            for gpu in instance.gpu_uuids or []
        )
        wave.shared_gpus = sum(1 for count in awake.values() if count > 1)

    def footprint(self) -> tuple[dict[str, int], dict[str, float]]:
        descriptors, rss = {}, {}
        for name, process in self.processes.find().items():
            with contextlib.suppress(psutil.Error):
                descriptors[name] = process.num_fds()
                rss[name] = round(process.memory_info().rss / 2**20, 1)
        return descriptors, rss

    def pod_bytes(self) -> dict[str, tuple[float, float]]:
        sizes: dict[str, list[tuple[int, int]]] = {"launcher": [], "requester": []}
        for pod in self.pods.pods():
            kind = "launcher" if pods.is_launcher(pod) else "requester" if pods.is_requester(pod) else None
            if kind is None:
                continue
            meta = pods.meta(pod)
            extra = {"managedFields": meta.get("managedFields"), "annotations": {
                LAST_APPLIED: pods.annotations(pod).get(LAST_APPLIED)}}  # fmt: skip
            sizes[kind].append((len(json.dumps(pod)), len(json.dumps(extra))))
        return {
            kind: (statistics.mean(s for s, _ in found), statistics.mean(e for _, e in found))
            for kind, found in sizes.items()
            if found
        }

    async def controller_figures(self) -> dict[str, ProcessFigures]:
        figures = {}
        for component, process in self.controllers.running().items():
            with contextlib.suppress(psutil.Error):
                used = process.cpu_times()
                figures[component] = ProcessFigures(
                    rss_mib=process.memory_info().rss / 2**20,
                    peak_rss_mib=_peak_rss(process.pid) / 2**20,
                    cpu_seconds=used.user + used.system,
                )
        return figures

    async def restarts(self, logs_to: Path | None) -> dict[str, list[str]]:
        """For each controller that restarted: its restart count, how its last run ended and the Warning Events
        about its Pod; with `logs_to`, the logs of its ended run and of the current one are kept there."""
        found: dict[str, list[str]] = {}
        events = await self.env.core.list_namespaced_event(self.env.namespace)
        for component in CONTROLLERS:
            for pod in await self.env.controllers.pods(component):
                status = next(iter(pod.status.container_statuses or []), None)
                if status is None or not status.restart_count:
                    continue
                ended = status.last_state.terminated if status.last_state else None
                how = f"exit {ended.exit_code} ({ended.reason}) at {ended.finished_at}" if ended else "unknown"
                warnings = collections.Counter(
                    f"{e.reason}: {e.message}"[:160]
                    for e in events.items
                    if e.involved_object.uid == pod.metadata.uid and e.type == "Warning"
                )
                found[component] = [f"{status.restart_count} restarts, the last run ended with {how}"] + [
                    f"{count} x {what}" for what, count in warnings.most_common(5)
                ]
                if logs_to is not None:
                    _keep_logs(self.cluster, pod, component, logs_to)
        return found

    async def keep_logs(self, logs_to: Path) -> None:
        """The controllers' current logs (their retries and why), kept next to the profiles."""
        for component in CONTROLLERS:
            for pod in await self.env.controllers.pods(component):
                _write_log(logs_to / f"{component}.log", self.cluster.container_log(pod, "controller"))

    async def controller_metrics(self) -> dict[str, ControllerMetrics]:
        return {component: ControllerMetrics.parse(await self.controllers.metrics(component))
                for component in CONTROLLERS}  # fmt: skip


def _problem(requester: Obj) -> str:
    """What the controller says is wrong with a requester (its status annotation), addresses left out."""
    errors = (pods.json_annotation(requester, keys.STATUS_ANNOTATION) or {}).get("Errors") or ["no error reported"]
    return re.sub(r"127(\.\d+){3}", "<pod IP>", str(errors[0]))[:200]


def _keep_logs(cluster: LoopbackCluster, pod: client.V1Pod, component: str, logs_to: Path) -> None:
    for previous in (True, False):
        text = cluster.container_log(pod, "controller", previous=previous)
        _write_log(logs_to / f"{component}{'-previous' if previous else ''}.log", text)


def _write_log(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _peak_rss(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return float(line.split()[1]) * 1024
    return 0.0


# Profiled during the waves (with `profile_dir`): the dual-pods controller, and what the simulation costs.
PROFILED_IN_WAVES = (DUAL_PODS, "kubelet", "simulation-requester", "simulation-launcher")


async def _profiles(
    profile_dir: Path | None, processes: dict[str, psutil.Process], names: tuple[str, ...]
) -> dict[str, Profile]:
    started: dict[str, Profile] = {}
    if profile_dir is None:
        return started
    for name in names:
        if (process := processes.get(name)) is not None:
            started[name] = Profile(process.pid, profile_dir / f"{name}.txt")
            await started[name].start()
    return started


async def _summaries(profiles: dict[str, Profile], result: ScaleResult) -> None:
    for name, profile in profiles.items():
        if (summary := await profile.stop()) is not None:
            result.profiles[name] = summary


@contextlib.asynccontextmanager
async def simulated_fleet(
    spec: ScaleSpec, work_dir: Path, progress: Callable[[str], None] = lambda line: None
) -> AsyncIterator[tuple[Scenario, float]]:
    """A loopback cluster of `spec`'s simulated Nodes with `spec`'s controllers installed and the harness's Pod
    watch started: the scenario, and the seconds the cluster took to come up. Everything is taken down on the
    way out (also on failure)."""
    cluster = LoopbackCluster(work_dir / "cluster")
    started = time.monotonic()
    try:
        nodes = default_nodes(spec.nodes, spec.gpus_per_node, spec.gpu_mode)
        await cluster.up(nodes, die_with_parent=True, simulated=True)
        up_seconds = time.monotonic() - started
        async with (
            await cluster.api_client() as api,
            fresh_namespace(api, "scale") as namespace,
            aiohttp.ClientSession() as session,
            _installed(spec, cluster, api, namespace, work_dir) as (env, controllers),
        ):
            scenario = Scenario(spec, cluster, env, controllers, session, progress)
            await scenario.pods.start()
            try:
                yield scenario, up_seconds
            finally:
                await scenario.pods.stop()
    finally:
        with _uninterruptible():
            cluster.down()


@contextlib.asynccontextmanager
async def _installed(
    spec: ScaleSpec, cluster: LoopbackCluster, api: client.ApiClient, namespace: str, work_dir: Path
) -> AsyncIterator[tuple[DualPodsEnv, Controllers]]:
    """The namespace set up for `spec`'s controllers, and them running: the chart's with `spec.chart_values`, or
    FMA's as FMA's e2e sets them up, with the requesters' SPI open (FMA's controller sends no token). Nothing is
    torn down but FMA's processes: the cluster goes down next."""
    if spec.controllers == "fma":
        async with fma_running(cluster, api, namespace, work_dir, OPEN_SPI) as (env, fma):
            yield env, fma
        return
    env = DualPodsEnv(cluster, api, namespace, work_dir)
    await env.setup()
    await env.controllers.install(*spec.chart_values)
    yield env, env.controllers


async def run_scale(
    spec: ScaleSpec,
    work_dir: Path,
    profile_dir: Path | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> ScaleResult:
    """Bring up the cluster, measure, and take everything down again (also on failure). With
    `profile_dir`, the controllers are sampled with py-spy and their raw profiles kept there; `progress`
    hears each minute of a wave and each wave's outcome, which a run stopped later keeps."""
    async with simulated_fleet(spec, work_dir, progress) as (scenario, up_seconds):
        await scenario.create_models()
        profiles = await _profiles(profile_dir, scenario.processes.find(), (POPULATOR,))
        created, ready, phase = await scenario.populate()
        result = ScaleResult(spec, up_seconds, created, ready, phase)
        await _summaries(profiles, result)
        result.idle_phase = await scenario.idle()
        result.descriptors, result.rss_mib = scenario.footprint()
        if spec.requesters:
            profiles = await _profiles(profile_dir, scenario.processes.find(), PROFILED_IN_WAVES)
            result.waves.append(await scenario.first_wave())
            result.waves.append(await scenario.swap_wave())
            await _summaries(profiles, result)
        result.controllers = await scenario.controller_figures()
        result.pod_bytes = scenario.pod_bytes()
        result.descriptors, result.rss_mib = scenario.footprint()
        result.controller_metrics = await scenario.controller_metrics()
        result.restarts = await scenario.restarts(profile_dir)
        if profile_dir is not None:
            await scenario.keep_logs(profile_dir)
        return result


def bench_main(main: Callable[[], Coroutine[Any, Any, int]], name: str) -> NoReturn:
    """Run a fleet benchmark's `main` and exit with its status; Ctrl-C exits 130, once the cluster is down."""
    tune_for_caches()  # the observer's own cache of Pods, kept from taking the cores from what it measures
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:
        print(f"{name}: interrupted; the cluster was taken down", file=sys.stderr)
        sys.exit(130)


def progress_line(line: str) -> None:
    """A long benchmark's progress, on stderr as it comes (its report goes to stdout at the end)."""
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _uninterruptible() -> Iterator[None]:
    """Ctrl-C is ignored while the cluster goes down (10-20 s with 2,000 Pods): a second one used to cut
    the teardown short, leaving its state directory behind (its processes die with this one)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
