"""Fixtures shared by the unit and integration tests: tiny models built offline, the controller's log lines."""

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from api import log_format
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


PHASE_REPORT = Path("build/phase-transitions.txt")  # under the root of the run (the session's rootpath)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Write the phase table's declared edges that no recorded pass crossed (tests/phase_transitions.py), and the
    tests whose passes ran each phase's step, to PHASE_REPORT: the run itself ends with pytest's summary."""
    if not RECORDER.passes:
        return
    unseen = RECORDER.unseen()
    lines = [f"{len(RECORDER.seen)} declared phase transitions exercised; {len(unseen)} not:"]
    lines += [f"  {before.value} → {after.value}" for before, after in unseen]
    for phase, tests in sorted(RECORDER.tests_by_phase.items(), key=lambda item: list(Phase).index(item[0])):
        lines.append(f"{phase.value}: {len(tests)} tests")
        lines += [f"  {test}" for test in sorted(tests)]
    report = terminalreporter.config.rootpath / PHASE_REPORT
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text("\n".join(lines) + "\n")


CONTROLLER_LOGGERS = ("controller", "kube")  # the controllers' packages: their own code and the toolkit's


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """The controller's log lines as `--log-format json` writes them (each pass's context fields included), from
    DEBUG up."""
    stream = io.StringIO()
    handler = log_format.handler("json", "controller", stream)
    loggers = [logging.getLogger(name) for name in CONTROLLER_LOGGERS]
    saved = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    yield stream
    for logger, level in zip(loggers, saved, strict=True):
        logger.removeHandler(handler)
        logger.setLevel(level)
