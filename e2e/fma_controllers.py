"""FMA's own dual-pods controller and launcher populator (its released binaries), run in one namespace as FMA's
chart runs them.

`helm template` renders FMA's chart; its ServiceAccount, Role, RoleBinding and Node-view ClusterRoleBinding are
applied as they are, and each Deployment's container command runs on this host with FMA's verified binary in place
of `/ko-app/<command>`, authenticated with a token of the chart's ServiceAccount, so RBAC and the admission
policies see FMA's identity exactly as in a cluster. The chart's flags are kept; two are added: `--metrics-port` and
`--debug-port`, on free ports, because every process here shares the host's network and both commands bind all
addresses on 8002 and 8003 (in a cluster each Pod has its own network). Nothing else is tuned.
"""

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import yaml
from kubernetes_asyncio import client

from e2e.chart import DUAL_PODS, helm
from e2e.cluster import processes
from e2e.cluster.cluster import LoopbackCluster
from e2e.cluster.kubeconfig import service_account_token, token_kubeconfig
from e2e.crds import kubectl
from e2e.dualpods_env import PROCESSES, DualPodsEnv, Images
from e2e.fma_release import FMA_VERSION, binary, chart
from e2e.requester_process import distinct_free_ports

# What FMA's installer (install-fma.sh --ensure-node-view-cluster-role) makes for the chart to bind: both controllers
# read Nodes cluster-wide.
NODE_VIEWER = "fma-node-viewer"
NODE_VIEWER_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": NODE_VIEWER},
    "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}],
}
FMA_REQUESTER = f"ghcr.io/llm-d-incubation/llm-d-fast-model-actuation/requester:{FMA_VERSION}"
STOP_GRACE_S = 10.0  # the populator sleeps 5 s after SIGTERM before it exits
# Our launcher and our requester with its SPI open: FMA's controller sends no token (docs/fma-compatibility.md).
OPEN_SPI = Images(
    launcher=PROCESSES.launcher, requester=PROCESSES.requester, requester_env=(("REQUESTER_SPI_AUTH", "none"),)
)
# What FMA's e2e grants its launchers' ServiceAccount (run-launcher-based.sh) for the notifier FMA's controllers add.
NOTIFIER_RBAC: list[dict[str, Any]] = [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "launcher-notifier"},
     "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "launcher-notifier"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "launcher-notifier"},
     "subjects": [{"kind": "ServiceAccount", "name": "default"}]},
]  # fmt: skip


