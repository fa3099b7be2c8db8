"""Kubernetes Events from the controllers: what a user sees in `kubectl describe`, and the one object logger
(`tell`, `warn`, `note`) through which every controller says something about an object: the log line (a
Warning at WARNING, else INFO, with the object and the running pass's context) and the Event on it, so a
warning is never in only one of them.
"""

import logging
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from kubernetes_asyncio import client

from kube.client import API_FAILURES

log = logging.getLogger(__name__)


class EventSink(Protocol):
    """Where Events go (EventRecorder, or a test's fake)."""

    async def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None: ...


EventType = Literal["Normal", "Warning"]


async def tell(sink: EventSink, obj: dict[str, Any], type_: EventType, reason: str, message: str) -> None:
    """Log what is said about `obj` (within the running pass's log context) and record it as an Event on it."""
    level = logging.WARNING if type_ == "Warning" else logging.INFO
    kind, name = obj.get("kind") or "Pod", obj["metadata"]["name"]
    log.log(level, "%s %s: %s: %s", kind, name, reason, message, extra={"reason": reason, "object": f"{kind}/{name}"})
    await sink.record(obj, type_, reason, message)


async def warn(sink: EventSink, obj: dict[str, Any], reason: str, message: str) -> None:
    await tell(sink, obj, "Warning", reason, message)


async def note(sink: EventSink, obj: dict[str, Any], reason: str, message: str) -> None:
    await tell(sink, obj, "Normal", reason, message)


class EventRecorder:
    def __init__(self, api: client.ApiClient, component: str) -> None:
        self._core = client.CoreV1Api(api)
        self._component = component

    async def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Best effort: a failure to record is logged, never raised into the caller's work."""
        meta = obj["metadata"]
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}.", namespace=meta["namespace"]),
            involved_object=client.V1ObjectReference(
                api_version=obj.get("apiVersion", "v1"),
                kind=obj.get("kind", "Pod"),
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta.get("uid"),
                resource_version=meta.get("resourceVersion"),
            ),
            reason=reason,
            message=message,
            type=type_,
            source=client.V1EventSource(component=self._component),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            await self._core.create_namespaced_event(meta["namespace"], event)
        except API_FAILURES as err:
            log.warning("could not record event %s on %s: %s", reason, meta["name"], err)
