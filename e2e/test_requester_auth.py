"""E15: only the controller changes a requester, checked against the loopback cluster's real API server.

A real `python -m requester` reviews tokens with its own ServiceAccount's credentials (a kubeconfig
holding that ServiceAccount's token, as the Pod's files would), and the controller's side
(`RequesterTokens`, `RequesterClient`) gets real tokens from the TokenRequest API. Every refused call
must leave the requester as it was: unready, no proxy target, nothing relayed.
"""

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client

from api.requester import requester_audience
from controller.dualpods.metrics import DualPodsMetrics
from controller.dualpods.requester_client import RequesterClient, RequesterError, admin_port
from controller.dualpods.requester_tokens import RequesterTokens
from controller.http import HttpCaller
from e2e.cluster.cluster import LoopbackCluster
from e2e.cluster.kubeconfig import service_account_token, token_kubeconfig
from e2e.cluster.ports import free_port
from e2e.requester_process import RequesterProcess
from requester.spi_auth import CannotVerify, InClusterApi

CONTROLLER_SA = "rel-fma-controllers"  # trusted by the requester's default (`*-fma-controllers`)
INTRUDER_SA = "intruder"
REVIEWER_SA = "rel-requester"  # may create TokenReviews, as the chart's requester ServiceAccount
BLIND_SA = "blind"  # may not
POD = "req-auth"
WRITES = [("POST", "/v1/become-ready", None), ("POST", "/v1/become-unready", None),
          ("PUT", "/v1/proxy/config", {"address": "127.0.250.1", "port": 9999}),
          ("POST", "/v1/set-log?startPos=0", "hijacked\n")]  # fmt: skip


@dataclass
class Setting:
    cluster: LoopbackCluster
    api: client.ApiClient
    namespace: str
    work_dir: Path

    async def token(self, account: str, audience: str) -> str:
        return await service_account_token(self.api, self.namespace, account, [audience])

    async def kubeconfig_of(self, account: str, server: str | None = None) -> Path:
        """A kubeconfig authenticating as `account` (its ServiceAccount token, as a Pod would have it)."""
        token = await self.token(account, "https://kubernetes.default.svc.cluster.local")
        path = self.work_dir / f"kubeconfig-{account}-{free_port()}"
        return token_kubeconfig(self.cluster.kubeconfig, token, path, server)

    def requester(self, kubeconfig: Path, name: str = POD) -> RequesterProcess:
        return RequesterProcess.start(
            self.work_dir / f"requester-{kubeconfig.name}",
            {"NVIDIA_VISIBLE_DEVICES": "GPU-0", "POD_NAME": name, "POD_NAMESPACE": self.namespace,
             "KUBECONFIG": str(kubeconfig), "REQUESTER_SPI_AUTH": "tokenreview"},
        )  # fmt: skip


@pytest.fixture
async def setting(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> AsyncIterator[Setting]:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    for account in (CONTROLLER_SA, INTRUDER_SA, REVIEWER_SA, BLIND_SA):
        await core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    role = f"{namespace}-tokenreview"
    await rbac.create_cluster_role({"metadata": {"name": role}, "rules": [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]})  # fmt: skip
    await rbac.create_cluster_role_binding({
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": REVIEWER_SA, "namespace": namespace}],
    })  # fmt: skip
    try:
        yield Setting(cluster, api, namespace, tmp_path)
    finally:
        await rbac.delete_cluster_role_binding(role)
        await rbac.delete_cluster_role(role)


@pytest.fixture
async def guarded(setting: Setting) -> AsyncIterator[RequesterProcess]:
    process = setting.requester(await setting.kubeconfig_of(REVIEWER_SA))
    yield process
    assert process.stop() == 0


async def call(method: str, url: str, body: Any = None, token: str | None = None,
               header: str | None = None) -> tuple[int, Any, dict[str, str]]:  # fmt: skip
    headers = {"Authorization": header or f"Bearer {token}"} if token or header else {}
    data = body.encode() if isinstance(body, str) else None
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method, url, headers=headers, json=body if isinstance(body, dict) else None, data=data
        ) as response,
    ):
        text = await response.text()
        parsed = json.loads(text) if response.content_type == "application/json" else text
        return response.status, parsed, dict(response.headers)


