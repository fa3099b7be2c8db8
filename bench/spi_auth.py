"""What E15's authentication adds to the first state-changing call on a new requester, on a real API server.

Starts a loopback control plane (one node) and, for each of N requesters (after one warm-up), measures
side by side in one run:
  token     the controller's TokenRequest for the requester's audience (`RequesterTokens.headers`)
  review    the requester's TokenReview on a new connection, as a new requester Pod makes it
            (`InClusterApi`, the Pod's ServiceAccount files)
  again     a second review on the open connection (after 30 s a cached answer expires and this is paid)
A call within the 30 s cache and the controller's token reuse pays neither.

Usage: .venv/bin/python bench/spi_auth.py [--requesters 10]
"""

import argparse
import asyncio
import base64
import os
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml
from kubernetes_asyncio import client

from api.requester import requester_audience
from controller.dualpods.requester_tokens import RequesterTokens
from e2e.cluster.cluster import LoopbackCluster, default_nodes
from requester.spi_auth import InClusterApi

NAMESPACE = "default"
CONTROLLER, REQUESTER = "bench-fma-controllers", "bench-requester"
API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"


async def service_account_files(api: client.ApiClient, cluster: LoopbackCluster, where: Path) -> tuple[str, str]:
    """A requester ServiceAccount allowed to review tokens, its files as a Pod has them; the API's host and port."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    for account in (CONTROLLER, REQUESTER):
        await core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": account}})
    await rbac.create_cluster_role_binding({
        "metadata": {"name": "bench-tokenreview"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
        "subjects": [{"kind": "ServiceAccount", "name": REQUESTER, "namespace": NAMESPACE}],
    })  # fmt: skip
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[API_AUDIENCE]))
    answer = await core.create_namespaced_service_account_token(REQUESTER, NAMESPACE, request)
    return _write_account(cluster.kubeconfig, where, answer.status.token)


def _write_account(kubeconfig: Path, where: Path, token: str) -> tuple[str, str]:
    cluster_entry = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]
    where.mkdir()
    (where / "token").write_text(token)
    (where / "ca.crt").write_bytes(base64.b64decode(cluster_entry["certificate-authority-data"]))
    host, port = cluster_entry["server"].removeprefix("https://").rsplit(":", 1)
    return host, port


async def measure(count: int) -> dict[str, list[float]]:
    work = Path(tempfile.mkdtemp(prefix="bench-spi-auth-"))
    cluster = LoopbackCluster(work / "state")
    await cluster.up(default_nodes(1, 1), die_with_parent=True)
    try:
        async with await cluster.api_client() as api:
            host, port = await service_account_files(api, cluster, work / "account")
            tokens = RequesterTokens(api, NAMESPACE, CONTROLLER)
            times: dict[str, list[float]] = {"token": [], "review": [], "again": []}
            for index in range(count + 1):
                audience = requester_audience(NAMESPACE, f"requester-{index}")
                started = time.perf_counter()
                token = (await tokens.headers(NAMESPACE, f"requester-{index}"))["Authorization"].split()[1]
                minted = time.perf_counter()
                reviewer = InClusterApi(host, port, work / "account")
                try:
                    assert (await reviewer.review(token, audience)).get("authenticated")
                    reviewed = time.perf_counter()
                    await reviewer.review(token, audience)
                    again = time.perf_counter()
                finally:
                    await reviewer.close()
                if index:  # the first pays the controller's connection set-up
                    times["token"].append(minted - started)
                    times["review"].append(reviewed - minted)
                    times["again"].append(again - reviewed)
            return times
    finally:
        cluster.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requesters", type=int, default=10)
    args = parser.parse_args()
    times = asyncio.run(measure(args.requesters))
    load = os.getloadavg()[0]
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, {platform.machine()}, load average "
          f"{load:.1f}; {args.requesters} requesters")  # fmt: skip
    print("| step | p50 | max |\n|---|---|---|")
    for step, values in times.items():
        print(f"| {step} | {1000 * statistics.median(values):.1f} ms | {1000 * max(values):.1f} ms |")
    first = [t + r for t, r in zip(times["token"], times["review"], strict=True)]
    print(f"added to a new requester's first state-changing call: p50 {1000 * statistics.median(first):.1f} ms")


if __name__ == "__main__":
    main()
