"""Processes the cluster starts, recorded on disk so that `down` (maybe another process) stops exactly them.

Each one runs in its own session (process group = its PID). A record holds the PID and the process's
start time, so a recycled PID is never signalled by mistake.
"""

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import psutil
from pydantic import BaseModel


class ProcessRecord(BaseModel):
    """What `down` needs to find and stop one process."""

    name: str
    pid: int
    create_time: float
    argv: list[str]
    log: str


def spawn(
    name: str,
    argv: list[str],
    *,
    log: Path,
    record_dir: Path,
    die_with_parent: bool,
    env: dict[str, str] | None = None,
) -> "subprocess.Popen[bytes]":
    """Start `argv` in a new session with output to `log`, and record it under `record_dir`.

    `die_with_parent` makes the kernel send SIGTERM when the calling thread dies (a pytest session
    killed hard), so a test run cannot leak a control plane.
    """
    command = ["setpriv", "--pdeathsig", "TERM", "--", *argv] if die_with_parent else argv
    record_dir.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    _record(process, name, command, log, record_dir / f"{len(list(record_dir.glob('*.json'))):02d}-{name}.json")
    return process


def _record(process: "subprocess.Popen[bytes]", name: str, argv: list[str], log: Path, path: Path) -> None:
    record = ProcessRecord(
        name=name, pid=process.pid, create_time=psutil.Process(process.pid).create_time(), argv=argv, log=str(log)
    )
    path.write_text(record.model_dump_json())


def start_again(record_dir: Path, name: str) -> "subprocess.Popen[bytes]":
    """Start the recorded process `name` again (after it was stopped), as it was started; its record is
    replaced, so `down` stops the new one."""
    path = next(
        p for p in sorted(record_dir.glob("*.json")) if ProcessRecord.model_validate_json(p.read_text()).name == name
    )
    old = ProcessRecord.model_validate_json(path.read_text())
    if is_running(old):
        raise RuntimeError(f"{name} is still running")
    log = Path(old.log)
    with log.open("ab") as out:
        process = subprocess.Popen(
            old.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    _record(process, name, old.argv, log, path)
    return process


def by_name(record_dir: Path, name: str) -> ProcessRecord:
    return next(r for r in records(record_dir) if r.name == name)


def _process(record: ProcessRecord) -> psutil.Process | None:
    """The live process behind `record`, or None when it is gone (or its PID was recycled)."""
    try:
        process = psutil.Process(record.pid)
        if process.create_time() != record.create_time or process.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.NoSuchProcess:
        return None
    return process


def is_running(record: ProcessRecord) -> bool:
    return _process(record) is not None


def stop(recorded: list[ProcessRecord], grace_seconds: float) -> None:
    """SIGTERM every process group at once, SIGKILL the survivors after `grace_seconds`; returns once
    all are gone."""
    live = [(r, p) for r in recorded if (p := _process(r)) is not None]
    for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 10.0)):
        for record, _ in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, sig)
        _, alive = psutil.wait_procs([p for _, p in live], timeout=wait)
        live = [(r, p) for r, p in live if p in alive]
        if not live:
            return
    raise RuntimeError(f"{[r.name for r, _ in live]} survived SIGKILL")


def records(record_dir: Path) -> list[ProcessRecord]:
    """Every recorded process, in start order."""
    if not record_dir.is_dir():
        return []
    return [ProcessRecord.model_validate_json(p.read_text()) for p in sorted(record_dir.glob("*.json"))]
