"""Which GPU index (CUDA_VISIBLE_DEVICES) stands for each GPU UUID on this node.

Three sources: NVML on a real GPU node; FMA's mock modes for machines without GPUs — the node's
entry in the `gpu-map` ConfigMap when NODE_NAME and NAMESPACE are set, else GPU-0..GPU-(n-1). Where the
loopback kubelet says which GPUs NVML would see in this container (`SIMULATED_NVML_ENV`: it plays CDI or a DRA
driver, which inject device nodes), the mock sees only those, numbered as NVML numbers what it sees; so a
launcher on a DRA node sees the GPUs of the claims it was granted, and none without.
"""

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

from api.keys import GPU_MAP_CONFIGMAP, SIMULATED_NVML_ENV

from .errors import UnknownGpu

log = logging.getLogger(__name__)

GpuMap = dict[str, int]
Loader = Callable[[], Awaitable[GpuMap]]


class GpuInventory:
    """Translates UUIDs to indices, re-reading its source once when it meets an unknown UUID. One read at a
    time: callers that come while the source is read share that read."""

    def __init__(self, source: str, load: Loader) -> None:
        self.source = source
        self._load = load
        self._reading: asyncio.Future[GpuMap] | None = None

    def read_early(self) -> None:
        """Start reading the source now, in the background (at the launcher's start, as FMA's launcher reads
        its GPUs when it starts): the first instance does not wait for NVML's init or for the API server."""
        if self._reading is None:
            self._reading = asyncio.create_task(self._read())

    async def mapping(self, refresh: bool = False) -> GpuMap:
        if self._reading is None or (refresh and self._reading.done()):
            self._reading = asyncio.create_task(self._read())
        return await asyncio.shield(self._reading)  # a caller that gives up does not end the others' read

    async def _read(self) -> GpuMap:
        try:
            return await self._load()
        except Exception as err:  # the source is outside our control; report, don't crash
            log.error("cannot read GPUs from %s: %s", self.source, err)
            return {}

    async def indices(self, uuids: list[str]) -> list[int]:
        known = await self.mapping()
        if any(u not in known for u in uuids):
            known = await self.mapping(refresh=True)
        unknown = [u for u in uuids if u not in known]
        if unknown:
            available = ", ".join(sorted(known)) or "none"
            raise UnknownGpu(f"unknown GPU UUID(s) {', '.join(unknown)}; available ({self.source}): {available}")
        return [known[u] for u in uuids]


async def load_from_nvml() -> GpuMap:
    """UUID to index of every GPU the driver sees; in a thread, since NVML's calls block (its init for long)."""
    return await asyncio.to_thread(_nvml_map)


def _nvml_map() -> GpuMap:
    import pynvml

    pynvml.nvmlInit()
    try:
        return {
            _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))): index
            for index in range(pynvml.nvmlDeviceGetCount())
        }
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def naive_loader(count: int) -> Loader:
    async def load() -> GpuMap:
        return {f"GPU-{index}": index for index in range(count)}

    return load


def gpu_map_loader(node_name: str, namespace: str) -> Loader:
    async def load() -> GpuMap:
        from kubernetes_asyncio import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            await config.load_kube_config()
        async with client.ApiClient() as api:
            configmap = await client.CoreV1Api(api).read_namespaced_config_map(GPU_MAP_CONFIGMAP, namespace)
        return gpu_map_entry(configmap.data, node_name, namespace)

    return load


def gpu_map_entry(data: dict[str, str] | None, node_name: str, namespace: str) -> GpuMap:
    """The node's GPUs in the `data` of a gpu-map ConfigMap (node name -> JSON {"<UUID>": index})."""
    entry = (data or {}).get(node_name)
    if entry is None:
        raise LookupError(f"ConfigMap {namespace}/{GPU_MAP_CONFIGMAP} has no entry for node {node_name}")
    parsed = json.loads(entry)
    return {str(uuid): int(index) for uuid, index in parsed.items()}


def injected_only(load: Loader, simulated_nvml: str) -> Loader:
    """`load`'s GPUs restricted to the UUIDs listed in `simulated_nvml`, renumbered in their order."""
    injected = {u.strip() for u in simulated_nvml.split(",") if u.strip()}

    async def restricted() -> GpuMap:
        seen = sorted((index, uuid) for uuid, index in (await load()).items() if uuid in injected)
        return {uuid: number for number, (_, uuid) in enumerate(seen)}

    return restricted


def inventory(
    mock_count: int | None, node_name: str | None, namespace: str | None, simulated_nvml: str | None = None
) -> GpuInventory:
    """The inventory for the launcher's flags: NVML unless mock GPUs were asked for. `simulated_nvml`: the
    value of `SIMULATED_NVML_ENV`, where set."""
    if mock_count is None:
        return GpuInventory("NVML", load_from_nvml)
    if node_name and namespace:
        source, load = f"ConfigMap {namespace}/{GPU_MAP_CONFIGMAP}[{node_name}]", gpu_map_loader(node_name, namespace)
    else:
        source, load = f"{mock_count} mock GPUs", naive_loader(mock_count)
    if simulated_nvml is not None:
        return GpuInventory(f"{source}, those in {SIMULATED_NVML_ENV}", injected_only(load, simulated_nvml))
    return GpuInventory(source, load)
