"""The launcher's modules import one another without a cycle: each can be read, and tested, above the ones it uses.

Every import counts (function-level and `TYPE_CHECKING` ones too): a cycle hidden behind either is still two
modules that cannot be understood apart.
"""

import graphlib

import pytest

from tests.imports import imported, modules_under


def _graph(package: str) -> dict[str, set[str]]:
    """Each module of `package` and the modules of `package` it imports (the package's `__init__` left out: importing
    `from . import x` names it without using it)."""
    return {
        module: {name for name in imported(module, source) if name.startswith(f"{package}.") and name != module}
        for module, source in modules_under(package)
        if module != package
    }


def test_the_graph_finds_a_cycle() -> None:
    """The check itself: a graph with a cycle is refused, and the error names the cycle."""
    sorter = graphlib.TopologicalSorter({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    with pytest.raises(graphlib.CycleError) as cycle:
        sorter.prepare()
    assert set(cycle.value.args[1]) == {"a", "b", "c"}


def test_the_launchers_modules_import_one_another_without_a_cycle() -> None:
    graph = _graph("launcher")
    assert {"launcher.instance", "launcher.monitor", "launcher.instances"} <= graph.keys()
    assert "launcher.instance" in graph["launcher.monitor"], "the graph holds the imports"
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as cycle:
        raise AssertionError(f"an import cycle among the launcher's modules: {' -> '.join(cycle.args[1])}") from None
