import pytest

pytest_plugins = ["e2e.fixtures", "e2e.failure_logs"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of the built images run last: `make test` builds the images in the background while the
    others run, and pytest-xdist hands out test files in this order."""
    items.sort(key=lambda item: item.get_closest_marker("images") is not None)
