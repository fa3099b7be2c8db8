"""The chart as platform teams install it, on the loopback cluster (issue 14): `helm test`; the launcher token
made at run time, not rendered; a tenant install with namespace rights only (`crds.install=false`,
`rbac.clusterScoped=false`) after the admin's part, followed by a model swap; and what `kubectl` shows of an
InferenceServerConfig."""

import base64
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api.crdgen import DEFAULT_OUT_DIR as CRD_DIR
from api.crds import GROUP, VERSION, LauncherConfig
from controller.launcher_token import GENERATED_ANNOTATION
from e2e.chart import DUAL_PODS, POPULATOR
from e2e.cluster.cluster import LoopbackCluster
from e2e.cluster.kubeconfig import service_account_token, token_kubeconfig
from e2e.crds import kubectl
from e2e.dualpods_env import RESTRICTED_NAMESPACE, DualPodsEnv, installed
from e2e.fixtures import fresh_namespace
from e2e.waiting import wait_for

TENANT_VALUES = ["crds.install=false", "rbac.clusterScoped=false"]
TENANT_ROLES = CRD_DIR.parent / "tenant" / "cluster-roles.yaml"
RS = "requesters"


async def helm_test(env: DualPodsEnv) -> str:
    """`helm test` of the release, and the test Pod's log (read from the kubelet's files: `helm test --logs` would
    ask a kubelet API on the Node's name, which nothing here serves)."""
    await env.controllers.helm("test", env.controllers.release)
    pod = await env.core.read_namespaced_pod(f"{env.controllers.release}-test", env.namespace)
    assert pod.status.phase == "Succeeded"
    return env.cluster.container_log(pod, "test")


async def launcher_token_secret(env: DualPodsEnv) -> client.V1Secret:
    name = f"{env.controllers.release}-launcher-token"
    return await wait_for(lambda: _secret(env, name), what=f"the Secret {name}", within=30)


