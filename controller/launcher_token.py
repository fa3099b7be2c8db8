"""The launchers' bearer-token Secret, made by the controllers at start-up when it does not exist.

The chart renders no token (random data in a template changes with every `helm template` and GitOps sync, and
every change would lock running launchers out), so the first controller to start creates the Secret: owner-less,
so that no restart or upgrade of a controller deletes it, and without the release's `app.kubernetes.io/instance`
label, so that GitOps tools do not take it for an object of theirs to prune. Both controllers do this (either
may run alone); when they race, the loser reads what the winner made. An existing Secret is used as it is.

RBAC: `get` on this one name and `create` on Secrets (Kubernetes cannot restrict `create` to a name).
"""

import base64
import datetime
import logging
import os
import secrets
from typing import Final

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api.keys import PREFIX

log = logging.getLogger(__name__)

KEY: Final = "token"
TOKEN_BYTES: Final = 36  # 288 random bits, 48 URL-safe characters
GENERATED_ANNOTATION: Final = PREFIX + "generated-by"


def new_secret(name: str) -> dict[str, object]:
    """A Secret holding a fresh random token, annotated with who made it and when."""
    maker = os.environ.get("POD_NAME") or "a dualpods controller"
    made_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/name": "dualpods",
                "app.kubernetes.io/component": "launcher-token",
                "app.kubernetes.io/managed-by": "dualpods-controllers",
            },
            "annotations": {
                GENERATED_ANNOTATION: f"{maker} at {made_at}, because the Secret did not exist. Edit `token` to "
                "rotate it (launchers follow without restarts); delete it and the next controller start makes a "
                "new one.",
            },
        },
        "type": "Opaque",
        "data": {KEY: base64.b64encode(secrets.token_urlsafe(TOKEN_BYTES).encode()).decode()},
    }


def token_of(secret: client.V1Secret) -> str:
    encoded = (secret.data or {}).get(KEY)
    return base64.b64decode(encoded).decode().strip() if encoded else ""


async def ensure_launcher_token(api: client.ApiClient, namespace: str, name: str) -> str:
    """The token of Secret `name`, which is created first if it does not exist."""
    core = client.CoreV1Api(api)
    try:
        existing = await core.read_namespaced_secret(name, namespace)
    except ApiException as error:
        if error.status != 404:
            raise
    else:
        token = token_of(existing)
        if not token:
            log.error("the Secret %s/%s has no key %r: launchers will refuse every call", namespace, name, KEY)
        return token
    try:
        created = await core.create_namespaced_secret(namespace, new_secret(name))
    except ApiException as error:
        if error.status != 409:
            raise
        return token_of(await core.read_namespaced_secret(name, namespace))  # the other controller was first
    log.info("created the launcher token Secret %s/%s", namespace, name)
    return token_of(created)
