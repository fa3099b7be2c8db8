"""Fixtures shared by the unit and integration tests: tiny models built offline."""

from pathlib import Path

import pytest

from e2e.tiny_model import ensure_tiny_model


@pytest.fixture(scope="session")
def model_a() -> Path:
    return ensure_tiny_model(seed=1)


@pytest.fixture(scope="session")
def model_b() -> Path:
    return ensure_tiny_model(seed=2)
