"""The controllers installed with the Helm chart, running as Pods through the loopback kubelet, as a
platform engineer would install them; tests can restart or kill them like any Pod."""

import asyncio
import contextlib
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from kubernetes_asyncio import client

from e2e.cluster.cluster import LoopbackCluster, pod_is_ready
from e2e.waiting import wait_for
from scripts.helm_chart import CHART, helm_env
from scripts.venv_tools import venv_tool

DUAL_PODS = "dual-pods-controller"
POPULATOR = "launcher-populator"

# Helm's own `--wait` allows five minutes. A quiet machine starts the controllers in seconds; `make test`'s
# parallel workers and the image build beside them (load average 5 to 9 on two cores) once took 63 s.
READY_WITHIN_S = 180


async def helm(cluster: LoopbackCluster, work_dir: Path, *args: str, kubeconfig: Path | None = None) -> str:
    """Run helm against the loopback cluster with its state kept in `work_dir`, as the cluster's admin or as
    the user of `kubeconfig`."""
    home = work_dir / "helm-home"
    home.mkdir(parents=True, exist_ok=True)
    process = await asyncio.create_subprocess_exec(
        str(venv_tool("helm")), "--kubeconfig", str(kubeconfig or cluster.kubeconfig), *args,
        env=helm_env(home), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed: {err.decode()}")
    return out.decode()


@dataclass
class InstalledControllers:
    """A release of the chart in one namespace."""

    cluster: LoopbackCluster
    api: client.ApiClient
    namespace: str
    work_dir: Path
    release: str = "dualpods"
    kubeconfig: Path | None = None  # whose rights helm uses: the cluster admin's unless set (a tenant's)

    async def helm(self, *args: str) -> str:
        return await helm(self.cluster, self.work_dir, *args, "-n", self.namespace, kubeconfig=self.kubeconfig)

    async def install(self, *settings: str) -> None:
        await self.helm("install", self.release, str(CHART), *(f"--set={s}" for s in settings))
        for component in (DUAL_PODS, POPULATOR):
            try:
                await self.wait_running(component)
            except TimeoutError as error:
                raise TimeoutError(f"{error}\n{await self.log_tail(component)}") from None

    async def uninstall(self) -> None:
        await self.helm("uninstall", self.release, "--ignore-not-found", "--wait")

    async def pods(self, component: str) -> list[Any]:
        core = client.CoreV1Api(self.api)
        found = await core.list_namespaced_pod(
            self.namespace,
            label_selector=f"app.kubernetes.io/instance={self.release},app.kubernetes.io/component={component}",
        )
        return [p for p in found.items if p.metadata.deletion_timestamp is None]

    async def wait_running(self, component: str, replicas: int = 1) -> list[Any]:
        async def ready() -> list[Any]:
            found = await self.pods(component)
            ok = [p for p in found if pod_is_ready(p)]
            return ok if len(ok) >= replicas else []

        result: list[Any] = await wait_for(ready, what=f"{component} Ready", within=READY_WITHIN_S)
        return result

    def processes(self, component: str) -> list[psutil.Process]:
        """The controller processes of this release (containers run as local processes here), one per
        container: a process forked by one that matches (the container's setup shell running `mount`, in the
        moment before that child's exec) carries the same command line and is left out."""
        command = "dual-pods" if component == DUAL_PODS else "populator"
        found: dict[int, psutil.Process] = {}
        for process in psutil.process_iter(["cmdline", "name", "ppid"]):
            line = process.info["cmdline"] or []
            if process.info["name"] == "unshare":  # the kubelet's namespace wrapper, not the controller
                continue
            if "controller" in line and command in line and f"--namespace={self.namespace}" in line:
                found[process.pid] = process
        return [p for p in found.values() if p.info["ppid"] not in found]

    def running(self) -> dict[str, psutil.Process]:
        """The running controllers by component (as `FmaControllers.running`, for their CPU time and memory)."""
        return {component: process for component in (DUAL_PODS, POPULATOR) for process in self.processes(component)}

    def kill(self, component: str = DUAL_PODS) -> int:
        """SIGKILL the controller, as a crash would (the kubelet restarts its container); how many
        processes were killed (none while the container waits to be restarted). One that exits between the
        listing and the signal is not counted: a caller that retries until one is killed must not kill the
        next run of the container too."""
        killed = 0
        for process in self.processes(component):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
                killed += 1
        return killed

    async def restart(self, component: str = DUAL_PODS) -> None:
        """Delete the controller's Pod; its Deployment makes a new one."""
        core = client.CoreV1Api(self.api)
        old = {p.metadata.name for p in await self.pods(component)}
        for name in old:
            await core.delete_namespaced_pod(name, self.namespace)

        async def replaced() -> bool:
            names = {p.metadata.name for p in await self.wait_running(component)}
            return bool(names) and not names & old

        await wait_for(replaced, what=f"{component} replaced", within=60)

    async def metrics(self, component: str = DUAL_PODS) -> str:
        pod = (await self.pods(component))[0]
        async with aiohttp.ClientSession() as http, http.get(f"http://{pod.status.pod_ip}:8002/metrics") as response:
            return await response.text()

    async def log_tail(self, component: str = DUAL_PODS, lines: int = 80) -> str:
        """The end of the controller container's log, for failure messages."""
        tails = []
        for pod in await self.pods(component):
            text = self.cluster.container_log(pod, "controller")
            tails.append(f"--- {pod.metadata.name} ---\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(tails)
