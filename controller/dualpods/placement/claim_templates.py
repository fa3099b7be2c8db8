"""On DRA Nodes, the GPU itself: a ResourceClaimTemplate like the requester's own that prefers the sleeper's GPUs.

Under the device plugin the kubelet picks a Pod's GPU on its Node, so placement can only prefer the Node. Under DRA
the scheduler's allocator picks the device, trying a request's prioritized alternatives (`firstAvailable`) in order
on each Node, and scores Nodes by the first alternative that fits there. A requester whose claim comes from
template T is therefore pointed (at its admission) to T's *derived* template: the same claim, its one request
turned into two alternatives, first exactly the sleeper's GPUs (their `uuid` attribute, as NVIDIA's DRA driver
publishes it), then T's request as it was. When those GPUs are taken by the time the scheduler runs, the second
alternative is T's own request: never worse than T.

Templates are immutable, so a derived one is made once per (T, GPUs), named from both (and T's UID, so a T deleted
and made anew gets new ones), owned by T (it goes with T), and reused by every later placement on those GPUs. It is
made at the first placement that needs it, before the webhook answers (the admission then has a side effect, which
the webhook's configuration declares: none on dry runs).
"""

import copy
import hashlib
import json
import logging
import time
from typing import Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from kube.informer import Obj

log = logging.getLogger(__name__)

NVIDIA_DRIVER = "gpu.nvidia.com"  # the attribute domain of NVIDIA's DRA driver, which publishes each GPU's `uuid`
DERIVED_FROM_LABEL = keys.PREFIX + "derived-from"
SLEEPER_ALTERNATIVE = "sleeper"
AS_ASKED_ALTERNATIVE = "as-asked"
ORIGINALS_KEPT_S = 60.0  # a template read is reused this long (a T deleted and made anew is seen after it)
SUBREQUEST_FIELDS = ("deviceClassName", "selectors", "allocationMode", "count", "tolerations", "capacity")


def derived_name(template: Obj, gpus: tuple[str, ...]) -> str:
    metadata = template["metadata"]
    digest = hashlib.blake2b(f"{metadata.get('uid', '')}/{','.join(gpus)}".encode(), digest_size=6).hexdigest()
    return f"{metadata['name'][:200]}-sleeper-{digest}"


def derive(template: Obj, gpus: tuple[str, ...]) -> Obj | None:
    """T's derived template preferring `gpus`, or None where T does not ask for exactly that many devices in one
    request without admin access (then placement prefers the Node alone)."""
    spec = copy.deepcopy(template.get("spec") or {})
    devices = (spec.get("spec") or {}).get("devices") or {}
    requests = devices.get("requests") or []
    exactly = requests[0].get("exactly") if len(requests) == 1 else None
    if (
        not isinstance(exactly, dict)
        or exactly.get("adminAccess")
        or exactly.get("allocationMode", "ExactCount") != ("ExactCount")
    ):
        return None
    if int(exactly.get("count", 1)) != len(gpus):
        return None
    asked = {name: exactly[name] for name in SUBREQUEST_FIELDS if name in exactly}
    listed = ", ".join(json.dumps(gpu) for gpu in gpus)
    attributes = f"device.attributes[{json.dumps(NVIDIA_DRIVER)}]"
    only_these = f'"uuid" in {attributes} && {attributes}.uuid in [{listed}]'
    selectors = [*asked.get("selectors", []), {"cel": {"expression": only_these}}]
    sleeper = {**asked, "name": SLEEPER_ALTERNATIVE, "selectors": selectors}
    requests[0] = {"name": requests[0]["name"], "firstAvailable": [sleeper, {**asked, "name": AS_ASKED_ALTERNATIVE}]}
    metadata = template["metadata"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": derived_name(template, gpus),
            "namespace": metadata.get("namespace"),
            "labels": {DERIVED_FROM_LABEL: metadata["name"]},
            "ownerReferences": [
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaimTemplate",
                    "name": metadata["name"],
                    "uid": metadata.get("uid", ""),
                }
            ],
        },
        "spec": spec,
    }


class ClaimTemplates(Protocol):
    async def prefer(self, namespace: str, template: str, gpus: tuple[str, ...]) -> str | None:
        """The name of `template`'s derived template preferring `gpus`, made where missing; None where there is
        none to be had (no such template, one that cannot be derived, or the API server refused)."""
        ...


class KubeClaimTemplates:
    """ClaimTemplates over the API server: the requester's template read (and kept a minute), the derived one
    created once (AlreadyExists is success)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._resource = client.ResourceV1Api(api)
        self._api = api
        self._originals: dict[tuple[str, str], tuple[float, Obj]] = {}
        self._made: set[tuple[str, str]] = set()

    async def prefer(self, namespace: str, template: str, gpus: tuple[str, ...]) -> str | None:
        try:
            original = await self._original(namespace, template)
            if original is None or (derived := derive(original, gpus)) is None:
                return None
            name = str(derived["metadata"]["name"])
            if (namespace, name) not in self._made:
                try:
                    await self._resource.create_namespaced_resource_claim_template(namespace, derived)
                except ApiException as err:
                    if err.status != 409:
                        raise
                self._made.add((namespace, name))
            return name
        except ApiException as err:
            log.warning("placement: no derived claim template of %s/%s: %s %s", namespace, template, err.status,
                        err.reason)  # fmt: skip
            return None

    async def _original(self, namespace: str, name: str) -> Obj | None:
        kept = self._originals.get((namespace, name))
        if kept is not None and time.monotonic() - kept[0] < ORIGINALS_KEPT_S:
            return kept[1]
        try:
            found = await self._resource.read_namespaced_resource_claim_template(name, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        original: Obj = self._api.sanitize_for_serialization(found)
        self._originals[(namespace, name)] = (time.monotonic(), original)
        return original
