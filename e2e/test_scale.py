"""The scale harness's small run (issue 15): 40 requesters on 10 simulated GPU Nodes, one launcher per GPU,
the controllers installed by the Helm chart; every requester bound once and told ready, before and after
a swap wave, with no GPU shared. The full-size figures are `bench/scale.py`'s (docs/benchmarks.md)."""

from pathlib import Path

import pytest

from e2e.chart import DUAL_PODS, POPULATOR
from e2e.scale import STEPS, ScaleSpec, run_scale

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_forty_requesters_on_ten_simulated_nodes(tmp_path: Path) -> None:
    spec = ScaleSpec(nodes=10, gpus_per_node=4, requesters=40, models=2, wave_timeout=240, idle_seconds=2)
    progress: list[str] = []
    result = await run_scale(spec, tmp_path, progress=progress.append)

    assert result.launchers_created_seconds <= result.launchers_ready_seconds
    assert result.populator_phase.requests_by_call.get("POST pods/binding") == 40, "one launcher per GPU"
    assert result.idle_phase is not None
    assert result.idle_phase.seconds >= 2
    first, swap = result.waves
    for wave in (first, swap):
        assert not wave.timed_out, wave.problems
        assert (wave.not_ready, wave.unbound, wave.double_bound, wave.shared_gpus) == (0, 0, 0, 0), wave
        assert all(0 < latency <= wave.seconds for latency in wave.latencies)
        assert set(wave.steps) == {f"{a} -> {b}" for a, b in STEPS}, "every step of every requester timed"
        assert wave.phase.requests_by_verb.get("POST", 0) > 0
    assert len(first.latencies) == 40, "every requester of the first wave is new"
    over = [line for line in progress if " wave over after " in line]
    assert [line.split()[0] for line in over] == ["first", "swap"], progress
    assert all("unbound 0, double-bound 0, GPUs shared 0" in line for line in over), over
    assert len(swap.latencies) == 20, "half the models moved to the other half"
    for component in (DUAL_PODS, POPULATOR):
        figures = result.controllers[component]
        assert 0 < figures.rss_mib <= figures.peak_rss_mib
        assert figures.cpu_seconds > 0
    dual_pods = result.controller_metrics[DUAL_PODS]
    assert dual_pods.own is not None
    assert dual_pods.work is not None
    assert dual_pods.own.count == dual_pods.work.count > 0, "every pass timed, with and without its calls"
    assert dual_pods.api_requests.get("PATCH", 0) >= 40, "a bind, at least, per requester"
