"""Simulated Nodes, the kubelet's side: simulation processes per role, and the containers run in them.

A container whose image the configuration's `simulation.images` names (the requester's and the
launcher's, by default) runs in its role's simulation process (`e2e.simulation`) instead of as a process
of its own; there it answers the real program's HTTP surfaces on its Pod's address (a container `command` picks
another program of the image: FMA's notifier sidecar in the launcher's). Everything else is
the kubelet's, as for any container: environment, volumes, GPUs, probes, restarts, grace periods, status,
Events. Probes are real: HTTP to the container's own address with the Pod's period, timeout and thresholds,
and a failure counts as for a process (a liveness failure restarts the container); only their connection is
kept from one period to the next (`http_probe.py`). Exec probes cannot reach into a simulated container
(they fail, saying so). A simulation process that dies takes its containers with it (they exit with 137,
and restart as their restartPolicy says) and is started again. A large cluster has several processes per role
(`SimulationConfig.processes_per_role`, each within its open-files limit); a Pod's containers all go to the
one its UID picks.
"""

import asyncio
import contextlib
import datetime
import logging
import signal
import sys
import time
import zlib
from pathlib import Path

import aiohttp

from api.tasks import Background
from e2e.kubelet.config import KubeletConfig, SimulationConfig
from e2e.kubelet.images import repository_and_tag
from e2e.simulation.protocol import KILLED, ContainerSpec, Report, Role, Started, Stopped

log = logging.getLogger(__name__)

_START_LIMIT_S = 60.0
_RESTART_DELAY_S = 1.0
_CONTROL_TIMEOUT_S = 60.0  # of one control call, beyond a stop's grace period


class SimulationError(RuntimeError):
    """A simulation process that cannot be started or asked."""


def process_name(role: Role, index: int) -> str:
    """`simulation-launcher` for a role's first process, `simulation-launcher-1` for its second, and so on
    (the names of its URL and log files, and of its CPU in `bench/scale.py`)."""
    return f"simulation-{role}" + (f"-{index}" if index else "")


def url_file(state_dir: Path, role: Role, index: int) -> Path:
    """Where the kubelet's simulation process `index` of `role` writes its control URL."""
    return state_dir / f"{process_name(role, index)}.url"


def url_files(state_dir: Path, role: Role) -> list[Path]:
    """The control-URL files of every simulation process of `role` that has come up."""
    return sorted(state_dir.glob(f"{process_name(role, 0)}*.url"))


class SimulationClient:
    """The control API of one simulation process (`e2e.simulation.protocol`)."""

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url.rstrip("/")
        self._session = session

    async def _post(self, path: str, body: str | None = None, limit_s: float = _CONTROL_TIMEOUT_S) -> bytes:
        headers = {"Content-Type": "application/json"}
        async with self._session.post(
            self.url + path, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=limit_s)
        ) as answer:
            payload = await answer.read()
            if answer.status >= 300:
                raise SimulationError(f"POST {path}: HTTP {answer.status}: {payload.decode(errors='replace')}")
            return payload

    async def start(self, spec: ContainerSpec) -> Started:
        return Started.model_validate_json(await self._post("/containers", spec.model_dump_json()))

    async def stop(self, container_id: str, grace_seconds: float) -> Stopped:
        payload = await self._post(f"/containers/{container_id}/stop?grace={grace_seconds:g}", None,
                                   grace_seconds + _CONTROL_TIMEOUT_S)  # fmt: skip
        return Stopped.model_validate_json(payload)

    async def kill(self, container_id: str) -> Stopped:
        return Stopped.model_validate_json(await self._post(f"/containers/{container_id}/kill"))

    async def report(self, changed_since: float | None = None) -> Report:
        query = {"changed_since": repr(changed_since)} if changed_since is not None else None
        async with self._session.get(self.url + "/report", params=query) as answer:
            answer.raise_for_status()
            return Report.model_validate_json(await answer.read())


class SimulatedContainer:
    """One run of a container in a simulation process (the kubelet's `Container` protocol)."""

    def __init__(self, process: "SimulationProcess", spec: ContainerSpec, exited: "asyncio.Future[int]") -> None:
        self._process = process
        self._spec = spec
        self._exited = exited
        self.started_at = datetime.datetime.now(datetime.UTC)

    @property
    def container_id(self) -> str:
        return f"simulated://{self._spec.role}/{self._spec.id}"

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    async def stop(self, grace_seconds: float) -> int:
        if not self._exited.done():
            await self._process.stop(self._spec.id, grace_seconds)
        return await self.wait()

    def kill(self) -> None:
        if not self._exited.done():
            self._process.kill(self._spec.id)

    async def exec(self, argv: list[str], *, env: dict[str, str], cwd: Path, limit: float) -> tuple[int, str]:
        return 126, f"a simulated {self._spec.role} container has no process to run {argv[:1]} in"


