"""Faults a production cluster produces, injected into the loopback cluster from outside, and the checks
that a user would make afterwards: does the requester's proxy answer again?

Processes are found as an operator on the node would find them: the launcher by its Pod's address in its
environment, an instance by the PID its launcher reports, an instance's engine by its process tree.
"""

import contextlib
import os
import signal
import time
from typing import Any

import aiohttp
import psutil

from api import keys
from controller import pods
from e2e.dualpods_env import DualPodsEnv, Obj
from e2e.waiting import wait_for
from standin.engine_core import ENGINE_TITLE

PROXY_PORT = 8082  # the requester's OpenAI proxy (FMA 0.7's --proxy-port)


def container_process(module: str, variable: str, pod_ip: str) -> psutil.Process:
    """The `python -m <module>` process of the Pod at `pod_ip` (found by the environment variable that
    holds the Pod's address): its container's command, PID 1 of the container's PID namespace (not the
    namespace wrapper around it, nor a process it forked)."""
    found: list[psutil.Process] = []
    for process in psutil.process_iter(["cmdline"]):
        line = process.info["cmdline"] or []
        if module in line and "-m" in line:
            try:
                if process.environ().get(variable) == pod_ip:
                    found.append(process)
            except psutil.Error:
                continue
    for process in found:
        with contextlib.suppress(psutil.Error, OSError):
            if namespace_pid(process) == 1:
                return process
    raise LookupError(f"no {module} process serves {pod_ip}")


def launcher_process(pod_ip: str) -> psutil.Process:
    return container_process("launcher", "LAUNCHER_HOST", pod_ip)


async def kill(process: psutil.Process) -> None:
    """SIGKILL `process` and return once it is dead, so that what a test checks next cannot be the work of the
    process it killed (a proxy still answered by an instance in its last milliseconds)."""
    process.send_signal(signal.SIGKILL)

    def dead() -> bool:  # gone, or a zombie its parent has not reaped yet: either answers nothing any more
        try:
            return process.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    await wait_for(dead, what=f"process {process.pid} dead after SIGKILL", within=10, interval=0.05)


async def kill_launcher(env: DualPodsEnv, launcher: Obj) -> Obj:
    """SIGKILL the launcher's process, as an OOM kill does; returns its Pod once the kubelet reports the
    container's restart, by when the instances it had are gone too (each dies with its launcher)."""
    name = launcher["metadata"]["name"]
    restarts = pods.restart_count(await env.pod(name))
    await kill(launcher_process(launcher["status"]["podIP"]))

    async def restarted() -> Obj | None:
        again = await env.pod(name)
        return again if pods.restart_count(again) > restarts else None

    found: Obj | None = await wait_for(restarted, what=f"launcher {name}'s container restart reported", within=30)
    assert found is not None
    return found


def requester_process(pod_ip: str) -> psutil.Process:
    return container_process("requester", "POD_IP", pod_ip)


def namespace_pid(process: psutil.Process) -> int:
    """The process's PID inside its container's PID namespace (what the launcher, running there, reports)."""
    with open(f"/proc/{process.pid}/status") as status:
        line = next(line for line in status if line.startswith("NSpid:"))
    return int(line.split()[-1])


def in_container(launcher: psutil.Process, pid: int) -> psutil.Process:
    """The host process of the launcher's descendant whose PID in the container is `pid`."""
    for child in launcher.children(recursive=True):
        with contextlib.suppress(psutil.Error, OSError):
            if namespace_pid(child) == pid:
                return child
    raise LookupError(f"launcher {launcher.pid} has no process {pid} in its container")


async def instance_process(env: DualPodsEnv, launcher: Obj, instance: str) -> psutil.Process:
    """The root process of `instance` as its launcher reports it (a PID in the launcher's container)."""
    listing = await env.instances(launcher)
    state = next(s for s in listing["instances"] if s["instance_id"] == instance)
    return in_container(launcher_process(launcher["status"]["podIP"]), int(state["process"]["pid"]))


def engine_process(instance: psutil.Process) -> psutil.Process:
    """The instance's engine process (the stand-in's, as vLLM's EngineCore), by its process title."""
    for child in instance.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if " ".join(child.cmdline()).startswith(ENGINE_TITLE):
                return child
    raise LookupError(f"instance process {instance.pid} has no {ENGINE_TITLE} process")


async def serving_pair(env: DualPodsEnv, replica_set: str) -> tuple[Obj, Obj, str]:
    """The set's Ready requester, its launcher and the bound instance's ID."""
    requester = await env.ready_requester(replica_set, within=120)
    launcher = await env.launcher_of(requester)
    return requester, launcher, pods.annotations(launcher)[keys.INSTANCE_ID_ANNOTATION]


def signal_tree(process: psutil.Process, sig: signal.Signals) -> None:
    for each in [process, *process.children(recursive=True)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each.pid, sig)


async def proxy_answers(requester: Obj, model: str) -> bool:
    url = f"http://{requester['status']['podIP']}:{PROXY_PORT}/v1/completions"
    body: dict[str, Any] = {"model": model, "prompt": "hi", "max_tokens": 2}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http,
            http.post(url, json=body) as response,
        ):
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def wait_served(env: DualPodsEnv, replica_set: str, model: str, within: float) -> float:
    """Until the set's Ready requester's proxy answers 200; returns the seconds it took."""
    started = time.monotonic()

    async def answering() -> bool:
        found = [p for p in await env.requesters(replica_set) if pods.is_ready(p)]
        return len(found) == 1 and await proxy_answers(found[0], model)

    try:
        await wait_for(answering, what=f"{replica_set}'s proxy answering 200", within=within, interval=0.2)
    except TimeoutError as err:
        raise TimeoutError(f"{err}\n{await env.controllers.log_tail()}") from None
    return time.monotonic() - started
