"""A cold vLLM server that marks its start-up phases as a forked instance does (`launcher.startup_phases`).

Usage (by bench/launcher_startup.py): python bench/cold_marked.py MARKS_FILE VLLM_SERVE_ARGS...
It marks its own start, then runs vLLM's entry point in this process, as
`python -m vllm.entrypoints.launchers.api_server.entry` would.
"""

import sys
from pathlib import Path

from launcher import startup_phases  # the repository is on PYTHONPATH (e2e.launcher_process.offline_environment)
from launcher.runtimes import VllmRuntime


def main() -> None:
    marks, *argv = sys.argv[1:]
    startup_phases.record_marks(Path(marks), VllmRuntime.markers)
    from vllm.entrypoints.launchers.api_server import entry

    sys.argv = ["vllm serve", *argv]
    entry.main()


if __name__ == "__main__":
    main()
