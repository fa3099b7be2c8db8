"""Launcher phases and `fma_launcher_pod_count` (FMA's metrics_test.go): classification at the exact
thresholds, aggregation over Nodes, explicit zeros, and series lifetimes tied to the LauncherConfig
and its launchers."""

from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.populator.key import LauncherKey
from controller.populator.metrics import NAME, LauncherPodCount
from controller.populator.phases import LauncherPodPhase, phase_of, tally
from tests.test_populator_fakes import NOW, THRESHOLDS, launcher

CURRENT = "hash-current"
LONG_AGO = NOW - timedelta(minutes=10)  # beyond both thresholds
RECENTLY = NOW - timedelta(minutes=1)  # within both
AGES: dict[str, dict[str, Any]] = {
    "young": {"created": RECENTLY, "scheduled": RECENTLY},
    "old-unscheduled": {"created": LONG_AGO},
    "old-scheduled-long-ago": {"created": LONG_AGO, "scheduled": LONG_AGO},
    "old-scheduled-recently": {"created": LONG_AGO, "scheduled": RECENTLY},
}
HASHES = {"current": CURRENT, "superseded": "hash-old", "absent": None}


def classify(pod: dict[str, Any], current: str | None = CURRENT) -> LauncherPodPhase:
    return phase_of(pod, current, THRESHOLDS, NOW)[0]


@pytest.mark.parametrize("age", AGES)
@pytest.mark.parametrize("ready", [True, False])
@pytest.mark.parametrize("hash_", HASHES)
def test_bound_launchers_are_bound_whatever_else_holds(hash_: str, ready: bool, age: str) -> None:
    assert classify(launcher("l", HASHES[hash_], bound=True, ready=ready, **AGES[age])) is LauncherPodPhase.BOUND


@pytest.mark.parametrize("age", AGES)
@pytest.mark.parametrize("ready", [True, False])
@pytest.mark.parametrize("hash_", ["superseded", "absent"])
def test_unbound_launchers_of_another_template_are_stale(hash_: str, ready: bool, age: str) -> None:
    assert classify(launcher("l", HASHES[hash_], ready=ready, **AGES[age])) is LauncherPodPhase.STALE


@pytest.mark.parametrize(
    ("age", "ready", "phase"),
    [
        ("young", True, LauncherPodPhase.UNBOUND),
        ("old-unscheduled", True, LauncherPodPhase.UNBOUND),
        ("old-scheduled-long-ago", True, LauncherPodPhase.UNBOUND),
        ("old-scheduled-recently", True, LauncherPodPhase.UNBOUND),
        ("young", False, LauncherPodPhase.UNBOUND),
        ("old-unscheduled", False, LauncherPodPhase.STUCK_SCHEDULING),
        ("old-scheduled-long-ago", False, LauncherPodPhase.STUCK_STARTING),
        ("old-scheduled-recently", False, LauncherPodPhase.UNBOUND),  # measured from scheduling, not creation
    ],
)
def test_unbound_launchers_on_the_current_template_by_readiness_and_age(
    age: str, ready: bool, phase: LauncherPodPhase
) -> None:
    assert classify(launcher("l", CURRENT, ready=ready, **AGES[age])) is phase


def test_without_a_usable_launcher_config_every_unbound_launcher_is_stale() -> None:
    assert classify(launcher("l", CURRENT, ready=True), current=None) is LauncherPodPhase.STALE
    assert classify(launcher("l", CURRENT, bound=True), current=None) is LauncherPodPhase.BOUND


def test_stuck_scheduling_starts_exactly_at_its_threshold_after_creation() -> None:
    threshold = timedelta(seconds=THRESHOLDS.scheduling)
    at = launcher("l", CURRENT, created=NOW - threshold)
    just_before = launcher("l", CURRENT, created=NOW - threshold + timedelta(seconds=1))
    assert phase_of(at, CURRENT, THRESHOLDS, NOW) == (LauncherPodPhase.STUCK_SCHEDULING, None)
    assert phase_of(just_before, CURRENT, THRESHOLDS, NOW) == (LauncherPodPhase.UNBOUND, NOW + timedelta(seconds=1))


def test_stuck_starting_starts_exactly_at_its_threshold_after_scheduling() -> None:
    threshold = timedelta(seconds=THRESHOLDS.starting)
    at = launcher("l", CURRENT, created=LONG_AGO, scheduled=NOW - threshold)
    just_before = launcher("l", CURRENT, created=LONG_AGO, scheduled=NOW - threshold + timedelta(seconds=1))
    assert phase_of(at, CURRENT, THRESHOLDS, NOW) == (LauncherPodPhase.STUCK_STARTING, None)
    assert phase_of(just_before, CURRENT, THRESHOLDS, NOW) == (LauncherPodPhase.UNBOUND, NOW + timedelta(seconds=1))