async def untouched(requester: RequesterProcess) -> None:
    """Nothing a refused call could have changed did change."""
    assert (await call("GET", f"{requester.probes}/ready"))[0] == 503
    assert (await call("GET", f"{requester.spi}/v1/proxy/config"))[0] == 404
    assert b"hijacked" not in requester.stdout_path.read_bytes()


async def test_writes_without_the_controllers_token_are_refused_and_change_nothing(
    setting: Setting, guarded: RequesterProcess
) -> None:
    audience = requester_audience(setting.namespace, POD)
    intruder = await setting.token(INTRUDER_SA, audience)
    elsewhere = await setting.token(CONTROLLER_SA, requester_audience(setting.namespace, "another-requester"))
    for_the_api_server = await setting.token(CONTROLLER_SA, "https://kubernetes.default.svc.cluster.local")
    attempts: list[tuple[dict[str, str], int, str, str]] = [
        ({}, 401, "Unauthenticated", "needs `Authorization: Bearer <token>`"),
        ({"header": "Basic dXNlcjpwdw=="}, 401, "Unauthenticated", "must be `Bearer <token>`"),
        ({"token": "made-up"}, 401, "Unauthenticated", f"not valid for {audience}"),
        ({"token": elsewhere}, 401, "Unauthenticated", f"not valid for {audience}"),
        ({"token": for_the_api_server}, 401, "Unauthenticated", f"not valid for {audience}"),
        ({"token": intruder}, 403, "Forbidden", f"system:serviceaccount:{setting.namespace}:{INTRUDER_SA} is not"),
    ]
    for method, path, body in WRITES:
        for credential, status, reason, words in attempts:
            got, answer, headers = await call(method, guarded.spi + path, body, **credential)
            assert (got, answer["reason"]) == (status, reason), (method, path, credential, answer)
            assert words in answer["detail"], answer
            assert ("WWW-Authenticate" in headers) == (status == 401)
    await untouched(guarded)
    # Reads stay open, as FMA's.
    assert (await call("GET", f"{guarded.spi}/v1/dual-pods/accelerators"))[:2] == (200, ["GPU-0"])
    assert (await call("GET", f"{guarded.spi}/openapi.json"))[0] == 200


async def test_the_controllers_token_is_accepted_and_cached(setting: Setting, guarded: RequesterProcess) -> None:
    token = await setting.token(CONTROLLER_SA, requester_audience(setting.namespace, POD))
    target = {"address": "127.0.0.1", "port": 8000}
    assert (await call("PUT", f"{guarded.spi}/v1/proxy/config", target, token))[:2] == (
        200, "configured proxy to: 127.0.0.1:8000\n")  # fmt: skip
    assert (await call("POST", f"{guarded.spi}/v1/become-ready", token=token))[:2] == (200, "OK\n")
    assert (await call("GET", f"{guarded.probes}/ready"))[0] == 200
    assert (await call("POST", f"{guarded.spi}/v1/set-log?startPos=%2B0", "relayed\n", token))[0] == 200
    assert guarded.stdout_path.read_bytes() == b"relayed\n"
    logged = [json.loads(line) for line in guarded.stderr_path.read_text().splitlines()]
    reviews = [line for line in logged if line["msg"] == "controller authenticated"]
    assert len(reviews) == 1, "one TokenReview, then the cached answer"
    assert reviews[0]["user"] == f"system:serviceaccount:{setting.namespace}:{CONTROLLER_SA}"


async def test_a_requester_that_cannot_review_tokens_fails_closed(setting: Setting) -> None:
    unreachable = f"https://127.0.0.1:{free_port()}"
    for kubeconfig, words in [
        (await setting.kubeconfig_of(BLIND_SA), "may not create TokenReviews"),
        (await setting.kubeconfig_of(REVIEWER_SA, server=unreachable), "could not be asked"),
    ]:
        process = setting.requester(kubeconfig)
        try:
            token = await setting.token(CONTROLLER_SA, requester_audience(setting.namespace, POD))
            for method, path, body in WRITES:
                status, answer, _ = await call(method, process.spi + path, body, token)
                assert (status, answer["reason"]) == (401, "CannotVerify"), answer
                assert words in answer["detail"], answer
            await untouched(process)
        finally:
            assert process.stop() == 0


