"""Fixtures shared by the unit and integration tests: tiny models built offline."""

from pathlib import Path

import pytest

from controller.dualpods.phases import Phase
from e2e.tiny_model import ensure_tiny_model
from tests.phase_transitions import RECORDER, Exported

_WORKER_OUTPUT_KEY = "phase_transitions"


@pytest.fixture(scope="session")
def model_a() -> Path:
    return ensure_tiny_model(seed=1)


@pytest.fixture(scope="session")
def model_b() -> Path:
    return ensure_tiny_model(seed=2)


@pytest.fixture(autouse=True)
def _phase_recorder_test(request: pytest.FixtureRequest) -> None:
    """Name the running test to the phase transition recorder, which groups step tests by phase."""
    RECORDER.test = request.node.nodeid


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pytest-xdist worker hands its recorder's findings to the controller, which prints the summary."""
    output: dict[str, object] | None = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[_WORKER_OUTPUT_KEY] = RECORDER.exported()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """pytest-xdist's controller: a worker ended; its findings join the session's."""
    exported: Exported | None = getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT_KEY)
    if exported is not None:
        RECORDER.merge(exported)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The phase table's declared edges that no driven pass exercised (tests/phase_transitions.py); with -v,
    the tests whose passes ran each phase's step."""
    if not RECORDER.passes:
        return
    unseen = RECORDER.unseen()
    terminalreporter.section("phase transitions")
    terminalreporter.write_line(f"{len(RECORDER.seen)} declared phase transitions exercised; {len(unseen)} not:")
    for before, after in unseen:
        terminalreporter.write_line(f"  {before.value} → {after.value}")
    if terminalreporter.config.get_verbosity() > 0:
        for phase, tests in sorted(RECORDER.tests_by_phase.items(), key=lambda item: list(Phase).index(item[0])):
            terminalreporter.write_line(f"{phase.value}: {len(tests)} tests")
            for test in sorted(tests):
                terminalreporter.write_line(f"  {test}")
