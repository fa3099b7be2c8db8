"""Memory budgets for sleeping instances (E3), in bytes rather than FMA's counts.

A level-1 sleep keeps the model's weights in host memory, and a sleeping vLLM still holds its CUDA
context and allocator pools on the GPU (about 1-2 GiB). A LauncherConfig's `sleeperBudget` caps both.
Before an instance goes to sleep the host budget must hold it as well; before one wakes, the GPU must
not carry more than the budget. When it does not fit, the least recently used sleepers (lowest
revision) are deleted; when that cannot help, the wake is refused with a clear reason — never
attempted and left half done.
"""

from collections.abc import Collection
from dataclasses import dataclass

MIB = 1024 * 1024
# What a sleeping vLLM instance keeps on its GPU (CUDA context, allocator pools): FMA plans 2 GiB each.
SLEEPER_GPU_BYTES = 2 * 1024 * MIB


@dataclass(frozen=True)
class Sleeper:
    instance_id: str
    revision: int  # the launcher's revision of its last change: lower means used longer ago
    host_bytes: int
    gpu_uuids: frozenset[str]


def host_victims(
    sleepers: list[Sleeper], incoming_bytes: int, budget: int, first: Collection[str] = ()
) -> list[str] | None:
    """Sleepers to delete so that they and one more sleeper of `incoming_bytes` fit in `budget`, those in `first`
    (a warm pool's beyond its count) and then the least recently used; None if that one alone does not fit."""
    if incoming_bytes > budget:
        return None
    total = incoming_bytes + sum(s.host_bytes for s in sleepers)
    victims: list[str] = []
    for sleeper in sorted(sleepers, key=lambda s: (s.instance_id not in first, s.revision)):
        if total <= budget:
            break
        victims.append(sleeper.instance_id)
        total -= sleeper.host_bytes
    return victims


def gpus_over_budget(used_mib: dict[str, int], gpus: list[str], budget: int) -> dict[str, int]:
    """The instance's GPUs that already carry more than the sleepers may hold (MiB in use)."""
    return {gpu: used_mib[gpu] for gpu in gpus if gpu in used_mib and used_mib[gpu] * MIB > budget}


def gpu_victim(sleepers: list[Sleeper], over_budget: dict[str, int], first: Collection[str] = ()) -> str | None:
    """The sleeper on an over-budget GPU to delete, if any: one of `first`, else the least recently used."""
    sharing = [s for s in sleepers if s.gpu_uuids & over_budget.keys()]
    return min(sharing, key=lambda s: (s.instance_id not in first, s.revision)).instance_id if sharing else None


def gpu_sleeper_reserve(gpu_budget: int | None, max_instances: int) -> int:
    """GPU memory an awake instance must leave for the sleepers its LauncherConfig allows (E6): the
    byte budget if set, else 2 GiB for each of the other maxInstances - 1."""
    return gpu_budget if gpu_budget is not None else (max_instances - 1) * SLEEPER_GPU_BYTES
