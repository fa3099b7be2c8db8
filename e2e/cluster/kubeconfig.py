"""Kubeconfig files for the cluster's clients, self-contained (certificates embedded)."""

import base64
from pathlib import Path

import yaml
from kubernetes_asyncio.client import (
    ApiClient,
    AuthenticationV1TokenRequest,
    CoreV1Api,
    V1TokenRequestSpec,
)

from e2e.cluster.pki import KeyPair

CONTEXT = "loopback"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, ca_cert: Path, client: KeyPair) -> Path:
    """Write a kubeconfig that authenticates to `server` with `client`'s certificate."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)}}],
        "users": [
            {
                "name": CONTEXT,
                "user": {
                    "client-certificate-data": _b64(client.cert),
                    "client-key-data": _b64(client.key),
                },
            }
        ],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT}}],
        "current-context": CONTEXT,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


async def service_account_token(
    api: ApiClient, namespace: str, account: str, audiences: list[str] | None = None
) -> str:
    """A short-lived token of ServiceAccount `account` (for `audiences`, the API server's when None)."""
    spec = V1TokenRequestSpec(audiences=audiences, expiration_seconds=3600)
    request = AuthenticationV1TokenRequest(spec=spec)
    answer = await CoreV1Api(api).create_namespaced_service_account_token(account, namespace, request)
    return str(answer.status.token)


def token_kubeconfig(admin_kubeconfig: Path, token: str, path: Path, server: str | None = None) -> Path:
    """A kubeconfig at `path` for the admin's cluster (or `server`) that authenticates with `token`, as a Pod of
    that ServiceAccount would: RBAC and admission see that identity."""
    config = yaml.safe_load(admin_kubeconfig.read_text())
    if server is not None:
        config["clusters"][0]["cluster"]["server"] = server
    config["users"] = [{"name": CONTEXT, "user": {"token": token}}]
    config["contexts"] = [{"name": CONTEXT, "context": {"cluster": config["clusters"][0]["name"], "user": CONTEXT}}]
    config["current-context"] = CONTEXT
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
