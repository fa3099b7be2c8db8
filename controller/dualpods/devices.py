"""The DRA devices behind a requester's GPUs, named as an admin finds them: `<driver>/<pool>/<device>`.

A requester whose GPUs come through ResourceClaims reports their UUIDs, as every requester does; NVIDIA's DRA
driver publishes each GPU's UUID as the attribute `uuid` of its device in the Node's ResourceSlice, the same
device the claim's `status.allocation` names. Looking them up costs one list of the Node's slices per bind,
so only requesters with ResourceClaims pay it.
"""

import logging
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

UUID_ATTRIBUTE = "uuid"


class Device(NamedTuple):
    """A device of a ResourceSlice: its driver, its pool (which may hold slashes) and its own name."""

    driver: str
    pool: str
    name: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"


def device_names(slices: Iterable[Mapping[str, Any]], uuids: Iterable[str]) -> dict[str, Device]:
    """UUID -> its device, for the devices of these slices (API JSON) whose `uuid` attribute, unprefixed or in
    their driver's domain, is one of `uuids`."""
    wanted, named = set(uuids), {}
    for each in slices:
        spec = each.get("spec") or {}
        driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or {}
            uuid = (attributes.get(UUID_ATTRIBUTE) or attributes.get(f"{driver}/{UUID_ATTRIBUTE}") or {}).get("string")
            if uuid in wanted:
                named[uuid] = Device(driver, pool, device["name"])
    return named


class SliceDevices:
    """Reads a Node's ResourceSlices from the API server (the controllers' node-view ClusterRole grants it)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._resource = client.ResourceV1Api(api)

    async def named(self, node: str, uuids: list[str]) -> dict[str, Device]:
        """`device_names` of `node`'s slices; none where slices cannot be read (before Kubernetes 1.34, or
        without the right), which costs the Event its device names only."""
        try:
            listing = await self._resource.list_resource_slice(field_selector=f"spec.nodeName={node}")
        except ApiException as error:
            if error.status not in (403, 404):
                raise
            log.warning("cannot list the ResourceSlices of node %s (%s %s)", node, error.status, error.reason)
            return {}
        return device_names(self._api.sanitize_for_serialization(listing).get("items") or [], uuids)
