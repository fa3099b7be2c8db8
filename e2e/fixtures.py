"""pytest plugin of the loopback cluster (loaded by the root conftest.py).

Fixtures:
    cluster    session-scoped LoopbackCluster (own temp state dir and free ports, never `.cluster`);
               `cluster.kubelet.lose_node(name)` / `.add_node(name, gpus)` / `.publish_gpu_map(ns)`,
               `cluster.container_log(pod, container, previous=False)`, `cluster.state().apiserver_port`.
    api        a kubernetes-asyncio ApiClient with admin rights, closed after the test.
    env        a DualPodsEnv: the namespace set up for dual pods, with the controllers installed by the
               Helm chart (default values), taken down after the test.
    crds       our three CRDs installed in the cluster (once per session).
    namespace  a fresh namespace (its default ServiceAccount ready for Pods), deleted after the test;
               `fresh_namespace(api, label)` makes one for a wider scope (e.g. a module's scenario).
Helpers: `e2e.waiting.wait_for(check, what=..., within=seconds)`.
"""

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from e2e.cluster.cluster import LoopbackCluster, default_nodes
from e2e.crds import install_crds
from e2e.dualpods_env import DualPodsEnv, installed
from e2e.waiting import wait_service_account


@pytest.fixture(scope="session")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LoopbackCluster]:
    """One cluster per test session: two GPU Nodes with 2 GPUs each (gpu-node-1, gpu-node-2)."""
    loopback = LoopbackCluster(tmp_path_factory.mktemp("loopback-cluster") / "state")
    try:
        await loopback.up(default_nodes(), die_with_parent=True)
        yield loopback
    finally:
        loopback.down()


@pytest.fixture
async def crds(cluster: LoopbackCluster, api: client.ApiClient) -> None:
    """Our three CRDs installed and Established in the session's cluster."""
    await install_crds(cluster, api)


@pytest.fixture
async def api(cluster: LoopbackCluster) -> AsyncIterator[client.ApiClient]:
    async with await cluster.api_client() as api_client:
        yield api_client


@asynccontextmanager
async def fresh_namespace(
    api: client.ApiClient, label: str, labels: dict[str, str] | None = None
) -> AsyncIterator[str]:
    """A new namespace named after `label` (with `labels`) whose default ServiceAccount exists; deleted afterwards."""
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:40].strip("-")
    name = f"{slug}-{uuid.uuid4().hex[:5]}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})
    await wait_service_account(core, name)
    try:
        yield name
    finally:
        try:
            await core.delete_namespace(name)
        except ApiException as error:
            if error.status != 404:
                raise


@pytest.fixture
async def namespace(api: client.ApiClient, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """Named after the test; Pods can be created in it at once (its default ServiceAccount exists)."""
    async with fresh_namespace(api, request.node.name) as name:
        yield name


@pytest.fixture
async def env(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> AsyncIterator[DualPodsEnv]:
    async with installed(cluster, api, namespace, tmp_path) as environment:
        yield environment
