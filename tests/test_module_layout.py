"""The repository's layout: every directory of modules is a regular package, and the layers import one way.

`scripts/` builds what the rest consumes (images, the chart's renderings, the build-once cache), so `e2e/`
may import it but `scripts/` never imports `e2e/`: the loopback cluster and its tests sit above the tooling.
"""

import pytest

from tests.imports import REPO, imported, modules_under

PACKAGES = ("api", "controller", "launcher", "requester", "standin", "transformers_runtime", "e2e", "scripts", "tests")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_directory_of_modules_is_a_regular_package(package: str) -> None:
    """No implicit namespace packages: mypy, pytest and setuptools' package discovery all see the same modules."""
    directories = {source.parent for _, source in modules_under(package)}
    assert sorted(str(d.relative_to(REPO)) for d in directories if not (d / "__init__.py").is_file()) == []


def test_scripts_never_import_e2e() -> None:
    offenders = [
        f"{module} imports {name}"
        for module, source in modules_under("scripts")
        for name in imported(module, source)
        if name == "e2e" or name.startswith("e2e.")
    ]
    assert offenders == []
