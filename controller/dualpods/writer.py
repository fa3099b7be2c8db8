"""Writes to Pods. A provider's write is optimistic: a stale cached object makes it fail with 409 and the
work item retries on a fresher cache, so two workers can never both bind one launcher.

An update is a strategic merge patch of the metadata it changes: it carries only its change (what the
caches trim, managedFields and kubectl's last-applied annotation, stays as the API server has it), and a
finalizer is added or removed by itself, whatever other finalizers the Pod gained meanwhile. Its
precondition is the cached resourceVersion, or (`if_unchanged=False`, for metadata only this controller
writes: the requester's annotations and finalizer) only the Pod's UID: a kubelet's status write between
the read and the write then does not fail it, which at scale cost a 409 and a pass in most requester
writes. The answer's resourceVersion is returned (the pass waits until its cache shows that version,
memory.py); the rest of it is not decoded into a model (decoding a Pod into kubernetes-asyncio's model
took most of the controller's time at scale, docs/benchmarks.md).

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
from kube.client import answer_of
from kube.informer import decode

log = logging.getLogger(__name__)

FIELD_MANAGER = pods.DUAL_PODS_FIELD_MANAGER
API_TIMEOUT = aiohttp.ClientTimeout(total=30, connect=5)  # no write waits longer on the API server


class PodWriter:
    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self._core = client.CoreV1Api(api)
        self.namespace = namespace

    async def update(
        self, pod: pods.Pod, mutate: Callable[[pods.Pod], None], why: str, *, if_unchanged: bool = True
    ) -> str | None:
        """Apply `mutate` to a copy of `pod`'s metadata (it may change nothing else) and write what changed,
        if anything: only if the Pod is still as cached, or (`if_unchanged=False`) still this incarnation.
        The written Pod's resourceVersion; None if nothing changed."""
        changed = {**pod, "metadata": copy.deepcopy(pod["metadata"])}
        mutate(changed)
        others = sorted(k for k in changed.keys() | pod.keys() if k != "metadata" and changed.get(k) is not pod.get(k))
        if others:
            raise ValueError(f"a Pod update changes metadata only, not {', '.join(others)}")
        patch = metadata_patch(pod["metadata"], changed["metadata"])
        if not patch:
            return None
        if if_unchanged:
            patch["resourceVersion"] = pods.meta(pod)["resourceVersion"]
        else:
            patch["uid"] = pods.uid(pod)  # immutable: a patch naming another UID is refused
        log.info("k8s call start: update pod %s (%s)", pods.name(pod), why)
        response = await self._core.patch_namespaced_pod(
            pods.name(pod), self.namespace, {"metadata": patch}, field_manager=FIELD_MANAGER,
            _content_type="application/strategic-merge-patch+json", _preload_content=False,
            _request_timeout=API_TIMEOUT,
        )  # fmt: skip
        async with response:
            if response.status >= 300:
                reason = await response.text()
                # The API server refuses a changed UID as an invalid update; to the pass it is a conflict
                # like a changed resourceVersion: the Pod it read is not there any more.
                replaced = response.status == 422 and "metadata.uid" in reason
                raise ApiException(status=409 if replaced else response.status, reason=reason)
            written: dict[str, Any] = decode(await response.read())
        return str(written["metadata"]["resourceVersion"])

    async def create(self, pod: pods.Pod) -> pods.Pod:
        log.info("k8s call start: create pod %s", pod["metadata"].get("generateName") or pods.name(pod))
        return await answer_of(
            self._core.create_namespaced_pod(
                self.namespace, pod, field_manager=FIELD_MANAGER, _preload_content=False, _request_timeout=API_TIMEOUT
            )
        )

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


def metadata_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The strategic merge patch that turns metadata `old` into `new`: maps as in merge_patch, the finalizers
    added and removed one by one (their list merges, so a finalizer another client added stays)."""
    patch = merge_patch(_without_finalizers(old), _without_finalizers(new))
    before, after = old.get("finalizers") or [], new.get("finalizers") or []
    if added := [f for f in after if f not in before]:
        patch["finalizers"] = added
    if removed := [f for f in before if f not in after]:
        patch["$deleteFromPrimitiveList/finalizers"] = removed
    return patch


def _without_finalizers(metadata: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in metadata.items() if key != "finalizers"}


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
