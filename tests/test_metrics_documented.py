"""Every metric the components export is in docs/api.md's tables (by its full name, as Prometheus shows it),
and every name those tables give is one a component exports: a dashboard built from the docs finds its series."""

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from controller.dualpods.metrics import DualPodsMetrics
from controller.populator.metrics import LauncherPodCount
from kube.client import ApiMetrics
from kube.passclock import own_seconds_histogram
from launcher.metrics import LauncherMetrics
from requester.metrics import RequesterMetrics
from transformers_runtime.metrics import Metrics as RuntimeMetrics

API_DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"
# A table row that names a metric: its first cell, one backquoted name (ours and FMA's; the transformers
# runtime's `vllm:*` ones are vLLM's own).
ROW = re.compile(r"^\| `((?:dualpods|fma)_[a-z_]+)`", re.MULTILINE)


def exported() -> set[str]:
    """Each component's metric names, as a scrape shows them (counters with `_total`)."""
    launcher = LauncherMetrics()
    launcher.count_instances_with(dict)
    launcher.sample_zygotes_with(list)
    dual_pods = CollectorRegistry()
    DualPodsMetrics(dual_pods)  # its own-seconds histogram included
    ApiMetrics(dual_pods)
    populator = CollectorRegistry()
    LauncherPodCount(populator)
    own_seconds_histogram(populator)
    runtime = RuntimeMetrics("tiny")
    runtime.watch(int, int, lambda: None, int, float)
    registries = [launcher.registry, RequesterMetrics().registry, dual_pods, populator, runtime.registry]
    return {
        family.name + ("_total" if family.type == "counter" else "")
        for registry in registries
        for family in registry.collect()
        if not family.name.startswith("vllm:")
    }


def test_every_exported_metric_is_documented_and_every_documented_one_exported() -> None:
    documented = set(ROW.findall(API_DOC.read_text()))
    assert sorted(exported() - documented) == [], "exported but not in docs/api.md"
    assert sorted(documented - exported()) == [], "in docs/api.md but exported by no component"