class SimulationProcess:
    """One `python -m e2e.simulation` process, started again whenever it dies."""

    def __init__(self, role: Role, index: int, config: KubeletConfig, simulation: SimulationConfig) -> None:
        self.name = process_name(role, index)
        self._url_file = url_file(config.state_dir, role, index)
        self._log = config.state_dir / f"{self.name}.log"
        self._argv = [
            sys.executable, "-m", "e2e.simulation", "--role", role, "--url-file", str(self._url_file),
            "--state-dir", str(config.state_dir / "simulation" / self.name), "--log-level", simulation.log_level,
        ]  # fmt: skip
        self._session: aiohttp.ClientSession | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._client: SimulationClient | None = None
        self._running: dict[str, asyncio.Future[int]] = {}
        self._supervising = Background()  # restarts the process whenever it dies, until closed
        self._up = asyncio.Event()
        self._closing = False
        self._background = Background()  # the simulation told of kills

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        await self._spawn()
        self._supervising.start(self._supervise(), name=self.name)

    async def _spawn(self) -> None:
        self._url_file.unlink(missing_ok=True)
        self._log.parent.mkdir(parents=True, exist_ok=True)
        with self._log.open("ab") as out:
            # Dies with the kubelet, however the kubelet ends.
            self._process = await asyncio.create_subprocess_exec(
                "setpriv", "--pdeathsig", "KILL", "--", *self._argv,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + _START_LIMIT_S
        while not self._url_file.is_file() or not self._url_file.read_text().strip():
            if self._process.returncode is not None or time.monotonic() > deadline:
                raise SimulationError(f"{self.name} did not come up; its log: {self._log}")
            await asyncio.sleep(0.05)
        assert self._session is not None, "started"
        self._client = SimulationClient(self._url_file.read_text().strip(), self._session)
        self._up.set()
        log.info("%s up (pid %d) at %s", self.name, self._process.pid, self._client.url)

    async def _supervise(self) -> None:
        while True:
            assert self._process is not None
            code = await self._process.wait()
            if self._closing:
                return
            self._up.clear()
            log.error("%s exited with %s; its containers die with it (log %s)", self.name, code, self._log)
            for exited in self._running.values():
                if not exited.done():
                    exited.set_result(KILLED)
            self._running.clear()
            await asyncio.sleep(_RESTART_DELAY_S)
            try:
                await self._spawn()
            except SimulationError as err:
                log.error("%s; trying again", err)

    async def _control(self) -> SimulationClient:
        await self._up.wait()
        assert self._client is not None
        return self._client

    async def run(self, spec: ContainerSpec) -> SimulatedContainer:
        Path(spec.log).parent.mkdir(parents=True, exist_ok=True)
        exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._running[spec.id] = exited
        try:
            started = await (await self._control()).start(spec)
        except (aiohttp.ClientError, TimeoutError, SimulationError) as err:
            started = Started(exit_code=KILLED)
            log.warning("%s/%s: %s did not start it: %s", spec.namespace, spec.pod, self.name, err)
        if started.exit_code is not None:
            self._finish(spec.id, started.exit_code)
        return SimulatedContainer(self, spec, exited)

    def _finish(self, container_id: str, code: int) -> None:
        exited = self._running.pop(container_id, None)
        if exited is not None and not exited.done():
            exited.set_result(code)

    async def stop(self, container_id: str, grace_seconds: float) -> None:
        try:
            stopped = await (await self._control()).stop(container_id, grace_seconds)
            code = stopped.exit_code
        except (aiohttp.ClientError, TimeoutError, SimulationError) as err:
            log.warning("stopping %s in %s failed: %s", container_id, self.name, err)
            code = KILLED
        self._finish(container_id, code)

    def kill(self, container_id: str) -> None:
        """At once, as SIGKILL: the container counts as dead now, the simulation is told in the background."""
        self._finish(container_id, KILLED)
        self._background.start(self._kill(container_id), name=f"kill {container_id}")

    async def _kill(self, container_id: str) -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, SimulationError):
            await (await self._control()).kill(container_id)

    async def close(self) -> None:
        """SIGTERM the process (it cuts off what still runs), SIGKILL it if it lingers."""
        self._closing = True
        await self._supervising.stop()
        await self._background.wait()
        if self._process is not None and self._process.returncode is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(10.0):
                    await self._process.wait()
            except TimeoutError:
                self._process.kill()
                await self._process.wait()
        if self._session is not None:
            await self._session.close()


class Simulations:
    """The simulation processes of one kubelet, and which images they serve."""

    def __init__(self, config: KubeletConfig, simulation: SimulationConfig) -> None:
        self._images = simulation.images
        self.processes = {
            role: [SimulationProcess(role, i, config, simulation) for i in range(simulation.processes_per_role)]
            for role in sorted(set(self._images.values()))
        }

    def role_of(self, image: str) -> Role | None:
        repository, _ = repository_and_tag(image)
        return self._images.get(repository)

    def _all(self) -> list[SimulationProcess]:
        return [p for processes in self.processes.values() for p in processes]

    async def start(self) -> None:
        await asyncio.gather(*(p.start() for p in self._all()))

    async def run(self, spec: ContainerSpec) -> SimulatedContainer:
        return await self.process_of(spec).run(spec)

    def process_of(self, spec: ContainerSpec) -> SimulationProcess:
        """The process of the container's role that its Pod's UID picks (the same for every run of the Pod)."""
        processes = self.processes[spec.role]
        return processes[zlib.crc32(spec.uid.encode()) % len(processes)]

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self._all()))
