"""The dual-pods end-to-end setting: CRDs, gpu-map, the controllers installed by the Helm chart, and
the objects a model-variant deployer creates."""

import base64
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from api.crds import GROUP, VERSION, CustomResource, InferenceServerConfig, LauncherConfig, LauncherPopulationPolicy
from api.keys import DEFAULT_ADMIN_PORT, LAUNCHER_PORT
from controller import pods
from controller.launcher_template import DOWNWARD_ENV
from e2e.chart import InstalledControllers
from e2e.cluster.cluster import LoopbackCluster
from e2e.crds import install_crds
from e2e.dra import claim_gpus
from e2e.waiting import wait_for
from requester.probes import DEFAULT_PORT as DEFAULT_PROBES_PORT
from scripts.build_cache import cache_root
from scripts.images import catalogue

Obj = dict[str, Any]
MODELS_MOUNT = "/models"
LAUNCHER_HOME = "/home/dualpods"  # the images' HOME
PROXY_PORT = 8082  # the requester's request proxy (E7)
NO_ADMISSION_POLICIES = "admissionPolicies.enabled=false"  # what a second release in one cluster sets
# Pod Security "restricted" (what the demo's and the chart e2e's namespaces enforce) of every launcher and requester
# here. The process runtime cannot change users or capabilities (e2e/kubelet/security.py); the images run as their
# non-root user.
RESTRICTED_POD: Obj = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER: Obj = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# The real launcher image, run as config/examples/ runs it: its root read-only, writing only to volumes.
READ_ONLY_CONTAINER: Obj = {**RESTRICTED_CONTAINER, "readOnlyRootFilesystem": True}
# The namespace labels of Pod Security admission: the level it enforces, and the one it only warns about.
ENFORCE, WARN = "pod-security.kubernetes.io/enforce", "pod-security.kubernetes.io/warn"
RESTRICTED_NAMESPACE: dict[str, str] = {ENFORCE: "restricted"}


@dataclass(frozen=True)
class Images:
    """What the components run from. The image map's names (PROCESSES) run this checkout as local processes;
    the references `make images` builds run those images as real containers (the kubelet's OCI runtime),
    which see the host's model cache only where launchers mount it (`models_dir`, read-only)."""

    launcher: str
    requester: str
    controller: str | None = None  # repository:tag; None: the chart's default
    models_dir: Path | None = None
    requester_env: tuple[tuple[str, str], ...] = ()  # set in every requester container
    # The requester's ports: FMA's binds all addresses, so on this shared host each Pod of it needs ports no other
    # process listens on (its SPI is found through the admin-port annotation, as FMA's controller does).
    requester_probes_port: int = DEFAULT_PROBES_PORT
    requester_spi_port: int = DEFAULT_ADMIN_PORT

    def chart_values(self) -> list[str]:
        if self.controller is None:
            return []
        repository, tag = self.controller.rsplit(":", 1)
        return [f"image.repository={repository}", f"image.tag={tag}"]

    def model(self, path: Path) -> Path:
        """Where launchers see the model the host has at `path`."""
        if self.models_dir is None:
            return path
        return Path(MODELS_MOUNT) / path.relative_to(self.models_dir)


PROCESSES = Images(launcher="dualpods/launcher", requester="dualpods/requester")


def built_images() -> Images:
    """The images `make images` builds, launchers seeing the tiny models' cache at /models."""
    return Images(
        launcher=catalogue.LAUNCHER_CPU.reference,
        requester=catalogue.REQUESTER.reference,
        controller=catalogue.CONTROLLER.reference,
        models_dir=cache_root() / "models",
    )


