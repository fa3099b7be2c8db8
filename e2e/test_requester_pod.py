"""A server-requesting Pod on the loopback cluster runs the real requester under FMA's image name.

The kubelet assigns it a fake GPU through NVIDIA_VISIBLE_DEVICES; the requester reports exactly
that GPU on its SPI, and the readiness it is told over the SPI becomes the Pod's Ready condition. The
readiness calls carry a controller ServiceAccount's token for this Pod's audience (E15), which the
requester checks with a TokenReview using its Pod's own ServiceAccount files, as in any cluster.
"""

import asyncio
import ipaddress
import json
from typing import Any

import aiohttp
import psutil
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api.requester import bearer, requester_audience
from e2e.cluster.cluster import LoopbackCluster, pod_is_ready
from e2e.waiting import wait_for

IMAGE = "ghcr.io/llm-d-incubation/llm-d-fast-model-actuation/requester:v0.6.0"
SPI_PORT, PROBES_PORT = 8081, 8080
GRACE_SECONDS = 30  # far longer than the requester needs: a prompt exit shows SIGTERM was handled


def requester_pod(name: str, period_seconds: int = 1, env: tuple[dict[str, str], ...] = ()) -> dict[str, Any]:
    """As in FMA's examples (one GPU, the /ready probe), plus POD_IP so it binds the Pod's own address."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": GRACE_SECONDS,
            "containers": [
                {
                    "name": "inference-server",
                    "image": IMAGE,
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}, *env],
                    "ports": [
                        {"name": "probes", "containerPort": PROBES_PORT},
                        {"name": "spi", "containerPort": SPI_PORT},
                    ],
                    "readinessProbe": {
                        "httpGet": {"path": "/ready", "port": PROBES_PORT},
                        "periodSeconds": period_seconds,
                    },
                    "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "200m", "memory": "250Mi"}},
                }
            ],
        },
    }


async def http(method: str, url: str, token: str | None = None) -> tuple[int, str]:
    headers = bearer(token) if token else None
    async with aiohttp.ClientSession() as session, session.request(method, url, headers=headers) as response:
        return response.status, await response.text()


async def controller_token(api: client.ApiClient, namespace: str, pod: str) -> str:
    """What the chart sets up for E15, by hand: a controller ServiceAccount (trusted by the requester's
    default, `*-fma-controllers`) with a token for the Pod's audience, and TokenReviews allowed to the
    namespace's default ServiceAccount, which the Pod runs as."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": "test-fma-controllers"}})
    await rbac.create_cluster_role_binding({
        "metadata": {"name": f"{namespace}-tokenreview"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
    })  # fmt: skip
    spec = client.V1TokenRequestSpec(audiences=[requester_audience(namespace, pod)], expiration_seconds=600)
    answer = await core.create_namespaced_service_account_token(
        "test-fma-controllers", namespace, client.AuthenticationV1TokenRequest(spec=spec)
    )
    return str(answer.status.token)


async def unready_probes(spi: str) -> float:
    """How many times the kubelet's probe has been answered 503, from the requester's own metrics."""
    _, text = await http("GET", f"{spi}/metrics")
    sample = 'dualpods_requester_http_requests_total{code="503",method="GET",route="/ready",server="probes"} '
    return sum(float(line.removeprefix(sample)) for line in text.splitlines() if line.startswith(sample))


async def running(core: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod | None:
    pod = await core.read_namespaced_pod(name, namespace)
    return pod if pod.status.phase == "Running" and pod.status.pod_ip else None


async def test_requester_pod_reports_its_gpu_and_relays_readiness(
    api: client.ApiClient, namespace: str, cluster: LoopbackCluster
) -> None:
    core = client.CoreV1Api(api)
    token = await controller_token(api, namespace, "requester")
    await core.create_namespaced_pod(namespace, requester_pod("requester"))

    pod = await wait_for(lambda: running(core, namespace, "requester"), what="the requester Pod to be Running",
                         within=60)  # fmt: skip
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network("127.0.0.0/8")
    spi = f"http://{pod.status.pod_ip}:{SPI_PORT}"

    # Running but not Ready: the kubelet has probed /ready and been told 503.
    await wait_for(lambda: unready_probes(spi), what="the kubelet to probe /ready", within=30)
    assert not pod_is_ready(await core.read_namespaced_pod("requester", namespace))

    # The SPI lists exactly the GPU the kubelet assigned, which is one of its node's GPUs.
    status, body = await http("GET", f"{spi}/v1/dual-pods/accelerators")
    assert status == 200, body
    uuids = json.loads(body)
    container = psutil.Process(int(pod.status.container_statuses[0].container_id.removeprefix("loopback://")))
    assert uuids == [container.environ()["NVIDIA_VISIBLE_DEVICES"]]
    node_gpus = {node.name: node.gpus for node in await cluster.kubelet.nodes()}[pod.spec.node_name]
    assert uuids[0] in node_gpus
    status, body = await http("GET", f"{spi}/v1/dual-pods/accelerator-memory-usage")
    assert (status, json.loads(body)) == (200, {uuids[0]: 0})

    # Only the controller may tell it: without the token, nothing changes.
    status, body = await http("POST", f"{spi}/v1/become-ready")
    assert (status, json.loads(body)["reason"]) == (401, "Unauthenticated")

    # The readiness told over the SPI becomes the Pod's Ready condition, both ways.
    assert await http("POST", f"{spi}/v1/become-ready", token) == (200, "OK\n")

    async def pod_ready(wanted: bool) -> bool:
        return pod_is_ready(await core.read_namespaced_pod("requester", namespace)) == wanted

    await wait_for(lambda: pod_ready(True), what="the Pod to become Ready", within=30)
    assert await http("POST", f"{spi}/v1/become-unready", token) == (200, "OK\n")
    await wait_for(lambda: pod_ready(False), what="the Pod to become unready", within=30)

    # Its log lines carry the requester's name (the Pod's host name, as POD_NAME is not set).
    log_lines = [json.loads(line) for line in cluster.container_log(pod, "inference-server").splitlines()]
    assert {line["requester"] for line in log_lines} == {"requester"}
    assert any(line["msg"] == "got GPU UUIDs" and line["uuids"] == uuids for line in log_lines)

    # Deleting the Pod ends the requester at SIGTERM, long before the grace period is over.
    await core.delete_namespaced_pod("requester", namespace)

    async def gone() -> bool:
        try:
            await core.read_namespaced_pod("requester", namespace)
        except ApiException as error:
            return error.status == 404
        return False

    await wait_for(gone, what="the requester Pod to be deleted", within=GRACE_SECONDS / 3)
    await client.RbacAuthorizationV1Api(api).delete_cluster_role_binding(f"{namespace}-tokenreview")


async def test_a_write_to_the_pod_after_its_readiness_makes_it_ready_at_once(
    api: client.ApiClient, namespace: str
) -> None:
    """A kubelet probes a container that is not ready whenever it syncs its Pod, as on any change to the
    Pod's metadata: the controller's write that follows its become-ready call (the requester's status)
    makes the Pod Ready then, not at the probe's next period (30 s here)."""
    core = client.CoreV1Api(api)
    open_spi = ({"name": "REQUESTER_SPI_AUTH", "value": "none"},)
    await core.create_namespaced_pod(namespace, requester_pod("slow-probe", period_seconds=30, env=open_spi))
    pod = await wait_for(lambda: running(core, namespace, "slow-probe"), what="the requester Pod to be Running",
                         within=60)  # fmt: skip
    spi = f"http://{pod.status.pod_ip}:{SPI_PORT}"

    async def listening() -> bool:
        try:
            return (await http("POST", f"{spi}/v1/become-ready"))[0] == 200
        except aiohttp.ClientConnectionError:
            return False

    await wait_for(listening, what="the requester to take its become-ready", within=30, interval=0.1)
    await asyncio.sleep(2)
    assert not pod_is_ready(await core.read_namespaced_pod("slow-probe", namespace)), "no sync, no probe yet"
    await core.patch_namespaced_pod("slow-probe", namespace, {"metadata": {"annotations": {"told": "ready"}}})

    async def ready() -> bool:
        return pod_is_ready(await core.read_namespaced_pod("slow-probe", namespace))

    # A sync probes at once (a fraction of a second on a quiet machine); 5 s tells it from the 30 s period's probe,
    # which a bound nearer the period would let pass for it.
    await wait_for(ready, what="the Pod to become Ready after the write", within=5, interval=0.1)
    await core.delete_namespaced_pod("slow-probe", namespace, grace_period_seconds=0)
