"""The repository's layout: every directory of modules is a regular package."""

import pytest

from tests.imports import REPO, modules_under

PACKAGES = ("api", "controller", "launcher", "requester", "standin", "transformers_runtime", "e2e", "scripts", "tests")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_directory_of_modules_is_a_regular_package(package: str) -> None:
    """No implicit namespace packages: mypy, pytest and setuptools' package discovery all see the same modules."""
    directories = {source.parent for _, source in modules_under(package)}
    assert sorted(str(d.relative_to(REPO)) for d in directories if not (d / "__init__.py").is_file()) == []
