"""Writing a generated file, or (`--check`) only saying whether the committed one is current: shared by the
generators under scripts/."""

import sys
from pathlib import Path


def write_or_check(out: Path, text: str, check: bool, command: str) -> int:
    """Write `text` to `out` (exit status 0), or with `check` compare only (1 when `out` is out of date)."""
    if check:
        if not out.exists() or out.read_text() != text:
            print(f"{out} is out of date: run `{command}`", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(out)
    return 0
