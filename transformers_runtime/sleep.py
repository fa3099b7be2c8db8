"""vLLM's sleep levels for a PyTorch model, and the weight moves behind them.

- Level 0 pauses only: nothing moves.
- Level 1 packs every parameter and buffer into one page-locked host buffer and frees the device
  memory; waking copies the buffer back in a single transfer into one device buffer, and each
  tensor becomes a view of it. Tensors keep their identity (only `.data` changes), so tied weights,
  peft adapters and module references all stay valid.
- Level 2 frees the weights without keeping them; waking loads them from disk again.

The host buffer is pinned with `cudaHostRegister` on an allocation of just the pages needed rather than with
`Tensor.pin_memory()`: torch's pinned-memory allocator rounds each block up to a power of two and
keeps freed blocks cached, so a 5 GiB model would hold 8 GiB of page-locked RAM, even after waking.
On a CPU device the same code runs with plain host memory (the weights are in host memory anyway).

Everything here is synchronous and meant for the one thread that also runs the model.
"""

import itertools
import logging
import mmap
import time
from collections.abc import Collection
from dataclasses import dataclass

import torch

from api.vllm_surface.bodies import SLEEP_LEVELS, WAKE_TAGS

from .model import ModelHolder

log = logging.getLogger("transformers_runtime")

ALIGNMENT = 512  # bytes between packed tensors: any dtype can be viewed at such an offset


