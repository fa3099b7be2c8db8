"""A simulated container: one run of a requester or launcher inside the simulation process, no process of
its own. It sees the file system as the real one would (the host's, with its volumes where the Pod mounts
them) and binds its Pod's address; the kubelet started it and stops it, as it would a process."""

import contextlib
import io
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path, PurePath, PurePosixPath
from typing import BinaryIO, TextIO

from aiohttp import web

from e2e.simulation.protocol import ContainerSpec


class StartFailure(Exception):
    """The program would have exited at once: its exit code, and what it would have printed."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ContainerFiles:
    """Container paths to host paths through the Pod's mounts (the deepest mount that holds a path wins)."""

    def __init__(self, spec: ContainerSpec) -> None:
        self._mounts = sorted(
            ((PurePosixPath(m.target), Path(m.source)) for m in spec.mounts), key=lambda m: -len(m[0].parts)
        )

    def host_path(self, path: str | PurePath) -> Path:
        wanted = PurePosixPath(path)
        for target, source in self._mounts:
            if wanted == target or target in wanted.parents:
                return source / wanted.relative_to(target)
        return Path(wanted)


@contextlib.contextmanager
def exits_as_failure() -> Iterator[TextIO]:
    """Run a program's start-up code: its `sys.exit` (argparse's usage errors) becomes a StartFailure with
    what it printed on stderr, which the caller writes to the container's log."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            yield stderr
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
        message = stderr.getvalue() or (str(exit_.code) if exit_.code is not None else "")
        raise StartFailure(code, message.strip()) from None


class SimulatedContainer(ABC):
    def __init__(self, spec: ContainerSpec, state_dir: Path) -> None:
        self.spec = spec
        self.files = ContainerFiles(spec)
        self.state_dir = state_dir  # this run's scratch space in the simulation's state directory
        self._log = Path(spec.log)

    def log(self, line: str) -> None:
        """A line in the container's log (what `kubectl logs` would show of the simulation)."""
        with self.open_log() as out:
            out.write(line.rstrip("\n").encode() + b"\n")

    def open_log(self) -> BinaryIO:
        """The container's log, for appending: its standard output."""
        self._log.parent.mkdir(parents=True, exist_ok=True)
        return self._log.open("ab")

    @abstractmethod
    async def start(self) -> None:
        """Start serving on the Pod's address; raises StartFailure for what would exit at once."""

    @abstractmethod
    async def stop(self, grace_seconds: float) -> int:
        """SIGTERM: shut down as the program does, within the grace period; the exit code (137 if cut off)."""

    @abstractmethod
    async def kill(self) -> None:
        """SIGKILL: stop serving at once, nothing graceful."""


def abort_connections(runner: web.AppRunner) -> None:
    """Cut every connection of a server at once, as the death of its process would."""
    if runner.server is None:
        return
    for handler in runner.server.connections:
        if handler.transport is not None:
            handler.transport.abort()
