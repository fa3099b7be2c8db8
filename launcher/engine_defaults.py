"""Engine flags the launcher adds when the user did not set them (E6).

An explicit user flag always wins; what was added is reported in the instance state and logged,
so nobody has to guess the command line an instance really runs with.
"""

from dataclasses import dataclass, field

DEFAULT_CPU_KV_CACHE_BYTES = 64 * 1024 * 1024


@dataclass
class EngineDefaults:
    flags: list[str] = field(default_factory=list)
    chosen: dict[str, str] = field(default_factory=dict)

    def add(self, flag: str, value: str | None = None) -> None:
        self.flags.extend([flag] if value is None else [flag, value])
        self.chosen[flag] = "true" if value is None else value


def cpu_defaults(explicit: frozenset[str], kv_cache_bytes: int) -> EngineDefaults:
    """What vLLM needs on a CPU to start reliably and quickly."""
    defaults = EngineDefaults()
    if "dtype" not in explicit:
        # bf16 (vLLM's default) picks AMX attention kernels that can die with SIGILL on
        # AMX CPUs; float32 uses the vector kernels everywhere.
        defaults.add("--dtype", "float32")
    if not explicit & {"kv_cache_memory_bytes", "gpu_memory_utilization"}:
        # On CPU a utilization fraction reserves that share of the NUMA node's RAM; bytes are
        # deterministic and let several instances share a host.
        defaults.add("--kv-cache-memory-bytes", str(kv_cache_bytes))
    if "enforce_eager" not in explicit:
        # torch.compile warm-up costs ~40 s on CPU, far more than it saves for swapping.
        defaults.add("--enforce-eager")
    return defaults


def gpu_defaults(explicit: frozenset[str]) -> EngineDefaults:
    """On a GPU, sleep mode is what makes a sleeping instance release its memory."""
    defaults = EngineDefaults()
    if "enable_sleep_mode" not in explicit:
        defaults.add("--enable-sleep-mode")
    return defaults
