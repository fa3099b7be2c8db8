"""The scale harness's small run (issue 15): 40 requesters on 10 simulated GPU Nodes, one launcher per GPU,
the controllers installed by the Helm chart; every requester bound once and told ready, before and after
a swap wave, with no GPU shared; and the same with FMA's released controllers on 2 Nodes (issue 46). The
full-size figures are `bench/scale.py`'s (docs/benchmarks.md)."""

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


async def test_fmas_controllers_on_the_same_simulated_fleet(tmp_path: Path) -> None:
    """FMA's released controllers (issue 46) drive the same simulated launchers and requesters: every requester
    bound once and told ready in both waves, no GPU shared; each launcher's notifier sidecar, which FMA's controllers
    add, ran against the API server (it publishes its launcher's first signature once the launcher is Ready)."""
    spec = ScaleSpec(nodes=2, gpus_per_node=2, requesters=4, models=2, wave_timeout=240, idle_seconds=2,
                     controllers="fma")  # fmt: skip
    result = await run_scale(spec, tmp_path)

    first, swap = result.waves
    for wave in (first, swap):
        assert not wave.timed_out, wave.problems
        assert (wave.not_ready, wave.unbound, wave.double_bound, wave.shared_gpus) == (0, 0, 0, 0), wave
        assert wave.phase.controller_requests[DUAL_PODS] > 0, "FMA's own count: client-go's rest_client_requests"
    assert (len(first.latencies), len(swap.latencies)) == (4, 2)
    assert result.idle_phase is not None
    phases = [result.populator_phase, result.idle_phase, first.phase, swap.phase]
    patched = sum(phase.requests_by_call.get("PATCH pods", 0) for phase in phases)
    refused = [call for phase in phases for call in phase.refusals_by_call if call.startswith("PATCH pods ")]
    assert patched >= 4, "each launcher's notifier patched its signature onto its Pod"
    assert not refused, "the notifiers' patches allowed (FMA's e2e grants them)"
    for component in (DUAL_PODS, POPULATOR):
        assert result.controllers[component].cpu_seconds > 0
