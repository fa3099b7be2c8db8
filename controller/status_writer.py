"""Writes the status of our custom resources, for both controllers (each writes the kinds it owns:
the dual-pods controller InferenceServerConfigs, the populator LauncherConfigs and policies).

A replace (PUT) of the status subresource, so emptied errors disappear, and only when the computed status
differs from the one the object carries (conditions.py), so a write does not bring on another.
"""

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api.crds import GROUP, VERSION, CustomResource, Status
from controller.conditions import current

log = logging.getLogger(__name__)


class StatusWrites(Protocol):
    async def write(self, kind: type[CustomResource], obj: Mapping[str, Any], status: Status) -> bool:
        """Give `obj` (as cached) `status` unless it carries it already; True if written."""
        ...


class StatusWriter:
    """`StatusWrites` over kubernetes-asyncio, in one namespace."""

    def __init__(self, objects: client.CustomObjectsApi, namespace: str) -> None:
        self._objects = objects
        self._namespace = namespace

    async def write(self, kind: type[CustomResource], obj: Mapping[str, Any], status: Status) -> bool:
        meta = obj["metadata"]
        if current(type(status), obj) == status:
            return False
        log.info("writing the status of %s %s: errors %s", kind.RESOURCE.kind, meta["name"], status.errors)
        # Without managedFields: the cached ones are trimmed, and the API server keeps its own when none come.
        body = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}, "status": status.to_k8s()}
        try:
            await self._objects.replace_namespaced_custom_object_status(
                GROUP, VERSION, self._namespace, kind.RESOURCE.plural, meta["name"], body
            )
        except ApiException as error:
            if error.status == 404:  # deleted meanwhile: nothing to report on
                return False
            raise  # a conflict too: the queue's back-off retries on a fresher cache
        return True
