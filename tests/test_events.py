"""The one object logger (kube/events.py): what a controller says about an object is a log line at the
level its Event type asks for, within the running pass's context, and an Event on the object."""

import io
import json
from typing import Any

from api import log_format
from kube import events
from kube.workqueue import pass_context

LAUNCHER_POD = {"kind": "Pod", "metadata": {"name": "launcher-1", "namespace": "ns"}}
POLICY = {"kind": "LauncherPopulationPolicy", "metadata": {"name": "policy-1", "namespace": "ns"}}


class Recorded:
    """An EventSink that keeps what it is given."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    async def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((obj["metadata"]["name"], type_, reason, message))


def records(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_a_warning_is_logged_at_warning_and_a_note_at_info_each_an_event_too(lines: io.StringIO) -> None:
    sink = Recorded()
    await events.warn(sink, LAUNCHER_POD, "DrainStranded", "sleeping instance i-1 cannot be copied")
    await events.note(sink, POLICY, "PoolFilled", "3 sleepers")
    assert sink.events == [
        ("launcher-1", "Warning", "DrainStranded", "sleeping instance i-1 cannot be copied"),
        ("policy-1", "Normal", "PoolFilled", "3 sleepers"),
    ]
    warning, note = records(lines)
    assert (warning["level"], warning["reason"], warning["object"]) == ("WARNING", "DrainStranded", "Pod/launcher-1")
    assert warning["msg"].endswith("sleeping instance i-1 cannot be copied")
    assert (note["level"], note["object"]) == ("INFO", "LauncherPopulationPolicy/policy-1")


async def test_what_is_said_within_a_pass_carries_the_pass_context(lines: io.StringIO) -> None:
    with pass_context(**{log_format.LAUNCHER_FIELD: "launcher-1"}):
        await events.warn(Recorded(), LAUNCHER_POD, "DrainRewarmTimeout", "letting the drain evict it")
    (line,) = records(lines)
    assert line["launcher"] == "launcher-1"
    assert line["pass_id"]
