"""Kubeconfig files for the cluster's clients, self-contained (certificates embedded)."""

import base64
from pathlib import Path

import yaml

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
