"""etcd + kube-apiserver + kube-controller-manager + kube-scheduler, all bound to 127.0.0.1.

TLS everywhere with a generated CA, RBAC authorization, client-certificate identities (admin in
`system:masters`, the controller-manager and scheduler under their well-known names), ServiceAccount
token signing. Which controllers run, and why the others do not, is in `CONTROLLERS`.
"""

import asyncio
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kubernetes_asyncio import client, config

from e2e.cluster import processes
from e2e.cluster.binaries import Binaries
from e2e.cluster.kubeconfig import write_kubeconfig
from e2e.cluster.pki import CertificateAuthority, KeyPair, write_service_account_keys
from e2e.cluster.ports import free_port
from e2e.cluster.readiness import StartupError, wait_http_ok

LOOPBACK = "127.0.0.1"

# The API server accepts a loopback service range, so ClusterIPs are 127.x addresses. Nothing listens on them
# and nothing may dial them: Pods are addressed by their own IPs (see SPEC.md).
SERVICE_CIDR = "127.16.0.0/16"
KUBERNETES_SERVICE_IP = "127.16.0.1"

# Controllers that work with loopback Pods and fake Nodes (their names as of 1.29; 1.32 to 1.37 know them all),
# among them what Pod Security, admission policies and DRA rely on: taint-based eviction, the policies'
# type-checking status, and ResourceClaims made from templates. Left out on purpose: endpoints, endpointslice and
# endpointslice-mirroring (the API server rejects 127.x Pod IPs in Endpoints, so they would only log errors, and
# nothing may use Service routing here), node-ipam, node-route, service-lb, service-cidr and cloud-node-lifecycle
# (no cloud, no Pod CIDRs), the persistent-volume controllers (no volume plugins), the CSR signers (no kubelet
# certificates), horizontal-pod-autoscaler (no metrics API), bootstrap-signer and token-cleaner (no bootstrap
# tokens), and the storage-version ones.
CONTROLLERS = (
    "serviceaccount-token-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "resourcequota-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "pod-garbage-collector-controller",
    "replicaset-controller",
    "replicationcontroller-controller",
    "deployment-controller",
    "statefulset-controller",
    "daemonset-controller",
    "job-controller",
    "cronjob-controller",
    "ttl-after-finished-controller",
    "disruption-controller",
    "validatingadmissionpolicy-status-controller",
    "resourceclaim-controller",
)

# Seconds without a heartbeat before the node lifecycle controller marks a Node NotReady.
NODE_MONITOR_GRACE_SECONDS = 20


@dataclass(frozen=True)
class Tuning:
    """What the control plane's own components are given; the defaults suit a few Nodes and quick tests."""

    node_monitor_grace_seconds: int = NODE_MONITOR_GRACE_SECONDS
    # The client rate limits of kube-controller-manager and kube-scheduler (None: the binaries' own, 20 and
    # 50 requests/s: creating and binding 1,000 Pods, with their Events, would then take over 100 s by itself).
    client_qps: int | None = None
    client_burst: int | None = None

    def client_flags(self) -> list[str]:
        flags = [f"--kube-api-qps={self.client_qps}"] if self.client_qps is not None else []
        return flags + ([f"--kube-api-burst={self.client_burst}"] if self.client_burst is not None else [])


# Hundreds of simulated Nodes: Kubernetes' default grace period (their heartbeats come every 10 s, as a
# real kubelet's do), and client limits that let the cluster's own controllers keep up with the Pods.
MANY_NODES = Tuning(node_monitor_grace_seconds=40, client_qps=500, client_burst=1000)


