"""Draw the dual-pods controller's phase machine into docs/architecture.md from its table (controller/dualpods/
phases.py): `.venv/bin/python -m scripts.phase_diagram` (`--check` only compares).

The drawing sits between the `<!-- phases:begin -->` and `<!-- phases:end -->` markers; the rest of the file is
left as it is. tests/test_dualpods_phases.py fails while the drawing is stale.
"""

import re
import sys
from pathlib import Path
from typing import Final

from controller.dualpods.phases import mermaid
from scripts.generated_file import write_or_check

OUT: Final = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
COMMAND: Final = "python -m scripts.phase_diagram"
_SECTION: Final = re.compile(r"(<!-- phases:begin -->\n```mermaid\n).*?(\n```\n<!-- phases:end -->)", re.DOTALL)


def render(text: str) -> str:
    """`text` (docs/architecture.md) with the table's drawing between its markers."""
    drawn, found = _SECTION.subn(lambda m: m.group(1) + mermaid() + m.group(2), text)
    if found != 1:
        raise ValueError(f"{OUT} needs one phase drawing between the phases:begin/end markers, not {found}")
    return drawn


def main(argv: list[str]) -> int:
    return write_or_check(OUT, render(OUT.read_text()), "--check" in argv, COMMAND)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
