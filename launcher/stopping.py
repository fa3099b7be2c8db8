"""Ending an instance: a graceful stop (asked by a DELETE or the launcher's shutdown), a kill (of one
judged broken), and the clean-up of what it leaves (its output copy, its files).

A graceful stop asks the instance's server alone (SIGTERM to the process the launcher forked, as a kubelet
asks a container's first process): the server ends what it started itself, vLLM its engine core, in its own
order. Signalling the whole group instead let the engine core exit on its own SIGTERM while its server was
still on its way down, and the server then exited 1 as over a crashed engine. The whole group gets SIGKILL when
the grace period ends or a kill is due, and whatever the server leaves in it once it exits (the reaper's exit
handler, `forking.ProcessForker`), so nothing an instance forked outlives it. Its exit is learned from the
reaper (SIGCHLD), which moves it to STOPPED.
"""

import asyncio
import shutil
import signal

from . import process_control
from .instance import Instance
from .liveness import Verdict

OUTPUT_DRAIN_S = 5.0  # the most a stop waits for an instance's last output lines to be copied


class Stopper:
    def __init__(self, grace_seconds: float) -> None:
        self.grace_seconds = grace_seconds

    async def stop(self, instance: Instance) -> None:
        """SIGTERM the instance's server (and SIGCONT to its group, so a stopped process gets it too), SIGKILL
        the group after the grace period; returns once the server exited (the reaper kills what it left)."""
        if not instance.running:
            return
        instance.end.ask_to_stop()
        process_control.signal_process(instance.pid, signal.SIGTERM)
        self.signal(instance, signal.SIGCONT)
        try:
            async with asyncio.timeout(self.grace_seconds):
                await instance.end.wait_exited()
        except TimeoutError:
            instance.log.warning("instance %s ignored SIGTERM for %.0f s; killing it", instance.id, self.grace_seconds)
            self.signal(instance, signal.SIGKILL)
            await instance.end.wait_exited()

    def kill(self, instance: Instance, verdict: Verdict) -> None:
        """Kill a broken instance's whole process group at once: there is nothing left to shut down
        gracefully. Its STOPPED event follows when the reaper has its exit code. The first verdict stands: the
        kill itself ends its engine processes, maybe seen before its server's exit."""
        if not instance.running or instance.end.stop_asked or instance.stop_reason is not None:
            return  # it is already going: this stop was asked for, or it is already being killed
        instance.log.warning(
            "instance %s: %s; killing its process group (%s)", instance.id, verdict.message, verdict.reason
        )
        instance.stop_reason = verdict.reason
        self.signal(instance, signal.SIGKILL)

    def signal(self, instance: Instance, signum: int) -> None:
        """Signal the process group of a running (so not yet reaped) instance."""
        process_control.signal_group(instance.pid, signum, leader_unreaped=instance.running)


async def copied(instance: Instance) -> None:
    """Until the instance's output is on the launcher's stdout, its last lines included (it has exited).
    The copy is shielded: a waiter that gives up (or is cancelled) leaves it running; a copy cancelled
    itself (the launcher's shutdown) ends the wait, while a cancellation of the waiter goes on up."""
    if instance.output is not None:
        try:
            async with asyncio.timeout(OUTPUT_DRAIN_S):
                await asyncio.shield(instance.output)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            if not instance.output.cancelled():
                raise


def remove_files(instance: Instance) -> None:
    shutil.rmtree(instance.work_dir, ignore_errors=True)
    shutil.rmtree(instance.temp_dir, ignore_errors=True)