@dataclass(frozen=True)
class Ports:
    """The loopback ports of one control plane."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int

    @classmethod
    def choose(cls, apiserver: int = 0, etcd_client: int = 0) -> "Ports":
        """`apiserver`/`etcd_client` when free (0: any), every other port picked by the kernel."""
        chosen: list[int] = []
        for preferred in (etcd_client, 0, apiserver, 0, 0):
            port = free_port(preferred)
            while port in chosen:
                port = free_port()
            chosen.append(port)
        return cls(*chosen)


class ControlPlane:
    """Starts the control plane in `state_dir`; `processes.stop` on its records stops it."""

    def __init__(
        self, state_dir: Path, ports: Ports, binaries: Binaries, *, die_with_parent: bool, tuning: Tuning = Tuning()
    ) -> None:
        self.state_dir = state_dir
        self.tuning = tuning
        self.ports = ports
        self.binaries = binaries
        self.die_with_parent = die_with_parent
        self.url = f"https://{LOOPBACK}:{ports.apiserver}"
        self.pki_dir = state_dir / "pki"
        self.kubeconfig = state_dir / "kubeconfig"
        self.kubelet_kubeconfig = state_dir / "kubelet" / "kubeconfig"
        self.records_dir = state_dir / "processes"
        self.logs_dir = state_dir / "logs"
        self.ca_cert = self.pki_dir / "ca.crt"

    def _spawn(self, name: str, argv: list[str]) -> tuple["subprocess.Popen[bytes]", Path]:
        log = self.logs_dir / f"{name}.log"
        process = processes.spawn(
            name, argv, log=log, record_dir=self.records_dir, die_with_parent=self.die_with_parent
        )
        return process, log

    def _write_credentials(self) -> tuple[KeyPair, KeyPair, Path, Path]:
        """Certificates and kubeconfigs; returns (serving pair, SA keys, kcm and scheduler kubeconfigs)."""
        ca = CertificateAuthority(self.pki_dir)
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            server_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            server_ips=(LOOPBACK, KUBERNETES_SERVICE_IP),
        )
        service_accounts = write_service_account_keys(self.pki_dir)
        write_kubeconfig(
            self.kubeconfig, self.url, self.ca_cert, ca.issue("admin", "admin", organization="system:masters")
        )
        self.kubelet_kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        # One process plays the kubelet of every Node, so it cannot use a per-node system:node identity.
        write_kubeconfig(
            self.kubelet_kubeconfig,
            self.url,
            self.ca_cert,
            ca.issue("kubelet", "dualpods:loopback-kubelet", organization="system:masters"),
        )
        component_kubeconfigs = []
        for component, user in (
            ("controller-manager", "system:kube-controller-manager"),
            ("scheduler", "system:kube-scheduler"),
        ):
            (self.state_dir / component).mkdir(exist_ok=True)
            component_kubeconfigs.append(
                write_kubeconfig(
                    self.state_dir / component / "kubeconfig", self.url, self.ca_cert, ca.issue(component, user)
                )
            )
        controller_manager, scheduler = component_kubeconfigs
        return serving, service_accounts, controller_manager, scheduler

    async def start(self) -> dict[str, float]:
        """Start everything and wait until it serves; returns seconds per readiness step."""
        timings: dict[str, float] = {}
        serving, sa_keys, kcm_kubeconfig, scheduler_kubeconfig = self._write_credentials()
        p = self.ports
        etcd, etcd_log = self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=loopback",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls=http://{LOOPBACK}:{p.etcd_client}",
                f"--advertise-client-urls=http://{LOOPBACK}:{p.etcd_client}",
                f"--listen-peer-urls=http://{LOOPBACK}:{p.etcd_peer}",
                f"--initial-advertise-peer-urls=http://{LOOPBACK}:{p.etcd_peer}",
                f"--initial-cluster=loopback=http://{LOOPBACK}:{p.etcd_peer}",
                "--unsafe-no-fsync",  # test data: durability is not worth the disk writes
                "--log-level=warn",
            ],
        )
        timings["etcd"] = await wait_http_ok("etcd", f"http://{LOOPBACK}:{p.etcd_client}/health", etcd, etcd_log)

        apiserver, apiserver_log = self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers=http://{LOOPBACK}:{p.etcd_client}",
                f"--bind-address={LOOPBACK}",
                f"--advertise-address={LOOPBACK}",
                f"--secure-port={p.apiserver}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={self.ca_cert}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--service-account-key-file={sa_keys.cert}",
                f"--service-account-signing-key-file={sa_keys.key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                # The master Endpoints would hold 127.0.0.1, which Endpoints validation rejects.
                "--endpoint-reconciler-type=none",
                # `kubectl logs/exec` make the API server dial the Node: by its InternalIP (127.N.0.1, where
                # nothing listens, so the call fails at once), never by its name, whose DNS lookup would
                # leave the loopback network.
                "--kubelet-preferred-address-types=InternalIP",
                "--allow-privileged=true",
                # On SIGTERM, drain the requests in flight (new ones get 429 Retry-After), then close every
                # connection within 2 s, as an API server behind a load balancer is run. Without it net/http
                # waits up to --request-timeout (60 s) for the open watch streams to end, and each restart of
                # a test's outage was a 10 s hang ended by SIGKILL (`processes.stop`).
                "--shutdown-send-retry-after=true",
                "--profiling=false",
                "--v=1",
            ],
        )
        admin_tls = ssl.create_default_context(cafile=str(self.ca_cert))
        admin_tls.load_cert_chain(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
        timings["kube-apiserver"] = await wait_http_ok(
            "kube-apiserver", f"{self.url}/readyz", apiserver, apiserver_log, ssl_context=admin_tls, limit=90
        )

        common = [f"--bind-address={LOOPBACK}", "--leader-elect=false", "--profiling=false", "--v=1"]
        kcm, kcm_log = self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                *common,
                f"--secure-port={p.controller_manager}",
                f"--cert-dir={self.state_dir / 'controller-manager'}",
                f"--kubeconfig={kcm_kubeconfig}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={sa_keys.key}",
                f"--root-ca-file={self.ca_cert}",
                f"--controllers={','.join(CONTROLLERS)}",
                f"--node-monitor-grace-period={self.tuning.node_monitor_grace_seconds}s",
                "--node-monitor-period=2s",
                *self.tuning.client_flags(),
            ],
        )
        scheduler, scheduler_log = self._spawn(
            "kube-scheduler",
            [
                str(self.binaries.kube_scheduler),
                *common,
                f"--secure-port={p.scheduler}",
                f"--cert-dir={self.state_dir / 'scheduler'}",
                f"--kubeconfig={scheduler_kubeconfig}",
                *self.tuning.client_flags(),
            ],
        )
        kcm_ready, scheduler_ready = await asyncio.gather(
            wait_http_ok(
                "kube-controller-manager",
                f"https://{LOOPBACK}:{p.controller_manager}/healthz",
                kcm,
                kcm_log,
                ssl_context=False,
            ),
            wait_http_ok(
                "kube-scheduler",
                f"https://{LOOPBACK}:{p.scheduler}/healthz",
                scheduler,
                scheduler_log,
                ssl_context=False,
            ),
        )
        timings["kube-controller-manager"], timings["kube-scheduler"] = kcm_ready, scheduler_ready
        timings["default-serviceaccount"] = await self._wait_default_service_account(kcm, kcm_log)
        return timings

    async def _wait_default_service_account(
        self, kcm: "subprocess.Popen[bytes]", kcm_log: Path, limit: float = 60.0
    ) -> float:
        """Pods are refused until the namespace's `default` ServiceAccount exists (its token comes from the
        TokenRequest API when a Pod starts; there are no token Secrets since Kubernetes 1.24)."""
        start = time.monotonic()
        api = await config.new_client_from_config(config_file=str(self.kubeconfig))
        try:
            core = client.CoreV1Api(api)
            while time.monotonic() - start < limit:
                if kcm.poll() is not None:
                    raise StartupError(f"kube-controller-manager exited; log {kcm_log}")
                accounts = await core.list_namespaced_service_account("default")
                if any(a.metadata.name == "default" for a in accounts.items):
                    return time.monotonic() - start
                await asyncio.sleep(0.2)
        finally:
            await api.close()
        raise StartupError(f"no default ServiceAccount after {limit:.0f} s; log {kcm_log}")
