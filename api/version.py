"""The release every component reports (`--version`, the launcher's and requester's logs): the installed
distribution's version, one number for the wheel, the images built from it and the chart's appVersion."""

import argparse
from importlib.metadata import PackageNotFoundError, version
from typing import Final

DISTRIBUTION: Final = "dualpods"


def release() -> str:
    """The installed dualpods version; `unknown` when run from a checkout that was never installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def add_argument(parser: argparse.ArgumentParser) -> None:
    """`--version`: print `PROG VERSION` and exit, as every command of the project does."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {release()}")
