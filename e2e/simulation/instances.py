"""The instances of a simulated launcher: the launcher's own instance manager, with no process behind
an instance (its forker, `SimulatedForker`, starts none).

Real (`launcher.instances.InstanceManager`): every check of a create (IDs, body sizes,
options through the stand-in's vLLM-compatible parser, the launcher's address and port, ports taken by
other instances, GPU UUIDs through the node's gpu-map), the revisions, boot ID and watch events, sleep and
wake with their errors (NotReady, NotRunning), deletion, listings and metrics. Simulated: instead of a
forked server, an instance becomes ready after its `--startup-delay`, and a sleep or a wake takes its
`--sleep-delay` or `--wake-delay` (the stand-in's flags, in the instance's options; 0 by default). Once
ready, an instance answers vLLM's dev-mode surface on its port of the launcher's address, which FMA's
controller calls directly (`/is_sleeping` until a new instance answers, `/wake_up` for a hot start, `/sleep`
at a release): `_VllmSurfaces`. A sleep or a wake asked there takes its delay and is recorded as the real
server's report to the launcher's monitor would have it recorded (`launcher.monitor.Monitor.reported`; the
wake without its check). No inference route: nothing sends an instance inference requests in a simulation.
Its log holds one line.
"""

import asyncio
import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from api import keys
from api.launcher import EventType, InstanceState, InstanceStatus, ProcessStats, StartupTimes
from e2e.simulation.container import abort_connections
from e2e.simulation.protocol import LedgerEntry
from launcher.admission import Admission
from launcher.events import EventLog
from launcher.forking import Forked, Spawn
from launcher.gpus import GpuInventory
from launcher.instance import Instance
from launcher.instance_server import InstanceServers
from launcher.instances import InstanceManager, ManagerSettings
from launcher.lifecycle import Phase
from launcher.metrics import LauncherMetrics
from launcher.process_stats import ProcessTreeStats
from launcher.runtimes import Runtime, StandInRuntime
from launcher.stopping import Stopper

log = logging.getLogger(__name__)

NO_PROCESS = 0  # an instance's `pid`: there is none, and nothing may signal it
# What every simulated instance holds in host memory, as its process statistics say: sleeper budgets in bytes apply
# in a simulation as on real hardware.
SIMULATED_RSS_BYTES = 1024**3


class _NoProcess(ProcessTreeStats):
    """An instance's process statistics: no process, a fixed resident size (SIMULATED_RSS_BYTES)."""

    def __init__(self) -> None:
        super().__init__(NO_PROCESS)

    def sample(self, gpu_usage: dict[int, int] | None) -> ProcessStats:
        return ProcessStats(pid=NO_PROCESS, processes=0, rss_bytes=SIMULATED_RSS_BYTES, cpu_percent=0.0)


class LedgerLog(EventLog):
    """The launcher's event log, which also keeps a ledger: each event with what the launcher held right after it
    (for the benchmarks, which check budgets and displacements against the launchers' own record)."""

    def __init__(self, history_size: int) -> None:
        super().__init__(history_size)
        self.ledger: list[LedgerEntry] = []
        self.instances: Callable[[], list[InstanceState]] = list

    def publish(self, type_: EventType, state: InstanceState, exit_code: int | None = None) -> None:
        super().publish(type_, state, exit_code)
        held = [s for s in self.instances() if s.status is InstanceStatus.RUNNING]
        asleep = [s for s in held if s.sleeping]
        self.ledger.append(
            LedgerEntry(
                at=time.time(), instance=state.instance_id, event=type_,
                pool=keys.INSTANCE_POOL in (state.annotations or {}), running=len(held), sleeping=len(asleep),
                sleeping_bytes=sum(s.process.rss_bytes for s in asleep if s.process is not None),
            )
        )  # fmt: skip


@dataclass(frozen=True)
class Delays:
    """Seconds an instance takes, from the stand-in's flags in its options."""

    startup: float
    sleep: float
    wake: float


def _runtimes() -> dict[str, Runtime]:
    """As `python -m launcher --stand-in`: the stand-in answers for every runtime."""
    standin = StandInRuntime()
    standin.preload()
    return {"vllm": standin, "transformers": standin}


class _SimulatedServers(InstanceServers):
    """The instances' servers as the simulation plays them: a sleep or a wake takes its delay."""

    def __init__(self, settings: ManagerSettings, delays: dict[str, Delays]) -> None:
        super().__init__(settings.host, settings.backend_timeout_seconds)
        self._delays = delays

    async def call(self, instance: Instance, method: str, path: str) -> None:
        delays = self._delays[instance.id]
        await asyncio.sleep(delays.wake if path.startswith("/wake_up") else delays.sleep)


