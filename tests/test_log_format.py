"""One log format for every component (`--log-format text|json`, api/log_format.py), and the launcher's copy
of each instance's output to its stdout (launcher/output_relay.py)."""

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api import log_format
from launcher import output_relay
from launcher.instance import InstanceEnd


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The root logger and the instance-output logger as `configure` leaves them, into one buffer; restored after."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, output_relay.output_log.handlers[:], output_relay.output_log.propagate)
    yield io.StringIO()
    root.handlers[:], root.level = saved[0], saved[1]
    output_relay.output_log.handlers[:], output_relay.output_log.propagate = saved[2], saved[3]


def test_json_lines_carry_the_components_fields_and_extras(captured: io.StringIO) -> None:
    log_format.configure("requester", "info", "json", stream=captured, requester="req-1")
    logging.getLogger("requester.spi").info("setting ready", extra={"ready": True, "instance": "i-1"})
    line = json.loads(captured.getvalue())
    assert {k: line[k] for k in ("level", "component", "requester", "instance", "logger", "msg", "ready")} == {
        "level": "INFO",
        "component": "requester",
        "requester": "req-1",
        "instance": "i-1",
        "logger": "requester.spi",
        "msg": "setting ready",
        "ready": True,
    }
    assert line["time"].endswith("+00:00")


def test_text_lines_carry_the_same_fields(captured: io.StringIO) -> None:
    log_format.configure("controller", "info", "text", stream=captured)
    logging.getLogger("controller.dualpods").warning("bound %s", "r", extra={"requester": "r", "instance": "i"})
    # Only this logger's line: the root handler also takes what other threads of the session log meanwhile.
    (line,) = [line for line in captured.getvalue().splitlines() if " controller.dualpods: " in line]
    assert line.split(" ", 1)[1] == "WARNING controller controller.dualpods: bound r requester=r instance=i"


def test_what_a_record_factory_adds_to_every_record_is_no_field(captured: io.StringIO) -> None:
    """vLLM, once imported (as in the launcher), adds `vllm_process_name` to every record through its factory."""
    plain = logging.getLogRecordFactory()

    def stamping(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = plain(*args, **kwargs)
        record.stamp = "MainProcess"
        return record

    logging.setLogRecordFactory(stamping)
    try:
        log_format.configure("launcher", "info", "text", stream=captured)
        logging.getLogger("launcher.instances").info("ready", extra={"instance": "i"})
    finally:
        logging.setLogRecordFactory(plain)
    (line,) = [line for line in captured.getvalue().splitlines() if " launcher.instances: " in line]
    assert line.split(" ", 1)[1] == "INFO launcher launcher.instances: ready instance=i"


def test_every_component_takes_the_flag() -> None:
    from controller.__main__ import parse_args as controller_args
    from launcher.__main__ import parse_args as launcher_args
    from requester.__main__ import parse_args as requester_args
    from transformers_runtime.cli import build_parser

    assert controller_args(["dual-pods", "-n", "ns", "--log-format", "json"]).log_format == "json"
    assert launcher_args(["--log-format", "json"]).log_format == "json"
    assert launcher_args([]).log_format == "text"
    open_spi = ["--spi-auth", "none"]
    assert requester_args(open_spi).log_format == "json"  # E10: the requester's lines were JSON before the flag
    assert requester_args([*open_spi, "--log-format", "text"]).log_format == "text"
    assert build_parser().parse_known_args(["--model", "m", "--log-format", "json"])[0].log_format == "json"
    with pytest.raises(SystemExit):
        launcher_args(["--log-format", "xml"])


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ("(APIServer pid=7) INFO 12-01 12:05:20 [launcher.py:186] Available routes are:", logging.INFO),
        ("(EngineCore pid=8) WARNING 12-01 12:05:19 [cpu.py:1] slow", logging.WARNING),
        ("ERROR:    Exception in ASGI application", logging.ERROR),
        ("Traceback (most recent call last):", logging.INFO),
    ],
)
def test_an_instance_lines_level_is_the_one_it_names(line: str, level: int) -> None:
    assert output_relay.level_of(line) == level


async def test_an_instances_lines_are_copied_prefixed_until_it_is_done(captured: io.StringIO, tmp_path: Path) -> None:
    output_relay.configure("text")
    output_relay.output_log.handlers[0].setStream(captured)  # type: ignore[attr-defined]
    log = tmp_path / "log"
    log.write_bytes(b"")
    end = InstanceEnd()
    copying = asyncio.ensure_future(output_relay.follow(log, "inst-1", end))
    with log.open("ab") as out:
        out.write(b'INFO:     Started server\nINFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n')
        out.flush()
        await asyncio.sleep(output_relay.POLL_S * 2)
        assert captured.getvalue() == "inst-1 | INFO:     Started server\n"  # the probe's access line left out
        out.write(b"x" * (output_relay.MAX_LINE_BYTES + 5) + b"\nlast words, no newline")
    end.mark_exited()
    await asyncio.wait_for(copying, 5)
    lines = captured.getvalue().splitlines()
    assert [len(line) for line in lines[1:3]] == [len("inst-1 | ") + output_relay.MAX_LINE_BYTES, len("inst-1 | ") + 5]
    assert lines[3] == "inst-1 | last words, no newline"


async def test_a_copy_cancelled_while_it_waits_for_more_ends_cancelled(captured: io.StringIO, tmp_path: Path) -> None:
    """The launcher's shutdown cancels the copies: a copy between two polls ends at once, as cancelled."""
    output_relay.configure("text")
    output_relay.output_log.handlers[0].setStream(captured)  # type: ignore[attr-defined]
    log = tmp_path / "log"
    log.write_bytes(b"first line\n")
    copying = asyncio.ensure_future(output_relay.follow(log, "inst-1", InstanceEnd()))
    async with asyncio.timeout(5):
        while True:  # the copy polls the file: so does the test
            if captured.getvalue():
                break
            await asyncio.sleep(0.01)
    await asyncio.sleep(output_relay.POLL_S / 2)  # waiting for the next poll
    copying.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):  # a cancel lands within a turn of the loop; 5 s only says it did not hang
            await copying
    assert copying.cancelled()
    with log.open("ab") as out:
        out.write(b"written after the copy ended\n")
    await asyncio.sleep(output_relay.POLL_S * 2)
    assert captured.getvalue() == "inst-1 | first line\n"


def test_lines_written_within_a_log_context_carry_its_fields(captured: io.StringIO) -> None:
    log_format.configure("controller", "info", "json", stream=captured)
    with log_format.log_context(requester="req-1", pass_id="7"), log_format.log_context(phase="serving"):
        logging.getLogger("controller.dualpods.writer").info("updated")
    logging.getLogger("controller.dualpods.writer").info("after")
    inside, after = (json.loads(line) for line in captured.getvalue().splitlines())
    assert {k: inside[k] for k in ("requester", "pass_id", "phase")} == {"requester": "req-1", "pass_id": "7",
                                                                        "phase": "serving"}  # fmt: skip
    assert not {"requester", "pass_id", "phase"} & after.keys()
