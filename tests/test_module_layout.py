"""The repository's layout: every directory of modules is a regular package, and the layers import one way.

The layers, each importing only from the ones it declares below it (`LAYERS`):

    api                          the wire: CRDs, labels, bodies, vLLM's HTTP surface
    kube, gocompat               the Kubernetes toolkit (client, informers, work queue, leader election);
                                 Go's behaviour where FMA's Go components define the wire (YAML, JSON, templates)
    standin, transformers_runtime, requester
                                 the runtimes a launcher forks; the requester
    controller, launcher         the two controllers; the launcher (which imports the runtimes it forks)
    scripts                      builds what the rest consumes (images, renderings, the build-once cache) and
                                 draws the docs' diagrams from the code (the phase table)
    e2e                          the loopback cluster and what runs on it; its kubelet (e2e.kubelet) stands on
                                 the toolkit alone, as a kubelet knows nothing of dualpods' components
    tests, bench                 anything below

The check goes both ways: no import outside a package's declared layers, and no declared layer the package does
not use (so the table says what the code does). And no module of the repository takes part in an import cycle.
"""

from collections.abc import Iterable
from graphlib import CycleError, TopologicalSorter

import pytest

from tests.imports import REPO, imported, modules_under

PACKAGES = (
    "api",
    "gocompat",
    "kube",
    "controller",
    "launcher",
    "requester",
    "standin",
    "transformers_runtime",
    "e2e",
    "scripts",
    "tests",
)
# What each package (e2e's kubelet apart) may import of the others.
LAYERS: dict[str, frozenset[str]] = {
    "api": frozenset(),
    "kube": frozenset({"api"}),
    "gocompat": frozenset({"api"}),
    "standin": frozenset({"api"}),
    "transformers_runtime": frozenset({"api"}),
    "requester": frozenset({"api"}),
    "controller": frozenset({"api", "kube", "gocompat"}),
    "launcher": frozenset({"api", "standin", "transformers_runtime"}),
    "scripts": frozenset({"api", "controller"}),
    "e2e": frozenset({"api", "kube", "controller", "launcher", "requester", "standin", "scripts"}),
}
# The loopback kubelet (e2e.kubelet) knows nothing of dualpods' components, as a real kubelet does not.
KUBELET_MAY_IMPORT = frozenset({"api", "kube", "scripts", "e2e"})


def imports_by_package(packages: Iterable[str]) -> dict[str, set[str]]:
    """The other top-level packages of the repository that each of `packages` imports, read from every module's
    source (function-level imports too)."""
    return {
        package: {
            name.split(".")[0]
            for module, source in modules_under(package)
            for name in imported(module, source)
            if name.split(".")[0] in PACKAGES
        }
        - {package}
        for package in packages
    }


@pytest.mark.parametrize("package", PACKAGES)
def test_every_directory_of_modules_is_a_regular_package(package: str) -> None:
    """No implicit namespace packages: mypy, pytest and setuptools' package discovery all see the same modules."""
    directories = {source.parent for _, source in modules_under(package)}
    assert sorted(str(d.relative_to(REPO)) for d in directories if not (d / "__init__.py").is_file()) == []


def test_every_package_imports_only_from_its_declared_layers() -> None:
    used = imports_by_package(LAYERS)
    assert {name: sorted(layers - LAYERS[name]) for name, layers in used.items() if layers - LAYERS[name]} == {}


def test_every_declared_layer_is_used() -> None:
    used = imports_by_package(LAYERS)
    assert {name: sorted(LAYERS[name] - layers) for name, layers in used.items() if LAYERS[name] - layers} == {}


def test_the_loopback_kubelet_imports_none_of_dualpods_components() -> None:
    used = {
        name.split(".")[0]
        for module, source in modules_under("e2e/kubelet")
        for name in imported(module, source)
        if name.split(".")[0] in PACKAGES
    }
    assert sorted(used - KUBELET_MAY_IMPORT) == []


def test_the_layers_form_no_cycle() -> None:
    """Read as a graph, the table itself goes one way: no package reaches back to itself."""

    def reaches(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for nxt in LAYERS.get(todo.pop(), frozenset()) - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    assert sorted(name for name in LAYERS if name in reaches(name)) == []


def test_no_module_is_part_of_an_import_cycle() -> None:
    """A cycle makes the order modules load in matter and hides which one is the foundation (module-level and
    function-level imports alike)."""
    sources = {module: source for package in PACKAGES for module, source in modules_under(package)}
    graph = {
        module: {name for name in imported(module, source) if name in sources} - {module}
        for module, source in sources.items()
    }
    assert import_cycle(graph) == []


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` (its first node repeated at the end), or [] when there is none."""
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as error:
        return list(error.args[1])
    return []


def test_a_cycle_is_found() -> None:
    assert sorted(import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})[:3]) == ["a", "b", "c"]
    assert import_cycle({"a": {"b"}, "b": set()}) == []