class _VllmSurfaces:
    """The ready instances' own servers: vLLM's /health, /is_sleeping, POST /sleep and POST /wake_up on each
    instance's port of the launcher's address, from its first ready until it stops."""

    def __init__(self, host: str, delays: dict[str, Delays]) -> None:
        self._host = host
        self._delays = delays
        self._runners: dict[str, web.AppRunner] = {}

    async def open(self, instance: Instance) -> None:
        runner = web.AppRunner(self._app(instance), access_log=None)
        await runner.setup()
        self._runners[instance.id] = runner
        await web.TCPSite(runner, self._host, instance.port).start()

    def _app(self, instance: Instance) -> web.Application:
        delays = self._delays[instance.id]

        async def health(request: web.Request) -> web.Response:
            return web.Response()

        async def is_sleeping(request: web.Request) -> web.Response:
            return web.json_response({"is_sleeping": instance.sleeping})

        async def moved(seconds: float, source: Phase, to: Phase) -> web.Response:
            async with instance.lock:
                await asyncio.sleep(seconds)
                if instance.running and not instance.end.stop_asked and instance.phase is source:
                    instance.move(to)
            return web.Response()

        async def sleep(request: web.Request) -> web.Response:
            return await moved(delays.sleep, Phase.AWAKE, Phase.ASLEEP)

        async def wake_up(request: web.Request) -> web.Response:
            return await moved(delays.wake, Phase.ASLEEP, Phase.AWAKE)

        app = web.Application()
        app.add_routes([web.get("/health", health), web.get("/is_sleeping", is_sleeping),
                        web.post("/sleep", sleep), web.post("/wake_up", wake_up)])  # fmt: skip
        return app

    async def close(self, instance_id: str) -> None:
        """Its server exits: every connection cut, the port free again."""
        runner = self._runners.pop(instance_id, None)
        if runner is not None:
            abort_connections(runner)
            await runner.cleanup()


class _SimulatedStopper(Stopper):
    """Stops an instance with no process at once: it exits with 0."""

    def __init__(self, delays: dict[str, Delays], surfaces: _VllmSurfaces) -> None:
        super().__init__(grace_seconds=0)
        self._delays = delays
        self._surfaces = surfaces

    async def stop(self, instance: Instance) -> None:
        if instance.running:
            instance.end.ask_to_stop()
            instance.exited_with(0)
        await self._surfaces.close(instance.id)
        self._delays.pop(instance.id, None)

    def signal(self, instance: Instance, signum: int) -> None:
        raise AssertionError(f"simulated instance {instance.id} has no process to signal")


class SimulatedForker:
    """Starts no process: an instance becomes ready after its startup delay."""

    def __init__(self, metrics: LauncherMetrics, delays: dict[str, Delays], surfaces: _VllmSurfaces) -> None:
        self.metrics = metrics
        self._delays = delays
        self._surfaces = surfaces

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def fork(self, admitted: Admission, work_dir: Path) -> Forked:
        values = admitted.parsed.values
        self._delays[admitted.instance_id] = Delays(values.startup_delay, values.sleep_delay, values.wake_delay)
        startup = StartupTimes(forked_by="simulation")
        return Forked(NO_PROCESS, work_dir, _NoProcess(), startup, checks_wakes=False)

    def supervise(self, instance: Instance, runtime: Runtime, spawn: Spawn) -> None:
        instance.log_path.write_text(f"simulated instance {instance.id}: {shlex.join(instance.argv)}\n")
        spawn(self._come_up(instance))

    async def _come_up(self, instance: Instance) -> None:
        await asyncio.sleep(self._delays[instance.id].startup)
        if not instance.running:
            return
        await self._surfaces.open(instance)
        if not instance.running:  # stopped while its server came up
            await self._surfaces.close(instance.id)
            return
        self.metrics.ready_seconds.observe(time.monotonic() - instance.created_at)
        instance.move(Phase.AWAKE)


def simulated_instances(
    gpus: GpuInventory, metrics: LauncherMetrics, events: EventLog, settings: ManagerSettings
) -> InstanceManager:
    """The launcher's instance manager over instances with no process."""
    delays: dict[str, Delays] = {}
    surfaces = _VllmSurfaces(settings.host, delays)
    return InstanceManager(
        _runtimes(), gpus, metrics, events, settings, servers=_SimulatedServers(settings, delays),
        stopper=_SimulatedStopper(delays, surfaces), forker=SimulatedForker(metrics, delays, surfaces),
    )  # fmt: skip
