"""Engine flags the launcher adds when the user did not set them (E6), computed from the machine.

An explicit user flag always wins; what was added is reported in the instance state and logged, so
nobody has to guess the command line an instance really runs with. The computation is pure: the
machine (the instance's GPUs and their free memory, or none) is measured elsewhere and passed in.
"""

import math
from dataclasses import dataclass, field

MIB = 1024 * 1024
GIB = 1024 * MIB
DEFAULT_CPU_KV_CACHE_BYTES = 64 * MIB
# KAITO's formula: what is free now, less room for PyTorch's fragmentation, capped.
FRAGMENTATION_BYTES = 600 * MIB
MAX_GPU_MEMORY_UTILIZATION = 0.95
# When the free memory cannot be measured (KAITO's fallback).
FALLBACK_GPU_MEMORY_UTILIZATION = 0.84
# vLLM sizes its KV cache by one of these; with neither set, the defaults choose the size.
KV_CACHE_SIZING_FLAGS = frozenset({"kv_cache_memory_bytes", "gpu_memory_utilization"})


@dataclass(frozen=True)
class GpuMemory:
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class Machine:
    """What the defaults depend on: a CPU, or the instance's GPUs (None if unmeasured)."""

    on_cpu: bool
    gpus: list[GpuMemory] | None = None
    cpu_kv_cache_bytes: int = DEFAULT_CPU_KV_CACHE_BYTES
    sleeper_reserve_bytes: int = 0  # GPU memory to leave for the sleepers the LauncherConfig allows


@dataclass
class EngineDefaults:
    flags: list[str] = field(default_factory=list)
    chosen: dict[str, str] = field(default_factory=dict)

    def add(self, flag: str, value: str | None = None) -> None:
        self.flags.extend([flag] if value is None else [flag, value])
        self.chosen[flag] = "true" if value is None else value


def gpu_memory_utilization(gpus: list[GpuMemory] | None, sleeper_reserve_bytes: int) -> float:
    """The share of each GPU's total memory an instance may take: (free - 600 MiB - the sleepers'
    reserve) / total, rounded down to 0.01, capped at 0.95; the smallest over its GPUs."""
    if not gpus:
        return FALLBACK_GPU_MEMORY_UTILIZATION
    shares = [
        math.floor((gpu.free_bytes - FRAGMENTATION_BYTES - sleeper_reserve_bytes) / gpu.total_bytes * 100) / 100
        for gpu in gpus
    ]
    return max(0.0, min(MAX_GPU_MEMORY_UTILIZATION, *shares))


def vllm_defaults(explicit: frozenset[str], machine: Machine) -> EngineDefaults:
    defaults = EngineDefaults()
    if "max_model_len" not in explicit:
        # The longest context that fits the KV cache, instead of the model's maximum, which may not.
        defaults.add("--max-model-len", "auto")
    if machine.on_cpu:
        if "dtype" not in explicit:
            # bf16 (vLLM's default) picks AMX attention kernels that can die with SIGILL on AMX CPUs;
            # float32 uses the vector kernels everywhere.
            defaults.add("--dtype", "float32")
        if not explicit & KV_CACHE_SIZING_FLAGS:
            # On a CPU a utilization fraction reserves that share of the host's RAM; bytes are
            # deterministic and let several instances share a host.
            defaults.add("--kv-cache-memory-bytes", str(machine.cpu_kv_cache_bytes))
        if "enforce_eager" not in explicit:
            # torch.compile's warm-up costs ~40 s on a CPU, far more than it saves for swapping.
            defaults.add("--enforce-eager")
        return defaults
    if "enable_sleep_mode" not in explicit:
        # What makes a sleeping instance release its GPU memory.
        defaults.add("--enable-sleep-mode")
    if not explicit & KV_CACHE_SIZING_FLAGS:
        utilization = gpu_memory_utilization(machine.gpus, machine.sleeper_reserve_bytes)
        defaults.add("--gpu-memory-utilization", f"{utilization:.2f}")
    return defaults


def transformers_defaults(explicit: frozenset[str], machine: Machine) -> EngineDefaults:
    """The transformers runtime picks its device and dtype itself; on a GPU it takes bfloat16."""
    defaults = EngineDefaults()
    if not machine.on_cpu and "dtype" not in explicit:
        defaults.add("--dtype", "bfloat16")
    return defaults
