"""FMA's launcher Pod notifier: puts a signature of the launcher's instances on the launcher's own Pod.

FMA's controllers do not watch launchers; they watch Pods. So FMA injects into every launcher Pod the
sidecar `state-change-reflector`, running `python3 /app/launcher_pod_notifier.py` from the launcher's
image, which this module is (`fma_compat` writes that file). As FMA's (0.6.4), it:

- needs POD_NAME and NAMESPACE (the downward API) and reads LAUNCHER_BASE_URL (default
  http://127.0.0.1:8001);
- waits until its Pod's `inference-server` container is Ready, looking every ERROR_BACKOFF_S;
- then every POLL_S lists the launcher's instances (`GET /v2/vllm/instances`, a 5 s timeout) and, when
  their signature changed, patches it into the Pod's `dual-pods.llm-d.ai/vllm-instance-signature`
  annotation — an update event for the controllers' Pod informers;
- after any failure waits ERROR_BACKOFF_S and carries on.

The signature is FMA's byte for byte: the hex SHA-256 of the compact JSON (Python's `json.dumps` with
`separators=(",", ":")`, ASCII-escaped) of the sorted list of `[instance_id, status]` pairs, e.g.
`[["a","running"],["b","stopped"]]`. Unlike FMA's, it starts from the annotation the Pod already has (a
restarted sidecar writes nothing new), sends the launcher's bearer token when one is configured
(LAUNCHER_AUTH_TOKEN_FILE, as the launcher reads it; re-read for every request, so a rotated token is
used), and exits 0 on SIGTERM. It needs a ServiceAccount that may get and patch Pods in its namespace,
as FMA's does.
"""

import asyncio
import hashlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp

from api.keys import INFERENCE_SERVER_CONTAINER
from api.launcher import INSTANCES_PATH
from api.tasks import first_to_finish

log = logging.getLogger("launcher_pod_notifier")

SIGNATURE_ANNOTATION = "dual-pods.llm-d.ai/vllm-instance-signature"
DEFAULT_BASE_URL = "http://127.0.0.1:8001"
POLL_S = 2.0
ERROR_BACKOFF_S = 5.0
LIST_TIMEOUT = aiohttp.ClientTimeout(total=5)
BASE_URL_ENV = "LAUNCHER_BASE_URL"
TOKEN_FILE_ENV = "LAUNCHER_AUTH_TOKEN_FILE"


def canonical_pairs(listing: dict[str, Any]) -> list[tuple[str, str]]:
    """The sorted (instance_id, status) pairs of a `GET /v2/vllm/instances` answer; ValueError if it is not one."""
    instances = listing.get("instances", [])
    if not isinstance(instances, list):
        raise ValueError(f"instances must be a list, got {type(instances).__name__}")
    pairs = []
    for instance in instances:
        if not isinstance(instance, dict):
            raise ValueError(f"unexpected instance entry: {instance!r}")
        pairs.append((str(instance.get("instance_id", "")), str(instance.get("status", ""))))
    return sorted(pairs)


def signature(listing: dict[str, Any]) -> str:
    blob = json.dumps(canonical_pairs(listing), separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def failure(err: Exception) -> str:
    """What went wrong, in a line: an API refusal's status, reason and message (the client's repr of one is only
    `ApiException()`, which hid a missing RBAC grant), otherwise the error's repr."""
    status = getattr(err, "status", None)
    if status is None:
        return repr(err)
    try:
        message = json.loads(getattr(err, "body", None) or "{}").get("message", "")
    except (ValueError, AttributeError):
        message = ""
    return f"the API server answered {status} {getattr(err, 'reason', '') or ''}: {message}".rstrip(": ")


def _required(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"missing required environment variable {name}")
    return value


async def _api() -> Any:
    """The Pod's API server (its ServiceAccount), or the kubeconfig's outside a Pod."""
    from kubernetes_asyncio import client, config

    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        await config.load_kube_config()
    return client.CoreV1Api(client.ApiClient())


class Notifier:
    """`token_file`: the launcher's bearer token (LAUNCHER_AUTH_TOKEN_FILE), None when the launcher wants none."""

    def __init__(
        self, core: Any, http: aiohttp.ClientSession, pod: str, namespace: str, base_url: str, token_file: str | None
    ) -> None:
        self._core = core
        self._http = http
        self._pod = pod
        self._namespace = namespace
        self._url = f"{base_url.rstrip('/')}{INSTANCES_PATH}"
        self._token_file = token_file
        self.published: str | None = None

    async def launcher_ready(self) -> bool:
        """Whether the Pod's inference-server container is Ready; its current signature is taken as published."""
        pod = await self._core.read_namespaced_pod(self._pod, self._namespace)
        self.published = (pod.metadata.annotations or {}).get(SIGNATURE_ANNOTATION)
        statuses = pod.status.container_statuses if pod.status else None
        return any(s.name == INFERENCE_SERVER_CONTAINER and s.ready for s in statuses or [])

    async def listing(self) -> dict[str, Any]:
        headers = {}
        if self._token_file:
            token = await asyncio.to_thread(Path(self._token_file).read_text)
            headers["Authorization"] = f"Bearer {token.strip()}"
        async with self._http.get(self._url, headers=headers, timeout=LIST_TIMEOUT) as response:
            response.raise_for_status()
            listing = await response.json(content_type=None)
        if not isinstance(listing, dict):
            raise ValueError(f"launcher response is not an object: {listing!r}")
        return listing

    async def sync(self) -> None:
        """List once; patch the Pod if the signature changed."""
        current = signature(await self.listing())
        if current != self.published:
            body = {"metadata": {"annotations": {SIGNATURE_ANNOTATION: current}}}
            await self._core.patch_namespaced_pod(self._pod, self._namespace, body)
            self.published = current
            log.info("Published launcher state change", extra={"pod": self._pod, "signature": current})

    async def run(self) -> None:
        waiting = True
        while True:
            try:
                if waiting:
                    if not await self.launcher_ready():
                        log.info("Inference-server container is not ready yet; retrying")
                        await asyncio.sleep(ERROR_BACKOFF_S)
                        continue
                    waiting = False
                    log.info("Inference-server container is ready; starting notifier polling")
                await self.sync()
                await asyncio.sleep(POLL_S)
            except Exception as err:  # the API server or the launcher failed; FMA's notifier carries on too
                log.warning("Notifier failure: %s", failure(err))
                await asyncio.sleep(ERROR_BACKOFF_S)


async def _serve(pod: str, namespace: str, base_url: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    core = await _api()
    async with core.api_client, aiohttp.ClientSession() as http:
        notifier = Notifier(core, http, pod, namespace, base_url, os.environ.get(TOKEN_FILE_ENV))
        await first_to_finish(notifier.run(), stop.wait())


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        pod, namespace = _required("POD_NAME"), _required("NAMESPACE")
    except RuntimeError as err:
        log.error("%s", err)
        return 1
    base_url = os.environ.get(BASE_URL_ENV, DEFAULT_BASE_URL)
    log.info("Launcher Pod notifier started for pod %s in namespace %s against %s", pod, namespace, base_url)
    try:
        asyncio.run(_serve(pod, namespace, base_url))
    except Exception as err:  # e.g. no in-cluster configuration
        log.error("Failed to initialize the Kubernetes client: %r", err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