class DualPodsEnv:
    def __init__(
        self,
        cluster: LoopbackCluster,
        api: client.ApiClient,
        namespace: str,
        work_dir: Path,
        images: Images = PROCESSES,
    ) -> None:
        self.cluster = cluster
        self.images = images
        self.api = api
        self.namespace = namespace
        self.work_dir = work_dir
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.objects = client.CustomObjectsApi(api)
        self.controllers = InstalledControllers(cluster, api, namespace, work_dir)

    async def setup(self, gpu_map: bool = True) -> None:
        """`gpu_map` False: the gpu-map ConfigMap is left for the test to publish (FMA's direct-mode case 1)."""
        await install_crds(self.cluster, self.api)
        if gpu_map:
            await self.cluster.kubelet.publish_gpu_map(self.namespace)
        # Launchers read the gpu-map ConfigMap with their Pod's ServiceAccount (--mock-gpus).
        rbac = client.RbacAuthorizationV1Api(self.api)
        await rbac.create_namespaced_role(self.namespace, {
            "metadata": {"name": "read-configmaps"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
        })  # fmt: skip
        await rbac.create_namespaced_role_binding(self.namespace, {
            "metadata": {"name": "read-configmaps"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-configmaps"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": self.namespace}],
        })  # fmt: skip

    async def teardown(self) -> None:
        """Take everything down in the order that leaves no finalizer behind: the requester sets first,
        while the controllers still run to unbind them, then the controllers, then whatever they could
        not finish (a crashed test) gets its dual-pods finalizers stripped, as an admin would."""
        await self.apps.delete_collection_namespaced_replica_set(self.namespace)
        with contextlib.suppress(TimeoutError):  # what is left gets its finalizers stripped below
            await wait_for(self._no_requesters, what="every requester gone", within=60)
        await self.controllers.uninstall()
        for pod in await self.pods():
            finalizers = pods.finalizers(pod)
            kept = [f for f in finalizers if not f.startswith(keys.PREFIX)]
            if kept != finalizers:
                patch = {
                    "metadata": {"finalizers": kept or None, "resourceVersion": pod["metadata"]["resourceVersion"]}
                }
                await self.core.patch_namespaced_pod(pod["metadata"]["name"], self.namespace, patch)

    async def _no_requesters(self) -> bool:
        return not [p for p in await self.pods() if pods.is_requester(p)]

    # ----- objects a model-variant deployer creates

    async def create_launcher_config(
        self,
        name: str,
        max_instances: int,
        launcher_args: list[str],
        image: str | None = None,
        env: dict[str, str] | None = None,
        verify_wakes: bool | None = None,
        restricted: bool = True,
        claim_template: str | None = None,
        sleeper_budget: Obj | None = None,
        command: list[str] | None = None,
    ) -> None:
        """`command`: the container's command, with `launcher_args` its whole args (FMA's launcher image has no
        entrypoint; POD_IP is in its env for `--host $(POD_IP)`); `image`: another than the launcher's (a broken
        or foreign one, for fault tests); `env`: the
        launcher container's environment (e.g. LAUNCHER_FMA_ONLY=true); `verify_wakes`: its
        `spec.verifyWakes` (None: left out, the default); `restricted` False: no securityContext (a template as
        FMA's e2e writes it); `claim_template`: the launcher sees the GPUs of a claim made from this
        ResourceClaimTemplate (an admin-access one, on DRA Nodes); `sleeper_budget`: its `spec.sleeperBudget`."""
        container: Obj = {
            "name": keys.INFERENCE_SERVER_CONTAINER,
            "image": image or self.images.launcher,
            "args": ["--mock-gpus", "--stop-grace-seconds", "3", *launcher_args],
            "ports": [{"containerPort": LAUNCHER_PORT}],
        }
        downward = dict(DOWNWARD_ENV)
        if command is not None:
            container |= {"command": command, "args": launcher_args}
            downward["POD_IP"] = "status.podIP"
        # Where the launcher finds its GPUs in the gpu-map (--mock-gpus), written into the template as FMA's e2e
        # does: FMA's controllers add nothing (ours add them when they are missing).
        container["env"] = [{"name": n, "valueFrom": {"fieldRef": {"fieldPath": f}}} for n, f in downward.items()]
        container["env"] += [{"name": k, "value": v} for k, v in (env or {}).items()]
        pod_spec: Obj = {"terminationGracePeriodSeconds": 5, "containers": [container]}
        if restricted:
            container["securityContext"] = RESTRICTED_CONTAINER
            pod_spec["securityContext"] = RESTRICTED_POD
        if self.images.models_dir is not None:
            # The real launcher image, run as config/examples/ runs it: its root read-only, writing only to HOME's
            # and /tmp's emptyDirs (only the models' hostPath is this machine's own, which "restricted" forbids).
            container["securityContext"] = READ_ONLY_CONTAINER
            pod_spec["volumes"] = [
                {"name": "models", "hostPath": {"path": str(self.images.models_dir)}},
                {"name": "home", "emptyDir": {}},
                {"name": "tmp", "emptyDir": {}},
            ]
            container["volumeMounts"] = [
                {"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True},
                {"name": "home", "mountPath": LAUNCHER_HOME},
                {"name": "tmp", "mountPath": "/tmp"},
            ]
        if claim_template is not None:
            claim_gpus(pod_spec, claim_template)
        spec: Obj = {
            "maxInstances": max_instances,
            "podTemplate": {"metadata": {"labels": {"from-launcher-config": "yes"}}, "spec": pod_spec},
        }
        if verify_wakes is not None:
            spec["verifyWakes"] = verify_wakes
        if sleeper_budget is not None:
            spec["sleeperBudget"] = sleeper_budget
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LauncherConfig", "metadata": {"name": name}, "spec": spec}
        await self._create(LauncherConfig, body)

    async def create_isc(
        self,
        name: str,
        launcher_config: str,
        port: int,
        options: str,
        *,
        isc_annotations: dict[str, str] | None = None,
        lora_adapters: list[dict[str, str]] | None = None,
        warm_pool: Obj | None = None,
        **server: Any,
    ) -> None:
        """An ISC; `isc_annotations` go on the object (e.g. the runtime, E4), `server` into modelServerConfig
        (e.g. its routing `labels` and `annotations`)."""
        spec: Obj = {
            "launcherConfigName": launcher_config,
            "modelServerConfig": {"port": port, "options": options, **server},
        }
        if lora_adapters is not None:
            spec["loraAdapters"] = lora_adapters
        if warm_pool is not None:
            spec["warmPool"] = warm_pool
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "InferenceServerConfig",
            "metadata": {"name": name, "annotations": isc_annotations or {}},
            "spec": spec,
        }
        await self._create(InferenceServerConfig, body)

    async def create_population_policy(
        self, name: str, launcher_config: str, count: int, selector: Obj | None = None
    ) -> None:
        """Selecting the Nodes by `selector` (an enhancedNodeSelector), by default the GPU Nodes by their label."""
        selector = selector or {"labelSelector": {"matchLabels": {"nvidia.com/gpu.present": "true"}}}
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "LauncherPopulationPolicy",
            "metadata": {"name": name},
            "spec": {
                "enhancedNodeSelector": selector,
                "countForLauncher": [{"launcherConfigName": launcher_config, "launcherCount": count}],
            },
        }
        await self._create(LauncherPopulationPolicy, body)

    async def patch_isc(self, name: str, server_config: Obj | None = None, **spec: Any) -> None:
        """Merge-patch an ISC's modelServerConfig and/or other spec fields (e.g. loraAdapters=...)."""
        if server_config is not None:
            spec["modelServerConfig"] = server_config
        plural = InferenceServerConfig.RESOURCE.plural
        await self.objects.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, plural, name, {"spec": spec},
            _content_type="application/merge-patch+json",
        )  # fmt: skip

    async def _create(self, kind: type[CustomResource], body: Obj) -> None:
        await self.objects.create_namespaced_custom_object(GROUP, VERSION, self.namespace, kind.RESOURCE.plural, body)

    async def create_requesters(
        self,
        name: str,
        isc: str,
        replicas: int = 1,
        gpus: int = 1,
        node: str | None = None,
        gpu: str | None = None,
        probe_period: int = 1,
        claim_template: str | None = None,
    ) -> None:
        """A ReplicaSet of server-requesting Pods asking for launchers' instances of `isc`, as FMA users write
        them. `gpu` pins one GPU the way FMA's tests do: no GPU requested from the scheduler, the UUID given in
        NVIDIA_VISIBLE_DEVICES. `probe_period`: of their readiness probe, in seconds. `claim_template`: the
        GPUs come from a ResourceClaim made from this ResourceClaimTemplate (DRA), not `nvidia.com/gpu`."""
        annotations = {keys.INFERENCE_SERVER_CONFIG_ANNOTATION: isc}
        await self._create_requester_set(name, annotations, replicas, gpus, node, gpu, probe_period, claim_template)

    async def create_direct_requesters(
        self, name: str, patch: str, replicas: int = 1, gpus: int = 1, node: str | None = None, gpu: str | None = None
    ) -> None:
        """The same, asking for direct providers made with the server patch `patch`."""
        await self._create_requester_set(name, {keys.SERVER_PATCH_ANNOTATION: patch}, replicas, gpus, node, gpu)

    async def _create_requester_set(
        self,
        name: str,
        annotations: dict[str, str],
        replicas: int,
        gpus: int,
        node: str | None,
        gpu: str | None,
        probe_period: int = 1,
        claim_template: str | None = None,
    ) -> None:
        spec = _requester_spec(self.images, gpus, node, gpu, probe_period)
        if self.images.requester_spi_port != DEFAULT_ADMIN_PORT:
            annotations = {**annotations, keys.ADMIN_PORT_ANNOTATION: str(self.images.requester_spi_port)}
        if claim_template is not None:
            claim_gpus(spec, claim_template)
        await self.apps.create_namespaced_replica_set(self.namespace, {
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}, "annotations": annotations},
                    "spec": spec,
                },
            },
        })  # fmt: skip

    async def pin_requesters(self, replica_set: str, node: str, gpu: str) -> None:
        """Pin the set's next requesters to one GPU of one node (FMA's case "GPU pin")."""
        spec = _requester_spec(self.images, 0, node, gpu)
        await self.apps.patch_namespaced_replica_set(
            replica_set, self.namespace, {"spec": {"template": {"spec": spec}}},
            _content_type="application/strategic-merge-patch+json",
        )  # fmt: skip

    async def scale(self, replica_set: str, replicas: int) -> None:
        await self.apps.patch_namespaced_replica_set_scale(
            replica_set, self.namespace, {"spec": {"replicas": replicas}}
        )

    async def set_requester_isc(self, replica_set: str, isc: str) -> None:
        await self.apps.patch_namespaced_replica_set(replica_set, self.namespace, {
            "spec": {"template": {"metadata": {"annotations": {keys.INFERENCE_SERVER_CONFIG_ANNOTATION: isc}}}}
        })  # fmt: skip

    # ----- reading what happened

    async def pods(self, label_selector: str | None = None) -> list[Obj]:
        response = await self.core.list_namespaced_pod(self.namespace, label_selector=label_selector)
        result: list[Obj] = self.api.sanitize_for_serialization(response.items)
        return result

    async def requesters(self, replica_set: str) -> list[Obj]:
        return [p for p in await self.pods(f"app={replica_set}") if not pods.is_deleting(p)]

    async def launchers(self) -> list[Obj]:
        return await self.pods(f"{keys.COMPONENT_LABEL}={keys.LAUNCHER_COMPONENT}")

    async def providers(self) -> list[Obj]:
        """Direct providers (bound or asleep) that are not being deleted."""
        found = await self.pods()
        return [p for p in found if pods.is_direct_provider(p) and not pods.is_deleting(p)]

    async def ready_requester(self, replica_set: str, within: float = 120) -> Obj:
        """The one live requester of the set, once it is Ready and bound."""

        async def ready() -> Obj:
            found = await self.requesters(replica_set)
            if len(found) == 1 and pods.is_ready(found[0]) and keys.DUAL_LABEL in pods.labels(found[0]):
                return found[0]
            return {}

        try:
            result: Obj = await wait_for(ready, what=f"a Ready, bound requester of {replica_set}", within=within)
        except TimeoutError as err:
            raise TimeoutError(f"{err}\n{await self.controllers.log_tail()}") from None
        return result

    async def launcher_of(self, requester: Obj) -> Obj:
        return await self.pod(requester["metadata"]["labels"][keys.DUAL_LABEL])

    async def pod(self, name: str) -> Obj:
        pod: Obj = self.api.sanitize_for_serialization(await self.core.read_namespaced_pod(name, self.namespace))
        return pod

    async def launcher_api(self, launcher: Obj, method: str, path: str) -> Any:
        """Call a launcher's API as the controllers do, with the chart's bearer token (E9)."""
        secret = await self.core.read_namespaced_secret(f"{self.controllers.release}-launcher-token", self.namespace)
        token = base64.b64decode(secret.data["token"]).decode()
        url = f"http://{launcher['status']['podIP']}:{LAUNCHER_PORT}{path}"
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession() as session, session.request(method, url, headers=headers) as response:
            assert response.status < 300, f"{method} {path}: {response.status} {await response.text()}"
            return await response.json() if response.content_type == "application/json" else await response.text()

    async def instances(self, launcher: Obj) -> dict[str, Any]:
        listing: dict[str, Any] = await self.launcher_api(launcher, "GET", "/v2/vllm/instances")
        return listing

    async def sleepers(self, launcher: Obj) -> list[dict[str, Any]]:
        """The launcher's sleeping instances, as its API lists them."""
        listing = await self.instances(launcher)
        return [i for i in listing["instances"] if i["sleeping"]]

    async def wait_launchers_unbound(self, within: float, interval: float = 0.1) -> None:
        """Until no launcher is bound (their instances asleep)."""

        async def unbound() -> bool:
            return all(pods.binding(p) is None for p in await self.launchers())

        await wait_for(unbound, what="every launcher unbound", within=within, interval=interval)

    async def wait_launchers_ready(self, count: int, within: float = 600) -> None:
        """Until `count` launchers exist and all are Ready: a population policy's launchers preload vLLM (a
        CPU's worth of seconds each), which would land on whatever is timed meanwhile."""

        async def ready() -> bool:
            launchers = await self.launchers()
            return len(launchers) >= count and all(pods.is_ready(launcher) for launcher in launchers)

        await wait_for(ready, what=f"{count} Ready launchers", within=within, interval=0.2)

    async def wait_gone(self, replica_set: str, within: float = 60) -> None:
        await wait_for(
            lambda: self._none_left(replica_set), what=f"all requesters of {replica_set} gone", within=within
        )

    async def wait_deleting(self, replica_set: str, within: float) -> None:
        """Until every requester of `replica_set` is being deleted (or gone)."""

        async def deleting() -> bool:
            return all(pods.is_deleting(p) for p in await self.pods(f"app={replica_set}"))

        await wait_for(deleting, what=f"all requesters of {replica_set} being deleted", within=within)

    async def _none_left(self, replica_set: str) -> bool:
        return not await self.pods(f"app={replica_set}")

    async def delete_pod(self, name: str) -> None:
        try:
            await self.core.delete_namespaced_pod(name, self.namespace)
        except ApiException as err:
            if err.status != 404:
                raise


