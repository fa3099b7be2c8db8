"""The collector's thresholds for caching processes: a growing cache of API objects no longer makes the collector
walk the whole heap again and again, and reference cycles are still collected."""

import json
import subprocess
import sys

import pytest

# A cache growing to 600,000 objects (as a kubelet's or a controller's does as Pods come), then 100,000
# two-object cycles left as garbage (as exceptions with their tracebacks are).
GROWTH = """
import gc, json, sys
from kube.gc_thresholds import tune_for_caches

class Model:  # as kubernetes-asyncio's models: class instances, which the collector tracks
    def __init__(self, name, spec):
        self.name, self.spec = name, spec

if sys.argv[1] == "tuned":
    tune_for_caches()
full_before = gc.get_stats()[2]["collections"]
cache = {i: Model(str(i), [Model("container", i)]) for i in range(200_000)}
full = gc.get_stats()[2]["collections"] - full_before
collected_before = sum(generation["collected"] for generation in gc.get_stats())
for _ in range(100_000):
    a, b = Model("a", None), Model("b", None)
    a.spec, b.spec = b, a
collected = sum(generation["collected"] for generation in gc.get_stats()) - collected_before
print(json.dumps({"full": full, "collected": collected, "frozen": gc.get_freeze_count()}))
"""


def _grow(mode: str) -> dict[str, int]:
    done = subprocess.run([sys.executable, "-c", GROWTH, mode], capture_output=True, text=True, check=True, timeout=60)
    answer: dict[str, int] = json.loads(done.stdout)
    return answer


@pytest.mark.parametrize("mode", ["default", "tuned"])
def test_a_growing_cache_walks_the_heap_only_with_the_default_thresholds(mode: str) -> None:
    seen = _grow(mode)
    if mode == "default":
        assert seen["full"] >= 3, f"CPython's own thresholds walk the growing heap again and again: {seen}"
    else:
        assert seen["full"] == 0, seen
        assert seen["frozen"] > 1_000, "what the imports made is out of the collector's sight"
    assert seen["collected"] >= 100_000, f"the cycles are still found among the young objects: {seen}"
