"""The populator's calls to the API server, each logged as it starts (FMA's DR-20): launcher Pods,
and their Events (the status of LauncherConfigs and policies goes through controller/status_writer.py).

`LauncherApi` is what the reconcile of a key needs; unit tests give it an in-memory fake.
"""

import logging
from enum import Enum
from typing import Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from controller.launcher_template import Pod
from controller.populator.key import LauncherKey, selector
from kube import events
from kube.events import EventSink
from kube.informer import decode

log = logging.getLogger(__name__)

COMPONENT = "launcher-populator"


class DeleteOutcome(Enum):
    DELETED = "deleted"
    GONE = "gone"
    """It no longer existed."""
    CONFLICT = "conflict"
    """It changed since it was read (it may have been bound): it was not deleted."""


class LauncherApi(Protocol):
    async def list_launchers(self, key: LauncherKey) -> list[Pod]:
        """The key's launcher Pods as the API server has them now."""

    async def create(self, pod: Pod) -> Pod:
        """Create the Pod; returns it as created (with its name and UID)."""

    async def delete(self, pod: Pod) -> DeleteOutcome:
        """Delete the Pod if it is still the version that was read (UID and resourceVersion)."""

    async def set_stuck_label(self, pod: Pod, stuck: bool) -> bool:
        """Set or remove the launcher-stuck label; False when the Pod no longer exists."""

    async def warn(self, pod: Pod, reason: str, message: str) -> None:
        """Record a Warning Event about the Pod (best effort)."""

    async def note(self, pod: Pod, reason: str, message: str) -> None:
        """Record a Normal Event about the Pod (best effort)."""


class KubeLauncherApi:
    """`LauncherApi` over kubernetes-asyncio, in one namespace."""

    def __init__(self, core: client.CoreV1Api, events: EventSink, namespace: str) -> None:
        self._core = core
        self._events = events
        self._namespace = namespace

    async def list_launchers(self, key: LauncherKey) -> list[Pod]:
        log.debug("listing the launcher Pods of %s from the API server", key)
        response = await self._core.list_namespaced_pod(
            self._namespace, label_selector=selector(key), _preload_content=False
        )
        async with response:
            body = await response.read()
        if response.status != 200:
            raise ApiException(status=response.status, reason=body.decode(errors="replace")[:500])
        items: list[Pod] = decode(body).get("items") or []
        return items

    async def create(self, pod: Pod) -> Pod:
        node = pod["metadata"]["labels"].get(keys.NODE_NAME_LABEL)
        log.info("creating a launcher Pod %s* on node %s", pod["metadata"]["generateName"], node)
        # The answer as JSON, not kubernetes-asyncio's model: decoding it cost more than the call itself.
        response = await self._core.create_namespaced_pod(self._namespace, pod, _preload_content=False)
        async with response:
            body = await response.read()
        if response.status >= 300:
            raise ApiException(status=response.status, reason=body.decode(errors="replace")[:500])
        created: Pod = decode(body)
        log.info("created launcher Pod %s on node %s", created["metadata"]["name"], node)
        return created

    async def delete(self, pod: Pod) -> DeleteOutcome:
        meta = pod["metadata"]
        log.info(
            "deleting launcher Pod %s (uid %s, resourceVersion %s)", meta["name"], meta["uid"], meta["resourceVersion"]
        )
        preconditions = {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]}
        try:
            await self._core.delete_namespaced_pod(meta["name"], self._namespace, body={"preconditions": preconditions})
        except ApiException as error:
            if error.status == 404:
                return DeleteOutcome.GONE
            if error.status == 409:
                log.info("launcher Pod %s changed since it was read; not deleted", meta["name"])
                return DeleteOutcome.CONFLICT
            raise
        return DeleteOutcome.DELETED

    async def set_stuck_label(self, pod: Pod, stuck: bool) -> bool:
        name = pod["metadata"]["name"]
        log.info("%s label %s on launcher Pod %s", "setting" if stuck else "removing", keys.LAUNCHER_STUCK_LABEL, name)
        patch = {"metadata": {"labels": {keys.LAUNCHER_STUCK_LABEL: "true" if stuck else None}}}
        try:
            await self._core.patch_namespaced_pod(
                name, self._namespace, patch, _content_type="application/merge-patch+json"
            )
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    async def warn(self, pod: Pod, reason: str, message: str) -> None:
        await events.warn(self._events, pod, reason, message)

    async def note(self, pod: Pod, reason: str, message: str) -> None:
        await events.note(self._events, pod, reason, message)
