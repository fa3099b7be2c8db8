"""A simulated requester: the requester's own SPI and probes servers, on its Pod's address, in the
simulation process.

Real: the SPI and probe apps (`requester.spi`, `requester.probes`), their routes and errors, the readiness
bit, the GPUs from NVIDIA_VISIBLE_DEVICES, the set-log relay (into the container's log), and E15: the SPI's
state-changing calls are checked by a TokenReview with the Pod's own ServiceAccount token, against the
API server, as `python -m requester` does (or left open where the Pod says REQUESTER_SPI_AUTH=none).
Simulated: there is no process, and no request proxy (no inference traffic reaches a simulation, so its
port is not opened). Every change of readiness is recorded with its time, for benchmarks.
"""

import asyncio
import time
from pathlib import Path
from typing import BinaryIO

from aiohttp import web

from api.keys import SIMULATED_NVML_ENV
from api.requester import requester_audience
from e2e.simulation.container import SimulatedContainer, StartFailure, abort_connections, exits_as_failure
from e2e.simulation.protocol import KILLED, ContainerSpec, RequesterReport
from requester.__main__ import build_listeners, parse_args
from requester.gpus import GpuDiscoveryError, SourceChoice, discover
from requester.log_relay import LogRelay
from requester.metrics import RequesterMetrics
from requester.readiness import Readiness
from requester.server import start_listeners, stop_listeners
from requester.spi_auth import SERVICE_ACCOUNT_DIR, OpenSpi, SpiAuth, TokenReviewAuth, review_api
from requester.visible_devices import ENV_NAME, parse

PROXY = "proxy"


class RecordedReadiness(Readiness):
    """The requester's readiness bit, with the time of each change."""

    def __init__(self, metrics: RequesterMetrics, process_started: float) -> None:
        super().__init__(metrics, process_started)
        self.transitions: list[tuple[float, bool]] = []

    def set(self, ready: bool) -> None:
        if ready != self.ready:
            self.transitions.append((time.time(), ready))
        super().set(ready)

    def changed_since(self, when: float) -> bool:
        return bool(self.transitions) and self.transitions[-1][0] >= when


class RequesterContainer(SimulatedContainer):
    def __init__(self, spec: ContainerSpec, state_dir: Path) -> None:
        super().__init__(spec, state_dir)
        self._metrics = RequesterMetrics()
        self.readiness = RecordedReadiness(self._metrics, time.time())
        self._runners: list[web.AppRunner] = []
        self._auth: SpiAuth = OpenSpi()
        self._relayed: BinaryIO | None = None

    async def start(self) -> None:
        environ = dict(self.spec.env)
        # What a real requester finds without being told: its host name (the Pod's name) and the
        # namespace of its ServiceAccount.
        environ.setdefault("POD_NAME", self.spec.pod)
        environ.setdefault("POD_NAMESPACE", self.spec.namespace)
        with exits_as_failure():
            args = parse_args(self.spec.args, environ)
        try:
            gpus = discover(
                SourceChoice(args.gpu_source),
                parse(environ.get(ENV_NAME)),
                simulated_nvml=environ.get(SIMULATED_NVML_ENV),
            )
        except GpuDiscoveryError as err:
            raise StartFailure(2, f"no usable GPU source: {err}") from None
        metrics = self._metrics
        metrics.gpus.set(len(gpus.uuids))
        if args.spi_auth == "tokenreview":
            kubeconfig = str(self.files.host_path(args.kubeconfig)) if args.kubeconfig else None
            api = review_api(kubeconfig, environ, self.files.host_path(SERVICE_ACCOUNT_DIR))
            self._auth = TokenReviewAuth(requester_audience(args.namespace, args.pod_name), args.trusted, api)
        self._relayed = self.open_log()  # the relayed log goes to its standard output
        listeners = build_listeners(args, gpus, metrics, self.readiness, LogRelay(self._relayed), self._auth)
        del listeners[PROXY]
        try:
            self._runners = await start_listeners(listeners, args.host, args.shutdown_timeout)
        except OSError as err:
            raise StartFailure(1, f"cannot serve on {args.host}: {err}") from None
        await self._auth.warm()
        self.log(f"simulated requester serving its SPI and probes on {args.host} (GPUs {', '.join(gpus.uuids)})")

    async def stop(self, grace_seconds: float) -> int:
        """As the requester on SIGTERM: stop accepting, idle connections closed at once."""
        try:
            async with asyncio.timeout(grace_seconds):
                await self._shut_down()
        except TimeoutError:
            await self.kill()
            return KILLED
        return 0

    async def _shut_down(self) -> None:
        await stop_listeners(self._runners)
        self._runners = []
        await self._auth.close()
        if self._relayed is not None:
            self._relayed.close()

    async def kill(self) -> None:
        for runner in self._runners:
            abort_connections(runner)
        await self._shut_down()

    def report(self) -> RequesterReport:
        spec = self.spec
        # Not validated: built from our own state, for every requester each second a benchmark polls.
        return RequesterReport.model_construct(
            namespace=spec.namespace,
            pod=spec.pod,
            uid=spec.uid,
            ready=self.readiness.ready,
            transitions=list(self.readiness.transitions),
        )
