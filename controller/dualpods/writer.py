"""Writes to Pods, each one optimistic: a stale cached object makes the write fail with 409 and the
work item retries on a fresher cache, so two workers can never both bind one launcher.

An update is a JSON merge patch of the metadata it changes, with the cached resourceVersion as its
precondition: it carries only its change (what the caches trim, managedFields and kubectl's last-applied
annotation, stays as the API server has it), and the answer is not decoded (nothing reads it; decoding a
Pod into kubernetes-asyncio's model took most of the controller's time at scale, docs/benchmarks.md).

Every write names the controller as its field manager, so a Pod's managedFields tell when the controller
last changed it: the least-recently-used order of direct providers (FMA's sleeper limit) reads that time.
"""

import copy
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from controller import pods

log = logging.getLogger(__name__)

FIELD_MANAGER = pods.DUAL_PODS_FIELD_MANAGER
API_TIMEOUT = aiohttp.ClientTimeout(total=30, connect=5)  # no write waits longer on the API server


class PodWriter:
    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self._core = client.CoreV1Api(api)
        self.namespace = namespace

    async def update(self, pod: pods.Pod, mutate: Callable[[pods.Pod], None], why: str) -> bool:
        """Apply `mutate` to a copy of `pod`'s metadata (it may change nothing else) and write what changed,
        if anything; True if written."""
        changed = {**pod, "metadata": copy.deepcopy(pod["metadata"])}
        mutate(changed)
        others = sorted(k for k in changed.keys() | pod.keys() if k != "metadata" and changed.get(k) is not pod.get(k))
        if others:
            raise ValueError(f"a Pod update changes metadata only, not {', '.join(others)}")
        patch = merge_patch(pod["metadata"], changed["metadata"])
        if not patch:
            return False
        patch["resourceVersion"] = pods.meta(pod)["resourceVersion"]
        log.info("k8s call start: update pod %s (%s)", pods.name(pod), why)
        response = await self._core.patch_namespaced_pod(
            pods.name(pod), self.namespace, {"metadata": patch}, field_manager=FIELD_MANAGER,
            _content_type="application/merge-patch+json", _preload_content=False, _request_timeout=API_TIMEOUT,
        )  # fmt: skip
        async with response:
            if response.status >= 300:
                raise ApiException(status=response.status, reason=await response.text())
        return True

    async def create(self, pod: pods.Pod) -> pods.Pod:
        log.info("k8s call start: create pod %s", pod["metadata"].get("generateName") or pods.name(pod))
        response = await self._core.create_namespaced_pod(
            self.namespace, pod, field_manager=FIELD_MANAGER, _preload_content=False, _request_timeout=API_TIMEOUT
        )
        async with response:
            if response.status >= 300:
                raise ApiException(status=response.status, reason=await response.text())
            created: dict[str, Any] = await response.json()
        return created

    async def delete(self, pod: pods.Pod, why: str) -> None:
        """Delete exactly this incarnation (UID and resourceVersion preconditions); gone counts as done."""
        log.info("k8s call start: delete pod %s (%s)", pods.name(pod), why)
        body = {
            "preconditions": {"uid": pods.uid(pod), "resourceVersion": pods.meta(pod)["resourceVersion"]},
            "propagationPolicy": "Background",
        }
        try:
            await self._core.delete_namespaced_pod(
                pods.name(pod), self.namespace, body=body, _request_timeout=API_TIMEOUT
            )
        except ApiException as err:
            if err.status != 404:
                raise


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: changed and added keys, removed ones as
    null, maps compared key by key, anything else (lists) whole."""
    patch: dict[str, Any] = {}
    for key in old.keys() | new.keys():
        if key not in new:
            patch[key] = None
        elif key not in old or not isinstance(old[key], dict) or not isinstance(new[key], dict):
            if key not in old or old[key] != new[key]:
                patch[key] = new[key]
        elif inner := merge_patch(old[key], new[key]):
            patch[key] = inner
    return patch


def _set_entry(pod: pods.Pod, field: str, key: str, value: str | None) -> None:
    """Set or remove one entry of a metadata map, creating the map only to add to it (the API server
    drops empty maps, so an empty one would count as a change at every pass)."""
    entries = pod["metadata"].get(field)
    if value is None:
        if entries and key in entries:
            del entries[key]
        return
    pod["metadata"].setdefault(field, {})[key] = value


def set_annotation(pod: pods.Pod, key: str, value: str | None) -> None:
    _set_entry(pod, "annotations", key, value)


def set_label(pod: pods.Pod, key: str, value: str | None) -> None:
    _set_entry(pod, "labels", key, value)


def set_finalizer(pod: pods.Pod, finalizer: str, present: bool) -> None:
    current = list(pod["metadata"].get("finalizers") or [])
    if (finalizer in current) == present:
        return
    pod["metadata"]["finalizers"] = [*current, finalizer] if present else [f for f in current if f != finalizer]


def set_binding(provider: pods.Pod, requester: pods.Pod) -> None:
    """Bind `provider` to `requester`: the `requester` annotation (the record of the binding), the `dual` label,
    and the finalizer that keeps a deletion of the provider from going unnoticed."""
    set_annotation(provider, keys.REQUESTER_ANNOTATION, f"{pods.uid(requester)} {pods.name(requester)}")
    set_label(provider, keys.DUAL_LABEL, pods.name(requester))
    set_finalizer(provider, keys.PROVIDER_FINALIZER, True)
