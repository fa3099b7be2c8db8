"""One instance the launcher forked: what it was asked, where it runs, and its phase (`lifecycle`).

Its phase changes only through `move`, which the transition table allows and which publishes the
watch event of the move; its end (a stop asked, its server's exit) is one object's (`InstanceEnd`); what
else it holds is data about it (its exit code, why it stopped, its post-wake check), not state of its life
cycle.
"""

import asyncio
import logging
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Never, TypeVar

from api.launcher import (
    EventType,
    InstanceState,
    InstanceStatus,
    StartupTimes,
    StopReason,
    VllmConfig,
    WakeCheck,
    WakeCheckStatus,
)
from api.log_format import INSTANCE_FIELD
from api.tasks import first_to_finish

from . import lifecycle, startup_phases
from .lifecycle import Phase
from .process_stats import ProcessTreeStats
from .wake_check import ProbeAnswer

log = logging.getLogger("launcher.instances")  # the name the launcher's log lines about instances carry

LOG_FILE = "log"  # in the instance's work directory
DEFAULT_RUNTIME = "vllm"  # when the instance names none
T = TypeVar("T")

Publisher = Callable[["Instance", EventType, int | None], None]


def _unpublished(instance: "Instance", event: EventType, exit_code: int | None) -> None:
    """The publisher of an instance no launcher announces (a test's)."""


class InstanceExited(Exception):
    """The instance's server exited, or the launcher began stopping it, while the launcher waited on
    something of it."""


class InstanceEnd:
    """How an instance's server ends, as the launcher learns it: a stop asked (by a DELETE or the shutdown) and
    its exit (the reaper's word). Either cuts short what the launcher waits for of the instance (`while_running`)."""

    def __init__(self) -> None:
        self._stop_asked = False
        self._exited = asyncio.Event()
        self._over = asyncio.Event()  # exited, or asked to stop

    @property
    def stop_asked(self) -> bool:
        return self._stop_asked

    @property
    def exited(self) -> bool:
        return self._exited.is_set()

    def ask_to_stop(self) -> None:
        self._stop_asked = True
        self._over.set()

    def mark_exited(self) -> None:
        self._exited.set()
        self._over.set()

    async def wait_exited(self) -> None:
        await self._exited.wait()

    async def while_running(self, work: Awaitable[T]) -> T:
        """`work`'s result, or InstanceExited (and `work` cancelled) if the instance's server exits or is asked
        to stop first: a request of the launcher's still open would hold up the server's graceful shutdown
        (uvicorn waits for its connections), vLLM's for good when its engine core is gone already."""
        return await first_to_finish(work, self._cut_short())

    async def _cut_short(self) -> Never:
        await self._over.wait()
        raise InstanceExited()


@dataclass
class Instance:
    id: str
    config: VllmConfig
    argv: list[str]
    defaults_applied: dict[str, str]
    port: int
    pid: int
    work_dir: Path
    temp_dir: Path
    created_at: float
    stats: ProcessTreeStats
    runtime_name: str
    startup: StartupTimes
    publish: Publisher = _unpublished  # each move's event, to the launcher's watchers
    revision: int = 0
    phase: Phase = field(default=lifecycle.FIRST, init=False)  # changed by `move` alone
    sleep_level: int | None = None  # where the launcher put it to sleep; None when it slept behind its back
    exit_code: int | None = None
    stop_reason: StopReason | None = None
    wake_check: WakeCheck = field(default_factory=lambda: WakeCheck(status=WakeCheckStatus.OFF))
    output: "asyncio.Task[None] | None" = None  # copies its log to the launcher's stdout (output_relay)
    probe: ProbeAnswer | None = None  # recorded at its first ready
    offloaded_bytes: int | None = None  # what its last level-1 sleep reported moving out, which a wake moves back
    end: InstanceEnd = field(default_factory=InstanceEnd, init=False)  # a stop asked, its server's exit
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # held by a sleep, a wake and their checks

    def move(self, to: Phase, exit_code: int | None = None) -> None:
        """Go to phase `to` (IllegalTransition if the table has no such move) and publish its event."""
        event = lifecycle.event_of(self.phase, to)
        if to is Phase.AWAKE:
            self.sleep_level = None
        self.phase = to
        self.publish(self, event, exit_code)

    def exited_with(self, exit_code: int) -> None:
        """Its server exited: its end marked, then the move to the stopped phase its phase leads to (asleep or
        not), which publishes STOPPED."""
        self.exit_code = exit_code
        self.end.mark_exited()
        self.move(lifecycle.after(self.phase, EventType.STOPPED), exit_code=exit_code)

    def deleted(self) -> None:
        """Removed from the launcher: the move to the deleted phase its stopped phase leads to (DELETED)."""
        self.move(lifecycle.after(self.phase, EventType.DELETED))

    @property
    def status(self) -> InstanceStatus:
        return lifecycle.status_of(self.phase)

    @property
    def running(self) -> bool:
        return self.phase in lifecycle.RUNNING

    @property
    def ready(self) -> bool:
        return self.phase in lifecycle.READY

    @property
    def sleeping(self) -> bool:
        return self.phase in lifecycle.SLEEPING

    @property
    def log_path(self) -> Path:
        return self.work_dir / LOG_FILE

    @property
    def marks_path(self) -> Path:
        return self.work_dir / startup_phases.MARKS_FILE

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """The launcher's log, its records about this instance carrying its ID (`instance`)."""
        return logging.LoggerAdapter(log, {INSTANCE_FIELD: self.id})

    def state(self, detail: bool = False, gpu_usage: dict[int, int] | None = None) -> InstanceState:
        return InstanceState(
            status=self.status,
            instance_id=self.id,
            revision=self.revision,
            options=self.config.options,
            gpu_uuids=self.config.gpu_uuids,
            env_vars=self.config.env_vars,
            annotations=self.config.annotations,
            runtime=self.config.runtime or DEFAULT_RUNTIME,
            ready=self.ready,
            sleeping=self.sleeping,
            sleep_level=self.sleep_level,
            effective_options=shlex.join(self.argv),
            defaults_applied=self.defaults_applied or None,
            port=self.port,
            exit_code=self.exit_code,
            stop_reason=self.stop_reason,
            wake_check=self.wake_check.model_copy(),
            process=self.stats.sample(gpu_usage) if detail and self.running else None,
            startup=self.startup.model_copy() if detail else None,
        )
