"""E11: two replicas of the dual-pods controller; one leads through a Lease, the other takes over
when the leader's Pod goes away. (A leader that crashes and is restarted in place keeps its identity,
and so its lease; the chaos test covers crashes.)"""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from e2e.chart import DUAL_PODS
from e2e.cluster.cluster import LoopbackCluster
from e2e.dualpods_env import DualPodsEnv, installed
from e2e.waiting import wait_for

RS = "ha"
LEASE = "dualpods-dual-pods"


@pytest.fixture
async def env(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> AsyncIterator[DualPodsEnv]:
    async with installed(cluster, api, namespace, tmp_path, "dualPodsController.replicas=2") as environment:
        yield environment


async def test_the_follower_takes_over_when_the_leader_dies(env: DualPodsEnv) -> None:
    replicas = await env.controllers.wait_running(DUAL_PODS, replicas=2)
    names = {p.metadata.name for p in replicas}
    leases = client.CoordinationV1Api(env.api)

    async def holder() -> str:
        lease = await leases.read_namespaced_lease(LEASE, env.namespace)
        return str(lease.spec.holder_identity or "")

    leader = await wait_for(holder, what="a leader", within=30)
    assert leader in names

    await env.create_launcher_config("lc", max_instances=2, launcher_args=["--stand-in"])
    await env.create_population_policy("keep-one", "lc", count=1)
    await env.create_isc("isc-a", "lc", port=8005, options="--model a")
    await env.create_isc("isc-b", "lc", port=8006, options="--model b")
    await env.create_requesters(RS, "isc-a")
    await env.ready_requester(RS)

    # The leader's Pod goes away (a drain, a rollout): it hands the lease over as it stops.
    await env.core.delete_namespaced_pod(leader, env.namespace)

    async def new_leader() -> str:
        current = await holder()
        return current if current and current != leader else ""

    # Whichever replica wins (the follower, or the Pod replacing the old leader), it is quick: the old
    # leader released the lease instead of letting it expire.
    await wait_for(new_leader, what="another replica to take the lease", within=20)

    await env.scale(RS, 0)
    await env.wait_gone(RS)
    await env.set_requester_isc(RS, "isc-b")
    await env.scale(RS, 1)
    await env.ready_requester(RS)
