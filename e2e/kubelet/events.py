"""Kubelet Events on Pods (Started, Killing, BackOff, Unhealthy, FailedMount, ...), as `kubectl describe` shows them."""

import logging
import uuid

from kubernetes_asyncio import client

from e2e.kubelet.apierrors import API_ERRORS, describe
from e2e.kubelet.status import now, timestamp
from kube.client import answer_of

log = logging.getLogger(__name__)


class EventRecorder:
    """Best effort, as in a real kubelet: a failed Event write is logged, never raised."""

    def __init__(self, core: client.CoreV1Api, node: str) -> None:
        self._core = core
        self._node = node

    async def record(
        self, pod: client.V1Pod, kind: str, reason: str, message: str, container: str | None = None
    ) -> None:
        meta = pod.metadata
        log.info("%s/%s %s %s: %s", meta.namespace, meta.name, kind, reason, message)
        stamp = timestamp(now())
        body = {
            "metadata": {"name": f"{meta.name}.{uuid.uuid4().hex[:16]}", "namespace": meta.namespace},
            "involvedObject": {
                "kind": "Pod",
                "apiVersion": "v1",
                "namespace": meta.namespace,
                "name": meta.name,
                "uid": meta.uid,
                **({"fieldPath": f"spec.containers{{{container}}}"} if container else {}),
            },
            "type": kind,
            "reason": reason,
            "message": message,
            "source": {"component": "kubelet", "host": self._node},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "reportingComponent": "kubelet",
            "reportingInstance": self._node,
        }
        try:
            await answer_of(self._core.create_namespaced_event(meta.namespace, body, _preload_content=False))
        except API_ERRORS as error:
            log.warning("could not record event %s on %s/%s: %s", reason, meta.namespace, meta.name, describe(error))
