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

from api.launcher import EventType, InstanceState, InstanceStatus, StartupTimes, VllmConfig
from launcher.events import EventLog
from launcher.gpus import GpuInventory
from launcher.instances import Instance, InstanceManager, ManagerSettings
from launcher.metrics import LauncherMetrics
from launcher.process_stats import ProcessTreeStats
from launcher.runtimes import Runtime, StandInRuntime

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


class SimulatedInstances(InstanceManager):
    def __init__(
        self, gpus: GpuInventory, metrics: LauncherMetrics, events: EventLog, settings: ManagerSettings
    ) -> None:
        super().__init__(_runtimes(), gpus, metrics, events, settings)
        self._delays: dict[str, Delays] = {}

    async def create(self, config: VllmConfig, instance_id: str | None = None) -> InstanceState:
        admitted = await self._admit(config, instance_id)
        # No await from the end of `_admit` to the insert: its last checks cannot be raced.
        work_dir = self.settings.state_dir / admitted.instance_id
        instance = Instance(
            id=admitted.instance_id,
            config=admitted.config,
            argv=admitted.argv,
            defaults_applied=admitted.defaults.chosen,
            port=admitted.port,
            pid=NO_PROCESS,
            work_dir=work_dir,
            temp_dir=work_dir,
            created_at=time.monotonic(),
            stats=_NoProcess(),
            runtime_name=self._runtime(admitted.config.runtime).name,
            startup=StartupTimes(forked_by="simulation"),
        )
        self._instances[instance.id] = instance
        values = admitted.parsed.values
        self._delays[instance.id] = Delays(values.startup_delay, values.sleep_delay, values.wake_delay)
        work_dir.mkdir(parents=True, exist_ok=True)
        instance.log_path.write_text(f"simulated instance {instance.id}: {shlex.join(instance.argv)}\n")
        self._publish(instance, EventType.CREATED)
        self._spawn(self._come_up(instance))
        return instance.state()

    async def _come_up(self, instance: Instance) -> None:
        await asyncio.sleep(self._delays[instance.id].startup)
        if not instance.running:
            return
        instance.ready = True
        self.metrics.ready_seconds.observe(time.monotonic() - instance.created_at)
        self._publish(instance, EventType.READY)

    async def _call_backend(self, instance: Instance, method: str, path: str) -> None:
        """A sleep or a wake, as the instance's server would take it."""
        delays = self._delays[instance.id]
        await asyncio.sleep(delays.wake if path.startswith("/wake_up") else delays.sleep)

    async def _refresh_sleep_state(self, instance: Instance) -> None:
        """Nobody can reach a simulated instance but through the launcher: its state is always current."""

    async def _stop(self, instance: Instance) -> None:
        if instance.running:
            instance.stop_asked.set()
            instance.status, instance.exit_code, instance.ready = InstanceStatus.STOPPED, 0, False
            instance.exited.set()
        self._delays.pop(instance.id, None)

    @staticmethod
    def _signal(instance: Instance, signum: int) -> None:
        raise AssertionError(f"simulated instance {instance.id} has no process to signal")
