"""A simulated launcher: the launcher's own REST API (`launcher.app`) on its Pod's address, in the
simulation process, over simulated instances (`instances.py`).

Real: the routes and their errors and reasons, the bearer token (E9) read from the Pod's Secret volume,
the watch stream with heartbeats, revisions, boot ID and `since` (E14), the instance checks, GPUs from the
node's entry in the gpu-map ConfigMap, read with the Pod's own ServiceAccount token. Simulated: no
process (neither the launcher's nor its instances'), no preload (it serves at once), no NVML (a simulated
node's GPUs are always its gpu-map entry, whether or not the container asks for --mock-gpus).
"""

import asyncio
import functools
import ssl
from pathlib import Path

import aiohttp
from aiohttp import web

from api.keys import GPU_MAP_CONFIGMAP
from e2e.simulation.container import SimulatedContainer, StartFailure, abort_connections, exits_as_failure
from e2e.simulation.instances import LedgerLog, simulated_instances
from e2e.simulation.protocol import KILLED, ContainerSpec, LauncherReport
from launcher.__main__ import parse_args, read_token
from launcher.app import build_app
from launcher.gpus import GpuInventory, GpuMap, Loader, gpu_map_entry, naive_loader
from launcher.instances import InstanceManager, ManagerSettings
from launcher.metrics import LauncherMetrics
from requester.spi_auth import SERVICE_ACCOUNT_DIR

# As `web.run_app(..., shutdown_timeout=15)` in `python -m launcher`.
SHUTDOWN_TIMEOUT_S = 15.0


@functools.lru_cache(maxsize=8)
def _trusting(ca_pem: str) -> ssl.SSLContext:
    """A TLS context that trusts `ca_pem`, shared by the launchers of this process that trust the same CA
    (a real launcher makes its own, once: here a thousand of them did, a tenth of this process's time)."""
    return ssl.create_default_context(cadata=ca_pem)


class LauncherContainer(SimulatedContainer):
    def __init__(self, spec: ContainerSpec, state_dir: Path) -> None:
        super().__init__(spec, state_dir)
        self.manager: InstanceManager | None = None
        self.ledger: LedgerLog | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        environ = self.spec.env
        with exits_as_failure():
            args = parse_args(self.spec.args, environ)
        token_file = str(self.files.host_path(args.auth_token_file)) if args.auth_token_file else None
        try:
            with exits_as_failure():
                token = read_token(token_file, args.auth_token_grace_seconds)
        except OSError as err:
            raise StartFailure(1, f"cannot read the auth token file {args.auth_token_file}: {err}") from None
        settings = ManagerSettings(
            host=args.host,
            port=args.port,
            state_dir=self.state_dir,
            stop_grace_seconds=args.stop_grace_seconds,
            backend_timeout_seconds=args.backend_timeout_seconds,
            zygote=False,  # a simulated instance has no process to fork
        )
        inventory = self._inventory(args.mock_gpus or args.mock_gpu_count)
        inventory.read_early()
        self.ledger = LedgerLog(args.watch_history)
        self.manager = simulated_instances(inventory, LauncherMetrics(), self.ledger, settings)
        self.ledger.instances = self.manager.snapshot
        self._runner = web.AppRunner(
            build_app(self.manager, token), access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, args.host, args.port).start()
        except OSError as err:
            await self._runner.cleanup()
            raise StartFailure(1, f"cannot serve on {args.host}:{args.port}: {err}") from None
        self.log(f"simulated launcher serving its API on {args.host}:{args.port}; GPUs from {self.manager.gpus.source}")

    def _inventory(self, mock_count: int) -> GpuInventory:
        node, namespace = self.spec.env.get("NODE_NAME"), self.spec.env.get("NAMESPACE")
        if node and namespace:
            return GpuInventory(f"ConfigMap {namespace}/{GPU_MAP_CONFIGMAP}[{node}]", self._gpu_map(node, namespace))
        return GpuInventory(f"{mock_count} mock GPUs", naive_loader(mock_count))

    def _gpu_map(self, node: str, namespace: str) -> Loader:
        """The node's entry in the gpu-map, read as the launcher does: with its Pod's ServiceAccount."""
        env = self.spec.env
        url = (f"https://{env.get('KUBERNETES_SERVICE_HOST')}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"
               f"/api/v1/namespaces/{namespace}/configmaps/{GPU_MAP_CONFIGMAP}")  # fmt: skip
        account = self.files.host_path(SERVICE_ACCOUNT_DIR)

        async def load() -> GpuMap:
            tls = _trusting((account / "ca.crt").read_text())
            headers = {"Authorization": f"Bearer {(account / 'token').read_text().strip()}"}
            async with aiohttp.ClientSession() as session, session.get(url, headers=headers, ssl=tls) as answer:
                answer.raise_for_status()
                body = await answer.json()
            return gpu_map_entry(body.get("data"), node, namespace)

        return load

    async def stop(self, grace_seconds: float) -> int:
        """As the launcher on SIGTERM: stop serving, stop every instance, within the grace period."""
        if self._runner is None:
            return 0
        try:
            async with asyncio.timeout(grace_seconds):
                await self._runner.cleanup()
        except TimeoutError:
            await self.kill()
            return KILLED
        return 0

    async def kill(self) -> None:
        if self._runner is not None:
            abort_connections(self._runner)
            await self._runner.cleanup()
            self._runner = None

    def report(self) -> LauncherReport:
        spec = self.spec
        instances = self.manager.snapshot() if self.manager is not None else []
        ledger = self.ledger.ledger if self.ledger is not None else []
        return LauncherReport(namespace=spec.namespace, pod=spec.pod, uid=spec.uid, instances=instances, ledger=ledger)
