"""Logs a person can follow (controller/dualpods/reconcile.py, passes.py): every line of a pass carries the
requester, its phase and a pass ID; a change of phase is logged at INFO once; a warning about an object is an
Event on it too."""

import io
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.test_dualpods_fakes import REQ, Harness, harness, isc_obj, lc_obj, node_obj, requester_obj
from tests.test_dualpods_phases import setup_lost


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with harness() as made:
        made.put(node_obj(), isc_obj(), lc_obj())
        yield made


def records(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_every_line_of_a_pass_carries_the_requester_the_phase_and_the_pass(
    h: Harness, lines: io.StringIO
) -> None:
    h.put(requester_obj(gpus=None))
    await h.drive()
    found = records(lines)
    assert found
    assert all(r["requester"] == REQ and r["phase"] and r["pass_id"] for r in found)
    assert len({r["pass_id"] for r in found}) > 1  # one ID per pass


async def test_a_change_of_phase_is_logged_at_info_once(h: Harness, lines: io.StringIO) -> None:
    h.put(requester_obj(gpus=None))
    await h.drive()
    await h.reconcile()  # no change of phase
    changes = [r for r in records(lines) if r["level"] == "INFO" and "→" in r["msg"]]
    phases = [r["phase"] for r in changes]
    assert phases == list(dict.fromkeys(phases)), "one line per change"
    assert phases[0] == "needs-gpus"
    assert changes[0]["msg"] == f"requester {REQ}: (new) → needs-gpus"


async def test_a_warning_about_an_object_is_an_event_on_it(h: Harness, lines: io.StringIO) -> None:
    setup_lost(h)
    await h.reconcile()
    (event,) = h.journal.of("event")
    assert (event.target, event.detail[:2]) == (REQ, ("Warning", "InstanceLost"))
    (warning,) = [r for r in records(lines) if r["level"] == "WARNING"]
    assert (warning["reason"], warning["phase"]) == ("InstanceLost", "lost")
    assert warning["msg"].endswith(event.detail[2])