def model_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer once (tied weights are one object)."""
    seen: set[int] = set()
    tensors = []
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            tensors.append(tensor)
    return tensors


def free_cached_memory(device: torch.device) -> None:
    """Hand memory the caching allocator keeps back to the driver, so another process can use it."""
    if device.type != "cuda":
        return
    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_workspaces is not None:
        clear_workspaces()
    torch.cuda.empty_cache()


def release_tensors(tensors: list[torch.Tensor]) -> None:
    """Point each tensor at an empty one on its device, freeing its memory but keeping the object."""
    devices = {tensor.device for tensor in tensors}
    for tensor in tensors:
        tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    for device in devices:
        free_cached_memory(device)


def _cuda_call(name: str, *args: int) -> None:
    error = int(getattr(torch.cuda.cudart(), name)(*args))
    if error:
        raise RuntimeError(f"{name} failed with CUDA error {error}")


def _page_aligned(nbytes: int) -> torch.Tensor:
    """Whole host pages from a page boundary: what cudaHostRegister asks for (malloc gives neither)."""
    page = mmap.PAGESIZE
    length = (nbytes + page - 1) // page * page
    raw = torch.empty(length + page, dtype=torch.uint8)
    skip = -raw.data_ptr() % page
    return raw[skip : skip + length]  # the view keeps `raw` alive


@dataclass(frozen=True)
class _Slot:
    tensor: torch.Tensor
    offset: int
    shape: torch.Size
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return int(self.shape.numel() * self.dtype.itemsize)

    def view(self, buffer: torch.Tensor) -> torch.Tensor:
        return buffer[self.offset : self.offset + self.nbytes].view(self.dtype).view(self.shape)


class HostCopy:
    """A module's tensors packed into one host buffer while their device memory is free (level 1)."""

    def __init__(self, slots: list[_Slot], buffer: torch.Tensor, device: torch.device) -> None:
        self._slots = slots
        self._buffer: torch.Tensor | None = buffer
        self.device = device
        self.pinned = device.type == "cuda"
        self.nbytes = buffer.numel()

    @classmethod
    def take(cls, module: torch.nn.Module) -> "HostCopy":
        """Copy the module's tensors to host memory, then free them on the device."""
        tensors = model_tensors(module)
        devices = {tensor.device for tensor in tensors}
        if len(devices) != 1:
            raise ValueError(f"level 1 needs the model on one device, found {sorted(map(str, devices))}")
        device = devices.pop()
        slots, offset = [], 0
        for tensor in tensors:
            slots.append(_Slot(tensor, offset, tensor.shape, tensor.dtype))
            offset += (tensor.numel() * tensor.element_size() + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        host = cls(slots, _page_aligned(offset), device)
        buffer = host._live_buffer()
        if host.pinned and host.nbytes:
            _cuda_call("cudaHostRegister", buffer.data_ptr(), host.nbytes, 0)
        try:
            with torch.no_grad():
                for slot in slots:
                    slot.view(buffer).copy_(slot.tensor, non_blocking=host.pinned)
            if host.pinned:
                torch.cuda.synchronize(device)
        except BaseException:
            host.release()
            raise
        release_tensors(tensors)
        return host

    def _live_buffer(self) -> torch.Tensor:
        if self._buffer is None:
            raise RuntimeError("this host copy was released")
        return self._buffer

    def restore(self) -> None:
        """One host-to-device transfer into one new device buffer; every tensor becomes a view of it."""
        on_device = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        with torch.no_grad():
            on_device.copy_(self._live_buffer(), non_blocking=self.pinned)
        if self.pinned:
            torch.cuda.synchronize(self.device)
        for slot in self._slots:
            slot.tensor.data = slot.view(on_device)

    def release(self) -> None:
        """Give the host memory back; unpinning gigabytes takes a while, so a wake does it afterwards."""
        if self._buffer is not None and self.pinned and self.nbytes:
            _cuda_call("cudaHostUnregister", self._buffer.data_ptr())
        self._buffer = None


class SleepManager:
    """vLLM's sleep/wake contract for the model in `holder`; call it only from the model's thread."""

    def __init__(self, holder: ModelHolder) -> None:
        self.holder = holder
        self.level: int | None = None  # None while awake
        self._asleep_tags: set[str] = set()
        self._host: HostCopy | None = None
        self._retired: HostCopy | None = None

    @property
    def is_sleeping(self) -> bool:
        return self.level is not None

    def sleep(self, level: int) -> None:
        """Sleep at `level`, or deepen the current sleep to it; a shallower level changes nothing."""
        if level not in SLEEP_LEVELS:
            raise ValueError(f"level must be one of {SLEEP_LEVELS}, got {level}")
        started = time.perf_counter()
        if level == 1 and self._host is None and self.holder.loaded:
            self._host = HostCopy.take(self.holder.module)
            log.info("level 1: %.1f MB of weights to host memory", self._host.nbytes / 1e6)
        elif level == 2:
            self._discard()
        self.level = level if self.level is None else max(self.level, level)
        self._asleep_tags = set(WAKE_TAGS)  # the KV cache lives per request here, so it has nothing to wake
        log.info("asleep at level %d after %.3f s", self.level, time.perf_counter() - started)

    def _discard(self) -> None:
        if self._host is not None:
            self._host.release()
            self._host = None
        if self.holder.loaded:
            release_tensors(model_tensors(self.holder.module))
            self.holder.drop()

    def wake(self, tags: Collection[str] | None = None) -> bool:
        """Wake `tags` (vLLM's: weights, kv_cache; all by default); True once nothing sleeps any more.

        Waking the weights restores them from host memory (level 1) or from disk (level 2). A host
        copy that served its purpose waits in `take_retired` for the caller to release.
        """
        if self.level is None:
            return True
        waking = WAKE_TAGS if tags is None else frozenset(tags)
        if unknown := waking - WAKE_TAGS:
            raise ValueError(f"unknown tags {sorted(unknown)}; vLLM's are {sorted(WAKE_TAGS)}")
        started = time.perf_counter()
        if "weights" in waking:
            if self._host is not None:
                self._host.restore()
                self._retired, self._host = self._host, None
            elif not self.holder.loaded:
                self.holder.load()
        self._asleep_tags -= waking
        log.info("woke %s in %.3f s", ", ".join(sorted(waking)), time.perf_counter() - started)
        if self._asleep_tags:
            return False
        self.level = None
        return True

    def take_retired(self) -> HostCopy | None:
        """The host copy the last wake restored from, for the caller to `release()` when it suits."""
        retired, self._retired = self._retired, None
        return retired
