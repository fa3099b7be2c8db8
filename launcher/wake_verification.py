"""The post-wake check as the launcher runs it: the probe recorded at an instance's first ready, replayed
after every wake before the instance is reported awake; one that answers otherwise is killed
(`WakeCheckFailed`). What a probe is and how two answers compare is `wake_check`'s.
"""

import asyncio
import contextlib
import time

from api.launcher import StopReason, WakeCheck, WakeCheckStatus

from . import wake_check
from .errors import BackendError, WakeCheckFailed
from .instance import Instance, InstanceExited
from .instance_server import REAP_WAIT_S, InstanceServers
from .liveness import Verdict
from .metrics import LauncherMetrics
from .runtimes import Runtime
from .stopping import Stopper

MAX_DETAIL_CHARS = 500  # of a wake check's detail, which every event of the instance carries


class WakeVerifier:
    def __init__(self, servers: InstanceServers, stopper: Stopper, metrics: LauncherMetrics) -> None:
        self.servers = servers
        self.stopper = stopper
        self.metrics = metrics
        # Instances whose lock is held only to record the first ready's probe: their sleep-state looks go on.
        self._recording: set[str] = set()

    def recording(self, instance: Instance) -> bool:
        return instance.id in self._recording

    async def record(self, instance: Instance, runtime: Runtime, locked: bool = False) -> None:
        """Record the instance's answer to the probe, once it is ready (not before: a runtime's first completion
        can take seconds, vLLM's first with log-probabilities on a CPU about 2.5 s, which would delay every cold
        start); a sleep waits for it (`locked`: the caller holds the instance's lock already). Without an
        answer its wakes go unchecked (and the state says why)."""
        started = time.monotonic()
        try:
            async with contextlib.nullcontext() if locked else instance.lock:
                if not locked:
                    self._recording.add(instance.id)
                try:
                    answer = await self.servers.ask_probe(
                        instance, wake_check.PROBE_PROMPT, runtime.probe_logprobs, wake_check.FIRST_PROBE_TIMEOUT
                    )
                finally:
                    self._recording.discard(instance.id)
        except InstanceExited:
            return
        except wake_check.ProbeError as err:
            if instance.end.stop_asked:  # its server is shutting down; asking it more would hold up its exit
                return
            if await self.servers.is_sleeping(instance):  # put to sleep behind the launcher's back meanwhile
                instance.log.info(
                    "instance %s: its probe was cut short by a sleep; recorded at its next wake", instance.id
                )
                return
            instance.log.warning(
                "instance %s: cannot record its probe, so its wakes go unchecked: %s", instance.id, err
            )
            instance.wake_check = WakeCheck(status=WakeCheckStatus.UNAVAILABLE, detail=str(err)[:MAX_DETAIL_CHARS])
            return
        instance.probe = answer
        instance.wake_check = WakeCheck(status=WakeCheckStatus.RECORDED, probe=answer.recorded())
        instance.log.info("instance %s: recorded its probe in %.3f s: %s", instance.id, time.monotonic() - started,
                          answer.recorded().model_dump_json(exclude_none=True))  # fmt: skip

    async def check(self, instance: Instance, runtime: Runtime) -> None:
        """Replay the probe of an instance just woken (its lock held); kill it and raise WakeCheckFailed if it
        answers otherwise. One whose probe a sleep cut short before it was recorded has it recorded now."""
        recorded = instance.probe
        if recorded is None:
            self.metrics.wake_checks.labels("unchecked").inc()
            if instance.wake_check.status is WakeCheckStatus.PENDING:
                await self.record(instance, runtime, locked=True)
            return
        started = time.monotonic()
        prompt = recorded.prompt_token_ids or wake_check.PROBE_PROMPT
        try:
            answer = await self.servers.ask_probe(
                instance, prompt, recorded.logprobs is not None, wake_check.PROBE_TIMEOUT
            )
            problem = wake_check.compare(recorded, answer)
        except wake_check.ProbeError as err:
            problem = str(err)
        except InstanceExited:
            raise BackendError(
                f"instance {instance.id} stopped (exit code {instance.exit_code}) during its post-wake check"
            ) from None
        elapsed = time.monotonic() - started
        self.metrics.wake_check_seconds.observe(elapsed)
        instance.wake_check.last_seconds = round(elapsed, 6)
        if problem is None:
            instance.wake_check.passed += 1
            self.metrics.wake_checks.labels("passed").inc()
            return
        self.metrics.wake_checks.labels("failed").inc()
        instance.wake_check.detail = problem[:MAX_DETAIL_CHARS]
        verdict = Verdict(StopReason.WAKE_CHECK_FAILED, f"woken, it failed its post-wake check: {problem}")
        self.stopper.kill(instance, verdict)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REAP_WAIT_S):
                await instance.end.wait_exited()
        raise WakeCheckFailed(
            f"instance {instance.id} failed its post-wake check and was killed: {problem}; create it again"
        )
