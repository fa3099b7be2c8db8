"""bench/pools.py's harness at a small size (issue 45): 2 models with pools of 2 over 2 Nodes at least, on 4
simulated DRA Nodes x 4 GPUs with the real controllers and kube-scheduler, scaled 0 -> 2 -> 0 in two waves. Every
first start is hot, the first wave's included; no launcher ever holds more than maxInstances or its host sleeper
budget (the simulated launchers' own ledger); no pool displaces a requester's instance. The full-size figures are
bench/pools.py's (docs/benchmarks.md)."""

from pathlib import Path

import pytest

from e2e.pools import PoolsSpec, run_pools

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_every_first_start_is_hot_within_budgets_and_displacing_nothing(tmp_path: Path) -> None:
    spec = PoolsSpec(nodes=4, models=2, pool=2, min_nodes=2, replicas=2, waves=2, wave_timeout=240)
    progress: list[str] = []
    result = await run_pools(spec, tmp_path, progress.append)

    assert result.timed_out_waves == 0, progress
    assert len(result.outcomes) == spec.models * spec.replicas * spec.waves
    assert [o.start for o in result.outcomes] == ["hot"] * len(result.outcomes), result.outcomes
    assert result.refills, "the first wave woke every copy: each pool fell short, and was refilled"
    assert (result.over_budget, result.displaced) == (0, 0)