@dataclass
class FmaControllers:
    """FMA's controllers for one namespace. The release name is unique in the cluster (the chart's Node-view
    binding is cluster-scoped) and ends in FMA's ServiceAccount suffix, `-fma-controllers`, through the chart."""

    cluster: LoopbackCluster
    api: client.ApiClient
    namespace: str
    work_dir: Path
    release: str = field(default_factory=lambda: f"fma-{uuid.uuid4().hex[:6]}")
    ports: dict[str, int] = field(default_factory=dict)  # component -> its metrics port

    @property
    def _records(self) -> Path:
        return self.work_dir / f"{self.release}-processes"

    def log_path(self, component: str) -> Path:
        return self.work_dir / f"{self.release}-{component}.log"

    async def start(self) -> None:
        """Apply the chart's RBAC and start both controllers with the chart's commands."""
        rendered = await helm(
            self.cluster, self.work_dir, "template", self.release, str(chart()), "--namespace", self.namespace,
            f"--set=global.nodeViewClusterRole={NODE_VIEWER}",
        )  # fmt: skip
        documents = [d for d in yaml.safe_load_all(rendered) if d]
        rbac = [NODE_VIEWER_ROLE, *(d for d in documents if d["kind"] != "Deployment")]
        await kubectl(self.cluster, "apply", "-n", self.namespace, "-f", "-", stdin=yaml.safe_dump_all(rbac))
        deployments = [d for d in documents if d["kind"] == "Deployment"]
        account = deployments[0]["spec"]["template"]["spec"]["serviceAccountName"]
        token = await service_account_token(self.api, self.namespace, account)
        kubeconfig = token_kubeconfig(self.cluster.kubeconfig, token, self.work_dir / f"{self.release}-kubeconfig")
        for deployment in deployments:
            self._spawn(deployment, kubeconfig)

    def _spawn(self, deployment: dict[str, Any], kubeconfig: Path) -> None:
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        command: list[str] = container["command"]
        component = Path(command[0]).name
        metrics, debug = distinct_free_ports(2, host="0.0.0.0")
        self.ports[component] = metrics
        argv = [str(binary(component)), *command[1:], f"--kubeconfig={kubeconfig}"]
        argv += [f"--metrics-port={metrics}", f"--debug-port={debug}"]
        processes.spawn(
            component, argv, log=self.log_path(component), record_dir=self._records, die_with_parent=True,
            env={"HOME": str(self.work_dir), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip

    async def stop(self) -> None:
        """SIGTERM both (the chart's Pods deleted), then remove the cluster-scoped binding."""
        await asyncio.to_thread(processes.stop, processes.records(self._records), STOP_GRACE_S)
        await kubectl(self.cluster, "delete", "clusterrolebinding", f"{self.release}-node-view", "--ignore-not-found")

    def restart(self, component: str) -> None:
        """Start a stopped controller again, as it ran (a Deployment scaled from 0 to 1)."""
        processes.start_again(self._records, component)

    async def kill(self, component: str) -> None:
        """Stop one controller as its Deployment scaled to 0 would (SIGTERM, then SIGKILL after the grace)."""
        await asyncio.to_thread(processes.stop, [processes.by_name(self._records, component)], STOP_GRACE_S)

    def running(self) -> dict[str, psutil.Process]:
        """The running controllers by component (for their CPU time and memory)."""
        found = {}
        for record in processes.records(self._records):
            if processes.is_running(record):
                found[record.name] = psutil.Process(record.pid)
        return found

    async def metrics(self, component: str = DUAL_PODS) -> str:
        url = f"http://127.0.0.1:{self.ports[component]}/metrics"
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            return await response.text()

    def log_tail(self, component: str = DUAL_PODS, lines: int = 80) -> str:
        text = self.log_path(component).read_text(errors="replace")
        return f"--- FMA's {component} ---\n" + "\n".join(text.splitlines()[-lines:])


def fma_requester_images() -> Images:
    """FMA's requester binary (checked against the release), on ports no other process of this host listens on."""
    binary("requester")
    probes, spi = distinct_free_ports(2, host="0.0.0.0")
    return Images(
        launcher=PROCESSES.launcher, requester=FMA_REQUESTER, requester_probes_port=probes, requester_spi_port=spi
    )


@contextlib.asynccontextmanager
async def fma_running(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, work_dir: Path, images: Images
) -> AsyncIterator[tuple[DualPodsEnv, FmaControllers]]:
    """The namespace set up as FMA's e2e does it (CRDs, gpu-map, the launchers' RBAC: the gpu-map's read, and their
    notifier sidecar's get and patch of its Pod, without which FMA's controller never hears of a stopped instance)
    with FMA's controllers running, stopped on the way out; what they made is left (a cluster about to go down)."""
    env = DualPodsEnv(cluster, api, namespace, work_dir, images)
    fma = FmaControllers(cluster, api, namespace, work_dir)
    try:
        await env.setup()
        await kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(NOTIFIER_RBAC))
        await fma.start()
        yield env, fma
    finally:
        await fma.stop()


@contextlib.asynccontextmanager
async def under_fma(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, work_dir: Path, images: Images
) -> AsyncIterator[tuple[DualPodsEnv, FmaControllers]]:
    """`fma_running`, and on the way out the requesters are deleted while FMA's controllers still run, so they take
    its finalizers off (a cluster that other tests go on using)."""
    async with fma_running(cluster, api, namespace, work_dir, images) as (env, fma):
        try:
            yield env, fma
        finally:
            await env.teardown()