def test_tally_counts_phases_and_finds_the_earliest_transition_of_launchers_not_being_deleted() -> None:
    pods = [
        launcher("bound", CURRENT, bound=True),
        launcher("stale", "hash-old"),
        launcher("ready", CURRENT, ready=True),
        launcher("stuck", CURRENT, created=LONG_AGO),
        launcher("later", CURRENT, created=NOW - timedelta(seconds=60)),  # stuck in 60 s
        launcher("sooner", CURRENT, created=NOW - timedelta(seconds=100)),  # stuck in 20 s
        launcher("going", CURRENT, created=NOW - timedelta(seconds=110), deleting=True),  # not scheduled for
    ]
    counts, earliest = tally(pods, CURRENT, THRESHOLDS, NOW)
    assert counts == {
        LauncherPodPhase.BOUND: 1,
        LauncherPodPhase.STALE: 1,
        LauncherPodPhase.UNBOUND: 4,
        LauncherPodPhase.STUCK_SCHEDULING: 1,
    }
    assert earliest == NOW + timedelta(seconds=20)


def series(registry: CollectorRegistry, config: str) -> dict[str, float]:
    """The config's series as a scrape sees them, by phase (absent series are absent here)."""
    return {
        sample.labels["phase"]: sample.value
        for metric in registry.collect()
        if metric.name == NAME
        for sample in metric.samples
        if sample.labels["lcfg_name"] == config
    }


def phases(**counts: float) -> dict[str, float]:
    return {"bound": 0, "unbound": 0, "stuck_scheduling": 0, "stuck_starting": 0, "stale": 0, **counts}


@pytest.fixture
def gauge() -> tuple[LauncherPodCount, CollectorRegistry]:
    registry = CollectorRegistry()
    return LauncherPodCount(registry), registry


def test_counts_are_summed_over_nodes_with_explicit_zeros_and_replaced_per_key(
    gauge: tuple[LauncherPodCount, CollectorRegistry],
) -> None:
    metrics, registry = gauge
    a, b = LauncherKey("node-a", "lc"), LauncherKey("node-b", "lc")
    metrics.publish(a, {LauncherPodPhase.UNBOUND: 2})
    metrics.publish(b, {LauncherPodPhase.UNBOUND: 1, LauncherPodPhase.STUCK_STARTING: 1})
    assert series(registry, "lc") == phases(unbound=3, stuck_starting=1)
    metrics.publish(a, {LauncherPodPhase.UNBOUND: 5, LauncherPodPhase.BOUND: 1})  # replaces node-a's, not added to it
    assert series(registry, "lc") == phases(bound=1, unbound=6, stuck_starting=1)
    metrics.publish(a, {})
    assert series(registry, "lc") == phases(unbound=1, stuck_starting=1)


def test_series_go_once_neither_the_launcher_config_nor_any_launcher_remains(
    gauge: tuple[LauncherPodCount, CollectorRegistry],
) -> None:
    metrics, registry = gauge
    key = LauncherKey("node-a", "lc")
    metrics.set_config_exists("lc", True)
    assert series(registry, "lc") == phases(), "a LauncherConfig without launchers has zeros"
    metrics.publish(key, {LauncherPodPhase.UNBOUND: 1})
    metrics.set_config_exists("lc", False)
    assert series(registry, "lc") == phases(unbound=1), "its launchers outlive it"
    metrics.publish(key, {LauncherPodPhase.STALE: 1})
    assert series(registry, "lc") == phases(stale=1)
    metrics.publish(key, {})
    assert series(registry, "lc") == {}


def test_launchers_keep_series_until_the_last_node_has_none(gauge: tuple[LauncherPodCount, CollectorRegistry]) -> None:
    metrics, registry = gauge
    metrics.publish(LauncherKey("node-a", "lc"), {LauncherPodPhase.UNBOUND: 1})
    metrics.publish(LauncherKey("node-b", "lc"), {LauncherPodPhase.BOUND: 1})
    metrics.publish(LauncherKey("node-a", "lc"), {})
    assert series(registry, "lc") == phases(bound=1)
    metrics.publish(LauncherKey("node-b", "lc"), {})
    assert series(registry, "lc") == {}


def test_nothing_to_publish_for_an_unknown_key_makes_no_series(
    gauge: tuple[LauncherPodCount, CollectorRegistry],
) -> None:
    metrics, registry = gauge
    metrics.publish(LauncherKey("node-a", "never"), {})
    assert series(registry, "never") == {}


def test_launcher_configs_are_independent(gauge: tuple[LauncherPodCount, CollectorRegistry]) -> None:
    metrics, registry = gauge
    metrics.publish(LauncherKey("node-a", "x"), {LauncherPodPhase.UNBOUND: 2})
    metrics.publish(LauncherKey("node-a", "y"), {LauncherPodPhase.STUCK_SCHEDULING: 1})
    metrics.publish(LauncherKey("node-a", "x"), {})
    assert series(registry, "x") == {}
    assert series(registry, "y") == phases(stuck_scheduling=1)
