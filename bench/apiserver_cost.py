"""What one request costs the kube-apiserver, by kind, side by side in one run (issue 26: where its CPU goes).

A loopback cluster (one simulated Node) gets a ConfigMap and a Pod that no Node takes (a nodeSelector that
matches nothing, so no kubelet writes it meanwhile). Then, each kind in turn, N requests go to the API server
8 at a time while its CPU seconds are read from /proc: a GET of the Pod, a merge patch of the ConfigMap's
data, a strategic merge patch of one Pod annotation (what the controllers send), and the same Pod patch
by the admin and by a ServiceAccount named as the controllers' are (`*-fma-controllers`, with a token), then
both again with the chart's ValidatingAdmissionPolicies installed: the admin's patches are judged in full,
the ServiceAccount's are exempt by the policies' match condition. Printed: milliseconds of API-server CPU
per request, and the ratios of the Pod patch to the ConfigMap patch, and of each Pod patch with the
policies to the same client's without.

Usage: .venv/bin/python bench/apiserver_cost.py [--requests 1000]
"""

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil
import yaml
from kubernetes_asyncio import client

from e2e.cluster.cluster import LoopbackCluster, default_nodes

NAMESPACE = "default"
POLICIES = Path(__file__).resolve().parent.parent / "config" / "validating-admission-policies"
CONCURRENCY = 8
STRATEGIC = "application/strategic-merge-patch+json"


async def cost(apiserver: psutil.Process, requests: int, one: Callable[[int], Awaitable[object]]) -> float:
    """Milliseconds of API-server CPU per request, over `requests` calls of `one`."""
    slots = asyncio.Semaphore(CONCURRENCY)

    async def limited(i: int) -> None:
        async with slots:
            await one(i)

    before = apiserver.cpu_times()
    async with asyncio.TaskGroup() as group:
        for i in range(requests):
            group.create_task(limited(i))
    after = apiserver.cpu_times()
    return 1000 * (after.user + after.system - before.user - before.system) / requests


def pod_patcher(api: client.ApiClient) -> Callable[[int], Awaitable[object]]:
    """A strategic merge patch of one annotation of the Pod, as the controllers send, through `api`."""
    core = client.CoreV1Api(api)

    async def patch(i: int) -> object:
        body = {"metadata": {"annotations": {"n": str(i)}}}
        return await core.patch_namespaced_pod("cost", NAMESPACE, body, _content_type=STRATEGIC)

    return patch


async def install_policies(api: client.ApiClient) -> None:
    admission = client.AdmissionregistrationV1Api(api)
    for path in sorted(POLICIES.glob("*.yaml")):  # a binding may name a policy made after it
        policy = yaml.safe_load(path.read_text())
        if policy["kind"] == "ValidatingAdmissionPolicy":
            await admission.create_validating_admission_policy(policy)
        else:
            await admission.create_validating_admission_policy_binding(policy)
    await asyncio.sleep(2)  # the admission plugin loads them from its informer


async def measure(cluster: LoopbackCluster, requests: int) -> dict[str, float]:
    apiserver = psutil.Process(cluster.pids()["kube-apiserver"])
    async with await cluster.api_client() as api:
        core = client.CoreV1Api(api)
        await core.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": "cost"}, "data": {"n": "0"}})
        pod = {
            "metadata": {"name": "cost", "annotations": {"n": "0"}},
            "spec": {"nodeSelector": {"bench": "nowhere"}, "containers": [{"name": "c", "image": "none"}]},
        }
        await core.create_namespaced_pod(NAMESPACE, pod)
        async with await controllers_client(cluster, api) as controllers:
            found = {
                "GET Pod": await cost(apiserver, requests, lambda i: core.read_namespaced_pod("cost", NAMESPACE)),
                "PATCH ConfigMap": await cost(
                    apiserver,
                    requests,
                    lambda i: core.patch_namespaced_config_map("cost", NAMESPACE, {"data": {"n": str(i)}}),
                ),
                "PATCH Pod": await cost(apiserver, requests, pod_patcher(api)),
                "PATCH Pod, as controllers": await cost(apiserver, requests, pod_patcher(controllers)),
            }
            await install_policies(api)
            found["PATCH Pod, policies judged"] = await cost(apiserver, requests, pod_patcher(api))
            found["PATCH Pod, controllers exempt"] = await cost(apiserver, requests, pod_patcher(controllers))
    return found


async def controllers_client(cluster: LoopbackCluster, api: client.ApiClient) -> client.ApiClient:
    """A client with the token of a ServiceAccount the policies exempt (`*-fma-controllers`), allowed to patch
    Pods."""
    name = "bench-fma-controllers"
    await client.CoreV1Api(api).create_namespaced_service_account(NAMESPACE, {"metadata": {"name": name}})
    rbac = client.RbacAuthorizationV1Api(api)
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}
    await rbac.create_namespaced_role(NAMESPACE, {"metadata": {"name": name}, "rules": [rule]})
    subject = {"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}
    role = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    await rbac.create_namespaced_role_binding(
        NAMESPACE, {"metadata": {"name": name}, "subjects": [subject], "roleRef": role}
    )
    token = await client.CoreV1Api(api).create_namespaced_service_account_token(name, NAMESPACE, {"spec": {}})
    settings = client.Configuration()
    settings.host = cluster.state().apiserver_url
    settings.ssl_ca_cert = str(cluster.state_dir / "pki" / "ca.crt")
    settings.api_key = {"BearerToken": f"Bearer {token.status.token}"}
    return client.ApiClient(settings)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dualpods-apiserver-cost-") as state:
        cluster = LoopbackCluster(Path(state) / "cluster")
        started = time.monotonic()
        await cluster.up(default_nodes(1, 1), die_with_parent=True, simulated=True)
        try:
            print(f"cluster up in {time.monotonic() - started:.1f} s; {args.requests} requests of each kind")
            found = await measure(cluster, args.requests)
        finally:
            cluster.down()
    for kind, ms in found.items():
        print(f"  {kind:28} {ms:6.2f} ms of kube-apiserver CPU per request")
    ratios = {
        "pod_patch_over_configmap_patch": found["PATCH Pod"] / found["PATCH ConfigMap"],
        "judged_over_plain_pod_patch": found["PATCH Pod, policies judged"] / found["PATCH Pod"],
        "exempt_over_plain_pod_patch": found["PATCH Pod, controllers exempt"] / found["PATCH Pod, as controllers"],
    }
    print(json.dumps({name: round(ratio, 2) for name, ratio in ratios.items()}))


if __name__ == "__main__":
    asyncio.run(main())
