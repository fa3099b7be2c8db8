"""Sampling profiles of a running Python process (py-spy), and where their time went.

`py-spy record --format raw --gil` writes one line per distinct stack, `frame;frame;...;frame count`, each
frame `function (file)`; only stacks that held the GIL are sampled (waits, idle threads and the event
loop's `select` are left out), so the counts divide the time the process spent running Python. `Summary`
says which libraries that time went to (by the frame that was running), which functions took most of it
by themselves, and which functions of this repository took most with what they called.
"""

import asyncio
import collections
import contextlib
import re
import signal
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from e2e.kubelet.images import REPO_ROOT
from scripts.venv_tools import venv_tool

RATE = 100  # samples per second
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*)\)$")
_STDLIB = Path(sysconfig.get_paths()["stdlib"])


def _in_repository(path: Path) -> bool:
    """This repository's own code (its virtual environment's packages are not)."""
    return path.is_relative_to(REPO_ROOT) and "site-packages" not in path.parts


def library(file: str) -> str:
    """What a frame's file belongs to: an installed distribution's top package, a standard-library module,
    or this repository's top directory (`controller`, `api`, ...)."""
    path = Path(file)
    parts = path.parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].removesuffix(".py")
    if _in_repository(path):
        return path.relative_to(REPO_ROOT).parts[0]
    if path.is_relative_to(_STDLIB):
        return path.relative_to(_STDLIB).parts[0].removesuffix(".py")
    return file


def _short(frame: str) -> str:
    """`function (file)` with the file relative to the repository or to its library."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = Path(match["file"])
    if _in_repository(path):
        where = str(path.relative_to(REPO_ROOT))
    elif "site-packages" in path.parts:
        where = "/".join(path.parts[path.parts.index("site-packages") + 1 :])
    elif path.is_relative_to(_STDLIB):
        where = str(path.relative_to(_STDLIB))
    else:
        where = match["file"]
    return f"{match['function']} ({where})"


def _ours(frame: str) -> bool:
    match = _FRAME.match(frame)
    return match is not None and _in_repository(Path(match["file"]))


@dataclass(frozen=True)
class Summary:
    samples: int
    libraries: list[tuple[str, float]]  # (library, share of the samples) of the frame that was running
    own: list[tuple[str, float]]  # (function, share) of the busiest frames by themselves
    ours: list[tuple[str, float]]  # (function, share) of this repository's, with what they called

    @classmethod
    def of(cls, raw: str, top: int = 12) -> "Summary":
        libraries: collections.Counter[str] = collections.Counter()
        own: collections.Counter[str] = collections.Counter()
        ours: collections.Counter[str] = collections.Counter()
        samples = 0
        for line in raw.splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = stack.split(";")
            samples += int(count)
            leaf = _FRAME.match(frames[-1])
            libraries[library(leaf["file"]) if leaf else frames[-1]] += int(count)
            own[_short(frames[-1])] += int(count)
            for frame in {_short(f) for f in frames if _ours(f)}:
                ours[frame] += int(count)
        total = max(samples, 1)

        def shares(counter: collections.Counter[str], wanted: int) -> list[tuple[str, float]]:
            return [(name, count / total) for name, count in counter.most_common(wanted)]

        # The entry points (the main loop, a worker's loop) hold nearly every sample: they say nothing.
        ours_top = [(f, s) for f, s in shares(ours, top * 2) if s < 0.9][:top]
        return cls(samples, shares(libraries, top), shares(own, top), ours_top)


class Profile:
    """py-spy sampling one process from `start` to `stop`."""

    def __init__(self, pid: int, output: Path) -> None:
        self.pid = pid
        self.output = output
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.output.parent.mkdir(parents=True, exist_ok=True)
        self._process = await asyncio.create_subprocess_exec(
            str(venv_tool("py-spy")), "record", "--pid", str(self.pid), "--format", "raw", "--nolineno", "--gil",
            "--full-filenames", "--nonblocking", "--rate", str(RATE), "--output", str(self.output),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip

    async def stop(self) -> Summary | None:
        """Stop sampling; the summary, or None when py-spy wrote nothing (the process was gone)."""
        if self._process is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            self._process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            async with asyncio.timeout(30):
                await self._process.wait()
        except TimeoutError:
            self._process.kill()
            await self._process.wait()
        if not self.output.is_file():
            return None
        return Summary.of(self.output.read_text())
