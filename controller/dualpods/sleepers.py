"""The sleeping instances of a launcher as the memory budgets (E3, memory_budget.py) count them, and the Event
that says which one a budget made go (counted in dualpods_sleeper_budget_actions_total)."""

from collections.abc import Iterable, Mapping

from api import keys
from api.launcher import InstanceState, InstanceStatus
from controller import pods
from controller.dualpods.memory_budget import Sleeper
from controller.dualpods.metrics import BudgetAction
from controller.dualpods.passes import Pass
from controller.dualpods.pools.filling import Filling


def first_to_go(states: Iterable[InstanceState], pools: Mapping[str, Filling]) -> frozenset[str]:
    """The sleepers a warm pool does not need, which a budget or a reclaim deletes before any other: those of a
    model whose pool holds more ready copies than it declares."""
    beyond = {isc for isc, filling in pools.items() if filling.ready > filling.declared}
    return frozenset(
        s.instance_id for s in states if s.sleeping and (s.annotations or {}).get(keys.INSTANCE_ISC_NAME) in beyond
    )


def sleepers(states: list[InstanceState], exclude: str) -> list[Sleeper]:
    return [
        Sleeper(s.instance_id, s.revision, s.process.rss_bytes if s.process else 0, frozenset(s.gpu_uuids or []))
        for s in states
        if s.sleeping and s.status is InstanceStatus.RUNNING and s.instance_id != exclude
    ]


async def note_budget(p: Pass, launcher: pods.Pod, message: str) -> None:
    """An instance a budget made go: counted, and an Event on the launcher."""
    count_budget_action(p, BudgetAction.DELETED)
    await p.event(launcher, "Normal", "SleeperBudget", message)


def count_budget_action(p: Pass, action: BudgetAction) -> None:
    p.world.metrics.sleeper_budget_actions.labels(p.world.namespace, p.s.isc_name, action.value).inc()
