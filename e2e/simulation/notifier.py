"""A simulated `state-change-reflector`: FMA's notifier sidecar of a launcher Pod (`python3
/app/launcher_pod_notifier.py` in the launcher's image), in the launcher simulation process.

Real: the notifier's own loop (`launcher.pod_notifier.Notifier`: wait until the Pod's launcher container is
Ready, then list its instances every 2 s and patch their signature onto the Pod when it changes), over its own
Kubernetes client configured in-cluster from the container's environment (KUBERNETES_SERVICE_HOST/PORT) and
its Pod's ServiceAccount token and CA where the Pod mounts them, and an HTTP client of its own for the
launcher at LAUNCHER_BASE_URL (which the kubelet points at the Pod's address). So its cost, a poll of the
launcher every 2 s and a GET or PATCH of its Pod, is paid as FMA's design pays it. Simulated: no process.
"""

import ipaddress
from pathlib import Path, PurePosixPath

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.incluster_config import SERVICE_HOST_ENV_NAME, InClusterConfigLoader

from api.tasks import Background
from e2e.simulation.container import SimulatedContainer, StartFailure
from e2e.simulation.protocol import ContainerSpec
from launcher.fma_compat import NOTIFIER_SCRIPT
from launcher.pod_notifier import BASE_URL_ENV, DEFAULT_BASE_URL, TOKEN_FILE_ENV, Notifier
from requester.spi_auth import SERVICE_ACCOUNT_DIR


def is_notifier(spec: ContainerSpec) -> bool:
    """Whether the container runs FMA's notifier: `python3 <dir>/launcher_pod_notifier.py`."""
    argv = [*(spec.command or []), *spec.args]
    return len(argv) == 2 and PurePosixPath(argv[1]).name == NOTIFIER_SCRIPT


class NotifierContainer(SimulatedContainer):
    def __init__(self, spec: ContainerSpec, state_dir: Path) -> None:
        super().__init__(spec, state_dir)
        self._api: client.ApiClient | None = None
        self._http: aiohttp.ClientSession | None = None
        self._running = Background()  # the notifier's loop

    async def start(self) -> None:
        env = self.spec.env
        pod, namespace = env.get("POD_NAME"), env.get("NAMESPACE")
        if not pod or not namespace:
            raise StartFailure(1, "missing required environment variable POD_NAME or NAMESPACE")
        if not ipaddress.ip_address(env.get(SERVICE_HOST_ENV_NAME, "127.0.0.1")).is_loopback:
            raise StartFailure(1, f"{SERVICE_HOST_ENV_NAME} is not a loopback address: nothing here may dial it")
        account = self.files.host_path(SERVICE_ACCOUNT_DIR)
        configuration = client.Configuration()
        try:
            InClusterConfigLoader(str(account / "token"), str(account / "ca.crt"), environ=env).load_and_set(
                configuration
            )
        except ConfigException as err:  # as the notifier's main: no in-cluster configuration
            raise StartFailure(1, f"Failed to initialize the Kubernetes client: {err!r}") from None
        self._api = client.ApiClient(configuration)
        self._http = aiohttp.ClientSession()
        token_file = env.get(TOKEN_FILE_ENV)
        notifier = Notifier(
            client.CoreV1Api(self._api), self._http, pod, namespace, env.get(BASE_URL_ENV, DEFAULT_BASE_URL),
            str(self.files.host_path(token_file)) if token_file else None,
        )  # fmt: skip
        self._running.start(notifier.run(), name=f"notifier {namespace}/{pod}")
        self.log(f"simulated launcher Pod notifier for {namespace}/{pod}")

    async def stop(self, grace_seconds: float) -> int:
        """As ours on SIGTERM: it ends its loop and exits 0."""
        await self.kill()
        return 0

    async def kill(self) -> None:
        await self._running.stop()
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._api is not None:
            await self._api.close()
            self._api = None
