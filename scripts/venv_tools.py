"""The command-line tools installed beside the project's interpreter: kubectl and helm (`make tools`), py-spy."""

import sys
from pathlib import Path


class MissingToolError(RuntimeError):
    """A tool is not installed beside the interpreter."""


def venv_tool(name: str) -> Path:
    """A tool installed next to this interpreter by `make tools` (kubectl, helm)."""
    path = Path(sys.executable).parent / name
    if not path.is_file():
        raise MissingToolError(f"{path} not found; run `make tools`")
    return path