async def _secret(env: DualPodsEnv, name: str) -> client.V1Secret | None:
    try:
        return await env.core.read_namespaced_secret(name, env.namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


async def test_helm_test_passes_and_the_launcher_token_is_made_at_run_time(env: DualPodsEnv) -> None:
    out = await helm_test(env)
    assert "all checks passed" in out, out
    assert "dual-pods-controller: 1 Ready replica(s) checked" in out

    secret = await launcher_token_secret(env)
    meta = secret.metadata
    assert GENERATED_ANNOTATION in meta.annotations, "made by a controller, saying so"
    assert not meta.owner_references, "no owner whose deletion would take it along"
    assert "app.kubernetes.io/instance" not in (meta.labels or {}), "no GitOps tool takes it for its own"
    assert len(base64.b64decode(secret.data["token"])) >= 32
    manifest = await env.controllers.helm("get", "manifest", env.controllers.release)
    assert "kind: Secret" not in manifest, "the release holds no token: every render is the same"


async def test_the_controller_keeps_an_existing_token_secret(env: DualPodsEnv) -> None:
    """A restarted controller finds the Secret and uses it as it is (a new token would lock launchers out)."""
    before = await launcher_token_secret(env)
    await env.controllers.restart(DUAL_PODS)
    after = await launcher_token_secret(env)
    assert (after.metadata.uid, after.data) == (before.metadata.uid, before.data)


@pytest.fixture
async def tenant(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> AsyncIterator[Path]:
    """The admin's part of a tenant install (docs/install.md, "Tenant installs"), done with kubectl as written
    there; a kubeconfig of the tenant: a ServiceAccount with `admin` and `dualpods-installer` in `namespace` only."""
    release = "dualpods"
    bindings = [f"{namespace}-{release}-node-view", f"{namespace}-{release}-requester-tokenreview"]
    await kubectl(cluster, "apply", "--server-side", "-f", str(CRD_DIR), "-f", str(TENANT_ROLES))
    await kubectl(cluster, "-n", namespace, "create", "serviceaccount", "tenant")
    for role in ("admin", "dualpods-installer"):
        await kubectl(cluster, "-n", namespace, "create", "rolebinding", f"tenant-{role}", f"--clusterrole={role}",
                      f"--serviceaccount={namespace}:tenant")  # fmt: skip
    await kubectl(cluster, "create", "clusterrolebinding", bindings[0], "--clusterrole=dualpods-node-view",
                  f"--serviceaccount={namespace}:{release}-fma-controllers")  # fmt: skip
    requesters = [f"--serviceaccount={namespace}:{account}" for account in (f"{release}-requester", "default")]
    await kubectl(
        cluster, "create", "clusterrolebinding", bindings[1], "--clusterrole=dualpods-tokenreview", *requesters
    )
    try:
        token = await service_account_token(api, namespace, "tenant")
        yield token_kubeconfig(cluster.kubeconfig, token, tmp_path / "kubeconfig-tenant")
    finally:
        await kubectl(cluster, "delete", "clusterrolebinding", *bindings, "--ignore-not-found")


async def test_a_tenant_installs_with_namespace_rights_only_and_models_swap(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path, tenant: Path
) -> None:
    env = DualPodsEnv(cluster, api, namespace, tmp_path)
    try:
        await env.setup()
        # The tenant may not even read CRDs: the chart must not need to.
        denied = await kubectl(cluster, "--kubeconfig", str(tenant), "auth", "can-i", "get",
                               "customresourcedefinitions", check=False)  # fmt: skip
        assert denied.strip() == "no"
        env.controllers.kubeconfig = tenant
        await env.controllers.install(*TENANT_VALUES)
        manifest = await env.controllers.helm("get", "manifest", env.controllers.release)
        assert not [kind for kind in ("ClusterRole", "CustomResourceDefinition") if f"kind: {kind}" in manifest]

        await env.create_launcher_config("lc", max_instances=2, launcher_args=["--stand-in"])
        await env.create_population_policy("keep-one", "lc", count=1)  # the launcher outlives its requesters
        await env.create_isc("isc-a", "lc", port=8005, options="--model a")
        await env.create_isc("isc-b", "lc", port=8006, options="--model b")
        node = (await cluster.kubelet.nodes())[0]  # one GPU of one node, so the swap happens on one launcher
        await env.create_requesters(RS, "isc-a", node=node.name, gpu=sorted(node.gpus)[0])
        first = await env.ready_requester(RS)
        launcher = await env.launcher_of(first)
        await env.scale(RS, 0)
        await env.wait_gone(RS)
        await env.wait_launchers_unbound(within=60)  # its instance asleep
        await env.set_requester_isc(RS, "isc-b")
        await env.scale(RS, 1)
        second = await env.ready_requester(RS)
        assert (await env.launcher_of(second))["metadata"]["name"] == launcher["metadata"]["name"]
        served = {i["options"].split()[1] for i in (await env.instances(launcher))["instances"]}
        assert served == {"a", "b"}, "the first model sleeps beside the second on the same launcher"
        assert "all checks passed" in await helm_test(env)
    finally:
        await env.teardown()


async def test_kubectl_waits_for_a_served_isc_and_shows_a_missing_launcher_config(env: DualPodsEnv) -> None:
    await env.create_launcher_config("lc", max_instances=1, launcher_args=["--stand-in"])
    await env.create_isc("served", "lc", port=8005, options="--model a")
    await env.create_isc("orphan", "no-such-lc", port=8006, options="--model b")
    await env.create_requesters(RS, "served")
    namespace = ["-n", env.namespace]
    await kubectl(env.cluster, *namespace, "wait", "--for=condition=Ready", "isc/served", "--timeout=60s")
    await env.create_requesters("orphans", "orphan")

    async def error_shown() -> str:
        row = await kubectl(env.cluster, *namespace, "get", "isc", "orphan", "--no-headers")
        return row if row.count("no-such-lc") >= 2 else ""  # its LAUNCHER CONFIG, and the ERROR naming it

    row = await wait_for(error_shown, what="the missing LauncherConfig in `kubectl get isc`", within=60)
    assert row.split()[3] == "False"  # READY
    served = (await kubectl(env.cluster, *namespace, "get", "isc", "served", "--no-headers")).split()
    assert served[3:5] == ["True", "1"], served  # READY, REQUESTERS


async def test_the_chart_installs_and_serves_where_pod_security_restricted_is_enforced(
    cluster: LoopbackCluster, api: client.ApiClient, tmp_path: Path
) -> None:
    """The controllers, the `helm test` Pod, launchers and requesters all meet "restricted"; the API server's Pod
    Security admission refuses a Pod that does not, so the namespace's label is enforced, not decoration."""
    async with fresh_namespace(api, "pod-security-restricted", RESTRICTED_NAMESPACE) as namespace:
        plain = {"metadata": {"name": "plain"}, "spec": {"containers": [{"name": "c", "image": "registry.example/x"}]}}
        with pytest.raises(ApiException) as refused:
            await client.CoreV1Api(api).create_namespaced_pod(namespace, plain)
        assert refused.value.status == 403
        assert 'violates PodSecurity "restricted:latest"' in json.loads(refused.value.body or "{}")["message"]
        async with installed(cluster, api, namespace, tmp_path) as env:
            await env.create_launcher_config("lc", max_instances=1, launcher_args=["--stand-in"])
            await env.create_isc("isc", "lc", port=8005, options="--model a")
            await env.create_requesters(RS, "isc")
            requester = await env.ready_requester(RS)
            launcher = await env.launcher_of(requester)
            assert launcher["spec"]["securityContext"]["runAsNonRoot"] is True
            assert "all checks passed" in await helm_test(env)


async def test_the_controllers_log_and_count_the_api_servers_warnings(env: DualPodsEnv) -> None:
    """A launcher template with a deprecated node label: the API server warns on each launcher the populator
    creates; the populator logs the warning once and counts every one."""
    await env.create_launcher_config("lc", max_instances=1, launcher_args=["--stand-in"])
    deprecated = {"spec": {"podTemplate": {"spec": {"nodeSelector": {"beta.kubernetes.io/arch": "amd64"}}}}}
    await env.objects.patch_namespaced_custom_object(
        GROUP, VERSION, env.namespace, LauncherConfig.RESOURCE.plural, "lc", deprecated,
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    await env.create_population_policy("one-each", "lc", count=1)
    nodes = await env.cluster.kubelet.nodes()

    async def counted() -> float:
        found = re.search(r'^dualpods_kube_api_warnings_total\{method="POST"\} (\S+)$',
                          await env.controllers.metrics(POPULATOR), re.MULTILINE)  # fmt: skip
        return float(found[1]) if found else 0.0

    assert await wait_for(lambda: _at_least(counted, len(nodes)), what="a warning per launcher created", within=60)
    warning = f"the API server warned about POST /api/v1/namespaces/{env.namespace}/pods: spec.nodeSelector"
    log = await env.controllers.log_tail(POPULATOR, lines=400)
    assert log.count(warning) == 1, log
    assert "[beta.kubernetes.io/arch]: deprecated" in log


async def _at_least(count: Callable[[], Awaitable[float]], wanted: int) -> bool:
    return await count() >= wanted