async def test_in_a_pod_the_review_uses_the_service_account_files(setting: Setting, tmp_path: Path) -> None:
    """What a requester Pod does (the e2e tests run it in Pods): its ServiceAccount's token and CA files."""
    admin = yaml.safe_load(setting.cluster.kubeconfig.read_text())["clusters"][0]["cluster"]
    host, port = admin["server"].removeprefix("https://").rsplit(":", 1)
    audience = requester_audience(setting.namespace, POD)
    token = await setting.token(CONTROLLER_SA, audience)
    for account in (REVIEWER_SA, BLIND_SA):
        files = tmp_path / account
        files.mkdir()
        (files / "ca.crt").write_bytes(base64.b64decode(admin["certificate-authority-data"]))
        (files / "token").write_text(await setting.token(account, "https://kubernetes.default.svc.cluster.local"))
        api = InClusterApi(host, port, files)
        try:
            if account == REVIEWER_SA:
                review = await api.review(token, audience)
                assert review["authenticated"] is True
                assert review["user"]["username"] == f"system:serviceaccount:{setting.namespace}:{CONTROLLER_SA}"
                assert audience in review["audiences"]
                assert not (await api.review(token, requester_audience(setting.namespace, "other"))).get(
                    "authenticated"
                )
            else:
                with pytest.raises(CannotVerify, match="may not create TokenReviews"):
                    await api.review(token, audience)
        finally:
            await api.close()


def requester_pod(name: str, namespace: str, ip: str, port: int) -> dict[str, Any]:
    annotations = {"dual-pods.llm-d.ai/admin-port": str(port)}
    return {"metadata": {"name": name, "namespace": namespace, "annotations": annotations}, "status": {"podIP": ip}}


@pytest.fixture
async def http_caller() -> AsyncIterator[HttpCaller]:
    from prometheus_client import CollectorRegistry

    async with aiohttp.ClientSession() as session:
        yield HttpCaller(session, DualPodsMetrics(CollectorRegistry()).http_latency_seconds, "test")


async def test_the_controllers_client_gets_tokens_and_reports_refusals(
    setting: Setting, guarded: RequesterProcess, http_caller: HttpCaller
) -> None:
    pod = requester_pod(POD, setting.namespace, guarded.host, guarded.spi_port)
    trusted = RequesterClient(http_caller, RequesterTokens(setting.api, setting.namespace, CONTROLLER_SA))
    await trusted.configure_proxy(pod, "127.0.0.1", 8000, "isc")
    await trusted.relay_readiness(pod, True, "isc")
    assert (await call("GET", f"{guarded.probes}/ready"))[0] == 200
    # A failover: another replica, the same ServiceAccount, its own tokens.
    await RequesterClient(http_caller, RequesterTokens(setting.api, setting.namespace, CONTROLLER_SA)).relay_readiness(
        pod, False, "isc"
    )
    assert (await call("GET", f"{guarded.probes}/ready"))[0] == 503
    untrusted = RequesterClient(http_caller, RequesterTokens(setting.api, setting.namespace, INTRUDER_SA))
    with pytest.raises(RequesterError, match=r"refused the controller's relay_ready call \(403\): .* is not a "):
        await untrusted.relay_readiness(pod, True, "isc")
    without = RequesterClient(http_caller)
    with pytest.raises(RequesterError, match=r"\(401\): this route changes the requester"):
        await without.configure_proxy(pod, "127.0.0.2", 8000, "isc")
    missing = RequesterClient(http_caller, RequesterTokens(setting.api, setting.namespace, "no-such-account"))
    with pytest.raises(RequesterError, match=r"no token to call the requester with: .* 404"):
        await missing.relay_readiness(pod, True, "isc")
    assert (await call("GET", f"{guarded.probes}/ready"))[0] == 503


@pytest.mark.parametrize(
    ("annotation", "port"), [(None, 8081), ("", 8081), (" ", 8081), ("9000", 9000)]
)  # fmt: skip
def test_an_empty_admin_port_annotation_means_8081_as_in_fma(annotation: str | None, port: int) -> None:
    annotations = {} if annotation is None else {"dual-pods.llm-d.ai/admin-port": annotation}
    assert admin_port({"metadata": {"name": "r", "annotations": annotations}}) == port


@pytest.mark.parametrize("annotation", ["http", "0", "65536", "-1", "\uff18\uff10\uff18\uff11"])
def test_a_bad_admin_port_annotation_is_a_requester_error(annotation: str) -> None:
    with pytest.raises(RequesterError, match="is not a TCP port"):
        admin_port({"metadata": {"name": "r", "annotations": {"dual-pods.llm-d.ai/admin-port": annotation}}})
