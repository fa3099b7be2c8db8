"""The instances of a simulated launcher: the launcher's own instance manager, with no process behind
an instance.

Real (inherited from `launcher.instances.InstanceManager`): every check of a create (IDs, body sizes,
options through the stand-in's vLLM-compatible parser, the launcher's address and port, ports taken by
other instances, GPU UUIDs through the node's gpu-map), the revisions, boot ID and watch events, sleep and
wake with their errors (NotReady, NotRunning), deletion, listings and metrics. Simulated: instead of a
forked server, an instance becomes ready after its `--startup-delay`, and a sleep or a wake takes its
`--sleep-delay` or `--wake-delay` (the stand-in's flags, in the instance's options; 0 by default). No port
is opened for an instance: nothing sends it inference requests in a simulation. Its log holds one line.
"""

import asyncio
import logging
import shlex
import time
from dataclasses import dataclass

from api.launcher import InstanceState, StartupTimes, VllmConfig, WakeCheck, WakeCheckStatus
from launcher.events import EventLog
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


class _NoProcess(ProcessTreeStats):
    """An instance's process statistics: there is no process to measure."""

    def __init__(self) -> None:
        super().__init__(NO_PROCESS)

    def sample(self, gpu_usage: dict[int, int] | None) -> None:
        return None


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


class _SimulatedStopper(Stopper):
    """Stops an instance with no process at once: it exits with 0."""

    def __init__(self, delays: dict[str, Delays]) -> None:
        super().__init__(grace_seconds=0)
        self._delays = delays

    async def stop(self, instance: Instance) -> None:
        if instance.running:
            instance.ask_to_stop()
            instance.exit_code = 0
            instance.mark_exited()
            instance.move(Phase.STOPPED, exit_code=0)
        self._delays.pop(instance.id, None)

    def signal(self, instance: Instance, signum: int) -> None:
        raise AssertionError(f"simulated instance {instance.id} has no process to signal")


class SimulatedInstances(InstanceManager):
    def __init__(
        self, gpus: GpuInventory, metrics: LauncherMetrics, events: EventLog, settings: ManagerSettings
    ) -> None:
        self._delays: dict[str, Delays] = {}
        super().__init__(
            _runtimes(), gpus, metrics, events, settings,
            servers=_SimulatedServers(settings, self._delays), stopper=_SimulatedStopper(self._delays),
        )  # fmt: skip

    async def create(self, config: VllmConfig, instance_id: str | None = None) -> InstanceState:
        admitted = await self._admit(config, instance_id)
        # No await from the end of `_admit` to the insert: its last checks cannot be raced.
        work_dir = self.settings.state_dir / admitted.instance_id
        startup = StartupTimes(forked_by="simulation")
        instance = self._add(admitted, NO_PROCESS, work_dir, work_dir, time.monotonic(), startup)
        instance.stats = _NoProcess()
        instance.wake_check = WakeCheck(status=WakeCheckStatus.OFF)
        values = admitted.parsed.values
        self._delays[instance.id] = Delays(values.startup_delay, values.sleep_delay, values.wake_delay)
        work_dir.mkdir(parents=True, exist_ok=True)
        instance.log_path.write_text(f"simulated instance {instance.id}: {shlex.join(instance.argv)}\n")
        instance.move(Phase.STARTING)
        self._spawn(self._come_up(instance))
        return instance.state()

    async def _come_up(self, instance: Instance) -> None:
        await asyncio.sleep(self._delays[instance.id].startup)
        if not instance.running:
            return
        self.metrics.ready_seconds.observe(time.monotonic() - instance.created_at)
        instance.move(Phase.AWAKE)
