"""The ConfigMaps and Secrets a Node's Pods use, watched as a kubelet watches them instead of read per Pod.

A kubelet's default change-detection strategy for them (`configMapAndSecretChangeDetectionStrategy: Watch`)
keeps one watch per object its Pods reference (a field selector on the object's name), serves volumes and
environment variables from that cache, and stops the watch once no Pod of the Node references the object.
Reading them per Pod instead cost every Pod start a GET of `kube-root-ca.crt` (the projected service-account
volume that admission gives every Pod): 1,000 GETs per wave of 1,000 requesters (`bench/scale.py`).

A reference is taken by the Pod's uid when a volume or variable first names the object, and released when
the Pod's worker ends. The first read of an object waits for its watch's first list; an object the list
does not hold reads as absent (a volume that is not optional reports FailedMount and is retried, and the
watch delivers the object when it is created).
"""

import asyncio
import base64
import contextlib
import functools
from dataclasses import dataclass, field

from kubernetes_asyncio import client

from e2e.kubelet.env import Fetch
from kube.informer import Informer, Obj

FIRST_LIST_S = 10.0  # a read waits this long for its watch's first list, then fails (and is retried)

Reference = tuple[str, str, str]  # (kind: "configmap" or "secret", namespace, name)


@dataclass
class _Watched:
    informer: Informer
    task: "asyncio.Task[None]"
    pods: set[str] = field(default_factory=set)  # uids of the Pods that reference the object


def _data(kind: str, obj: Obj | None) -> dict[str, str] | None:
    """A ConfigMap's or Secret's data, decoded (a ConfigMap's text data wins over binary data of the same key)."""
    if obj is None:
        return None
    if kind == "secret":
        return _decoded(obj.get("data"))
    return {**_decoded(obj.get("binaryData")), **(obj.get("data") or {})}


def _decoded(values: dict[str, str] | None) -> dict[str, str]:
    return {key: base64.b64decode(value).decode(errors="replace") for key, value in (values or {}).items()}


class ObjectWatches:
    def __init__(self, core: client.CoreV1Api) -> None:
        self._core = core
        self._watched: dict[Reference, _Watched] = {}

    @property
    def watched(self) -> set[Reference]:
        return set(self._watched)

    def fetch_for(self, pod_uid: str) -> Fetch:
        """How the Pod `pod_uid` reads a ConfigMap or Secret: the data, or None when it does not exist."""
        return functools.partial(self._read, pod_uid)

    async def _read(self, pod_uid: str, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        watched = self._watch((kind, namespace, name))
        watched.pods.add(pod_uid)
        async with asyncio.timeout(FIRST_LIST_S):
            await watched.informer.synced.wait()
        return _data(kind, watched.informer.get(f"{namespace}/{name}"))

    def _watch(self, reference: Reference) -> _Watched:
        watched = self._watched.get(reference)
        if watched is None:
            kind, namespace, name = reference
            lister = self._core.list_namespaced_secret if kind == "secret" else self._core.list_namespaced_config_map
            informer = Informer(
                f"{kind} {namespace}/{name}",
                functools.partial(lister, namespace),
                field_selector=f"metadata.name={name}",
            )
            task = asyncio.create_task(informer.run(), name=f"watch {kind} {namespace}/{name}")
            watched = self._watched[reference] = _Watched(informer, task)
        return watched

    async def release(self, pod_uid: str) -> None:
        """The Pod ended here: the watches of objects no other Pod references stop. (They leave the table before
        the first await, so a Pod that reads one of them meanwhile starts a watch of its own.)"""
        unused = []
        for reference, watched in list(self._watched.items()):
            watched.pods.discard(pod_uid)
            if not watched.pods:
                del self._watched[reference]
                unused.append(watched.task)
        for task in unused:
            await _stop(task)

    async def close(self) -> None:
        """Every watch stops (the kubelet shuts down or loses its Node)."""
        watched, self._watched = list(self._watched.values()), {}
        for item in watched:
            await _stop(item.task)


async def _stop(task: "asyncio.Task[None]") -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
