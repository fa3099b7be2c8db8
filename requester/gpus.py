"""GPU discovery: the UUIDs of this container's GPUs (found once, at start) and their memory in use.

Two sources. NVML (nvidia-ml-py) on a GPU node, restricted to `NVIDIA_VISIBLE_DEVICES` (under CDI,
`void`: every GPU NVML sees). Without NVML, the UUIDs listed in `NVIDIA_VISIBLE_DEVICES` themselves,
or under CDI those the loopback kubelet declares in place of NVML — a fake for machines with no GPU,
such as the loopback test cluster, whose kubelet plays the device plugin or a DRA driver.
"""

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .visible_devices import ENV_NAME, SIMULATED_NVML_ENV, Scope, VisibleDevices

log = logging.getLogger(__name__)
MIB = 1024 * 1024


class SourceChoice(StrEnum):
    AUTO = "auto"  # NVML when it can be initialized, else the variable
    NVML = "nvml"
    ENV = "env"


class GpuDiscoveryError(RuntimeError):
    """NVML was asked for explicitly and cannot be used."""


@dataclass
class MemoryUsage:
    """MiB in use per GPU UUID, and one line per GPU that could not be read."""

    mib: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class GpuSource(ABC):
    """Where the GPUs come from; `uuids` is fixed at start, as in FMA's requester."""

    name: str
    uuids: tuple[str, ...]

    @abstractmethod
    def memory_usage(self) -> MemoryUsage:
        """Blocking (NVML calls); run it off the event loop."""

    @abstractmethod
    def close(self) -> None:
        """Release what discovery opened."""


class NvmlGpus(GpuSource):
    """The GPUs NVML reports, restricted to those `NVIDIA_VISIBLE_DEVICES` lists, in NVML index order."""

    name = "NVML"

    def __init__(self, nvml: Any, visible: VisibleDevices) -> None:
        """`nvml` is the initialized pynvml module (or a stand-in with the same functions)."""
        self._nvml = nvml
        found = self._devices()
        self._handles: dict[str, Any] = {
            uuid: handle for index, (uuid, handle) in found.items() if _wanted(visible, index, uuid)
        }
        self.uuids = tuple(self._handles)
        missing = [str(i) for i in visible.indices if i not in found]
        missing += [u for u in visible.uuids if u not in {uuid for uuid, _ in found.values()}]
        if missing:
            log.warning("%s lists GPUs that NVML does not see: %s", ENV_NAME, ", ".join(missing))

    def _devices(self) -> dict[int, tuple[str, Any]]:
        """index -> (UUID, handle) of every GPU NVML can read; one unreadable GPU does not hide the others."""
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as err:
            log.error("NVML cannot count the GPUs: %s", err)
            return {}
        devices: dict[int, tuple[str, Any]] = {}
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
            except nvml.NVMLError as err:
                log.error("NVML cannot read GPU %d: %s", index, err)
                continue
            devices[index] = (uuid.decode() if isinstance(uuid, bytes) else uuid), handle
        return devices

    def memory_usage(self) -> MemoryUsage:
        usage = MemoryUsage()
        for uuid, handle in self._handles.items():
            try:
                usage.mib[uuid] = int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used) // MIB
            except self._nvml.NVMLError as err:
                usage.errors.append(f"cannot read the memory use of {uuid}: {err}")
        return usage

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as err:
            log.warning("NVML shutdown failed: %s", err)


def _wanted(visible: VisibleDevices, index: int, uuid: str) -> bool:
    return visible.scope in (Scope.ALL, Scope.INJECTED) or (
        visible.scope is Scope.LISTED and (index in visible.indices or uuid in visible.uuids)
    )


class DeclaredGpus(GpuSource):
    """FAKE GPU discovery for machines without NVML: the UUIDs listed in `NVIDIA_VISIBLE_DEVICES`, or
    under CDI (`void`) those in `simulated_nvml` (the loopback kubelet's stand-in for NVML's view).

    Nothing checks that these GPUs exist, and nothing can measure them, so each reports 0 MiB in
    use. Used when `--gpu-source env` is given, or with `auto` when NVML cannot be initialized.
    """

    name = f"{ENV_NAME} (fake: no NVML)"

    def __init__(self, visible: VisibleDevices, simulated_nvml: str | None = None) -> None:
        if visible.scope is Scope.INJECTED:
            self.uuids = tuple(u.strip() for u in (simulated_nvml or "").split(",") if u.strip())
            self.name = f"{SIMULATED_NVML_ENV} (fake: CDI-injected GPUs, no NVML)"
            if not self.uuids:
                log.warning("%s=void: the GPUs were injected by CDI, and only NVML can name them", ENV_NAME)
            return
        self.uuids = visible.uuids
        unresolved = [str(i) for i in visible.indices] + list(visible.ignored)
        if visible.scope is Scope.ALL:
            unresolved.append("all (or unset)")
        if unresolved:
            log.warning("without NVML only GPU UUIDs can be used; ignoring %s=%s", ENV_NAME, ", ".join(unresolved))

    def memory_usage(self) -> MemoryUsage:
        return MemoryUsage(mib=dict.fromkeys(self.uuids, 0))

    def close(self) -> None:
        """Nothing was opened."""


def discover(
    choice: SourceChoice, visible: VisibleDevices, nvml: Any = None, simulated_nvml: str | None = None
) -> GpuSource:
    """The GPU source for `choice`; `nvml` defaults to the pynvml module. `simulated_nvml`: the value of
    `SIMULATED_NVML_ENV`, the fake's only source under CDI."""
    if choice is SourceChoice.ENV:
        return DeclaredGpus(visible, simulated_nvml)
    if nvml is None:
        import pynvml

        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        if choice is SourceChoice.NVML:
            raise GpuDiscoveryError(f"NVML cannot be initialized: {err}") from None
        log.warning("NVML cannot be initialized (%s); falling back to %s", err, ENV_NAME)
        return DeclaredGpus(visible, simulated_nvml)
    return NvmlGpus(nvml, visible)
