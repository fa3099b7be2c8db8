"""How full a warm pool is, as its keeper last found it: what the ISC's status shows (status.pool, PoolReady)."""

from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    """The reason of the pool's `PoolReady` condition (and of its Event when the pool cannot be filled)."""

    FILLED = "Filled"
    FILLING = "Filling"  # copies are loading
    NO_LAUNCHER = "NoLauncher"  # no Ready launcher of its LauncherConfig on a schedulable Node the pool selects
    NO_IDLE_GPU = "NoIdleGPU"  # every GPU there is busy (awake instances, requesters)
    BUDGET = "SleeperBudget"  # idle GPUs, but no launcher there has room within maxInstances and its budgets

    @property
    def unfillable(self) -> bool:
        return self not in (Verdict.FILLED, Verdict.FILLING)


@dataclass(frozen=True)
class Filling:
    """How full a pool was found by its keeper's last pass (what its ISC's status shows)."""

    declared: int
    ready: int
    loading: int
    nodes: int
    verdict: Verdict
    why: str
