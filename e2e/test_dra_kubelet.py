"""The loopback kubelet plays NVIDIA's GPU DRA driver, and the real scheduler allocates (no controllers here).

A DRA Node advertises no `nvidia.com/gpu`: its GPUs are devices of a ResourceSlice (driver and class
`gpu.nvidia.com`), and a requester Pod asks for them through a ResourceClaim made from a template. The
scheduler allocates both GPUs of the Node to one claim for two; the kubelet starts the Pod with what NVIDIA's
driver injects through CDI (`NVIDIA_VISIBLE_DEVICES=void`), and the requester reports exactly the allocated
GPUs. A second Pod's claim is not allocated while the first holds them, and gets one once it is gone.
"""

import json
from typing import Any

import psutil
from kubernetes_asyncio import client

from e2e.cluster.cluster import LoopbackCluster
from e2e.dra import added_node, claim_gpus, create_claim_template
from e2e.kubelet.dra import DEVICE_CLASS, DRIVER
from e2e.kubelet.gpus import RESOURCE
from e2e.test_requester_pod import SPI_PORT, http, requester_pod
from e2e.waiting import wait_for, wait_pod_gone

NODE = "dra-node-1"


def claimed_requester(name: str, template: str) -> dict[str, Any]:
    pod = requester_pod(name)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    claim_gpus(pod["spec"], template)
    return pod


async def test_dra_node_publishes_its_gpus_and_serves_claims_exclusively(
    api: client.ApiClient, namespace: str, cluster: LoopbackCluster
) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    async with added_node(cluster, NODE, "dra") as node:
        assert RESOURCE not in (await core.read_node(NODE)).status.allocatable
        assert (await resource.read_device_class(DEVICE_CLASS)).metadata.name == DEVICE_CLASS
        slices = (await resource.list_resource_slice(field_selector=f"spec.nodeName={NODE}")).items
        assert [(s.spec.driver, s.spec.pool.name) for s in slices] == [(DRIVER, NODE)]
        published = {d.attributes["uuid"].string: d.name for d in slices[0].spec.devices}
        assert set(published) == set(node.gpus)

        await create_claim_template(api, namespace, "two-gpus", 2)
        await create_claim_template(api, namespace, "one-gpu", 1)
        await core.create_namespaced_pod(namespace, claimed_requester("first", "two-gpus"))

        async def running(name: str) -> client.V1Pod | None:
            pod = await core.read_namespaced_pod(name, namespace)
            return pod if pod.status.phase == "Running" and pod.status.pod_ip else None

        first = await wait_for(lambda: running("first"), what="the first requester to run", within=60)
        claim_name = first.status.resource_claim_statuses[0].resource_claim_name
        claim = await resource.read_namespaced_resource_claim(claim_name, namespace)
        allocated = sorted(r.device for r in claim.status.allocation.devices.results)
        assert allocated == ["gpu-0", "gpu-1"]

        # The requester reports the two GPUs NVIDIA's driver injected, though NVIDIA_VISIBLE_DEVICES names none.
        spi = f"http://{first.status.pod_ip}:{SPI_PORT}"
        status, body = await wait_for(
            lambda: http("GET", f"{spi}/v1/dual-pods/accelerators"), what="the SPI", within=30
        )
        assert status == 200, body
        assert sorted(json.loads(body)) == sorted(published)
        container = psutil.Process(int(first.status.container_statuses[0].container_id.removeprefix("loopback://")))
        assert container.environ()["NVIDIA_VISIBLE_DEVICES"] == "void"

        # No GPU is free: a second requester's claim is not allocated while the first holds both.
        await core.create_namespaced_pod(namespace, claimed_requester("second", "one-gpu"))

        async def unschedulable() -> bool:
            pod = await core.read_namespaced_pod("second", namespace)
            scheduled = next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)
            return scheduled is not None and scheduled.status == "False"

        await wait_for(unschedulable, what="the second requester to be unschedulable", within=30)
        assert not (await core.read_namespaced_pod("second", namespace)).spec.node_name

        await core.delete_namespaced_pod("first", namespace)

        await wait_pod_gone(core, namespace, "first", within=60)
        second = await wait_for(lambda: running("second"), what="the second requester to run", within=90)
        status, body = await wait_for(
            lambda: http("GET", f"http://{second.status.pod_ip}:{SPI_PORT}/v1/dual-pods/accelerators"),
            what="the second SPI",
            within=30,
        )
        (uuid,) = json.loads(body)
        assert uuid in published
