"""The release every component reports (`--version`, the launcher's and requester's logs): the installed
distribution's version, one number for the wheel, the images built from it and the chart's appVersion."""

import argparse
import functools
from importlib.metadata import PackageNotFoundError, version
from typing import Final

DISTRIBUTION: Final = "dualpods"


@functools.cache
def release() -> str:
    """The installed dualpods version; `unknown` when run from a checkout that was never installed. Read once
    per process: the lookup scans every path entry's metadata (0.17 ms), and a simulation process parses a
    requester's flags at each of its containers' starts."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def add_argument(parser: argparse.ArgumentParser) -> None:
    """`--version`: print `PROG VERSION` and exit, as every command of the project does."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {release()}")