async def through_proxy(requester: Obj, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """Ask the model server through the requester Pod's proxy (E7), as a client of the requester would."""
    url = f"http://{requester['status']['podIP']}:{PROXY_PORT}{path}"
    async with aiohttp.ClientSession() as http, http.request("POST" if body else "GET", url, json=body) as response:
        answer: dict[str, Any] = await response.json()
        assert response.status == 200, answer
        return answer


async def proxy_chat(requester: Obj, model: str) -> str:
    """A short greedy chat through the requester's proxy; the answer's text."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0}
    reply = await through_proxy(requester, "/v1/chat/completions", body)
    return str(reply["choices"][0]["message"]["content"])


def _requester_spec(images: Images, gpus: int, node: str | None, gpu: str | None, probe_period: int = 1) -> Obj:
    """A requester Pod's spec; `gpu` pins that GPU (0 GPUs asked for from the scheduler)."""
    count = "0" if gpu else str(gpus)
    probes = images.requester_probes_port
    container: Obj = {
        "name": keys.INFERENCE_SERVER_CONTAINER,
        "image": images.requester,
        "resources": {"limits": {"nvidia.com/gpu": count}, "requests": {"nvidia.com/gpu": count}},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": probes}, "periodSeconds": probe_period},
        "securityContext": RESTRICTED_CONTAINER,
    }
    env = dict(images.requester_env)
    # FMA's variables, read by both requesters
    if probes != DEFAULT_PROBES_PORT or images.requester_spi_port != DEFAULT_ADMIN_PORT:
        env |= {"PROBES_PORT": str(probes), "SPI_PORT": str(images.requester_spi_port)}
    if gpu:
        env["NVIDIA_VISIBLE_DEVICES"] = gpu
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    spec: Obj = {"terminationGracePeriodSeconds": 5, "containers": [container], "securityContext": RESTRICTED_POD}
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return spec


@contextlib.asynccontextmanager
async def installed(
    cluster: LoopbackCluster,
    api: client.ApiClient,
    namespace: str,
    work_dir: Path,
    *chart_values: str,
    gpu_map: bool = True,
    images: Images = PROCESSES,
) -> AsyncIterator[DualPodsEnv]:
    """A namespace set up for dual pods with the controllers installed by the chart (`--set` values),
    taken down afterwards in the order that leaves no finalizer behind (also when installing failed).

    The admission policies are off unless `chart_values` turn them on: they are cluster-scoped, so one release
    per cluster holds them (docs/install.md), and the tests that edit the controllers' metadata as a user would
    (faults, migrations) would be refused by them; e2e/test_admission_policies.py tests them."""
    env = DualPodsEnv(cluster, api, namespace, work_dir, images)
    try:
        await env.setup(gpu_map)
        await env.controllers.install(*images.chart_values(), NO_ADMISSION_POLICIES, *chart_values)
        yield env
    finally:
        await env.teardown()
