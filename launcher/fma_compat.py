"""FMA's entry points into dualpods' launcher: `python3 launcher.py` and `/app/launcher_pod_notifier.py`.

FMA's controllers run whatever command a LauncherConfig gives its `inference-server` container — FMA's
own manifests say `python3 launcher.py --mock-gpus --host 0.0.0.0 --port 8001 --log-level info` in the
image's working directory (/app), or `/app/launcher.py --host=0.0.0.0 --port=8001 ...` — with
`PYTHONPATH=/app`, and they inject a sidecar `state-change-reflector` into every launcher Pod that runs
`python3 /app/launcher_pod_notifier.py` from the same image. So that swapping only the image in an FMA
installation works, an image that installs the dualpods wheel runs `python3 -m launcher.fma_compat /app`,
which writes both files there: each a few lines that take their own directory off `sys.path` (as FMA's
`PYTHONPATH=/app`, the script's directory and a working directory of /app put it first, `/app/launcher.py`
would otherwise shadow the `launcher` package) and call into the package; and `launcher.py`, should it be
imported as `launcher` all the same (`python -c "import launcher"` or `python -m launcher` in /app), puts the
package in its place:

- `launcher.py` runs `launcher_main`: dualpods' launcher with FMA's arguments (`--mock-gpus`,
  `--mock-gpu-count N`, `--host`, `--port`, `--log-level`, all of which it takes) and FMA's environment
  (`NODE_NAME` and `NAMESPACE` for the `gpu-map` mock), plus its own flags and `LAUNCHER_*` variables;
- `launcher_pod_notifier.py` runs `launcher.pod_notifier.main`, FMA's notifier.
"""

import argparse
import os
import stat
import sys
from pathlib import Path

LAUNCHER_SCRIPT = "launcher.py"
NOTIFIER_SCRIPT = "launcher_pod_notifier.py"
# file name -> (what it is, the module and function it runs)
ENTRY_POINTS = {
    LAUNCHER_SCRIPT: ("FMA's launcher command (`python3 launcher.py ...`): dualpods' launcher", "launcher.fma_compat",
                      "launcher_main"),
    NOTIFIER_SCRIPT: ("FMA's launcher Pod notifier (the `state-change-reflector` sidecar)", "launcher.pod_notifier",
                      "main"),
}  # fmt: skip
_TEMPLATE = '''#!/usr/bin/env python3
"""{what}.

Written by `python3 -m launcher.fma_compat` (dualpods); the code is in the installed package.
"""

import os
import sys

# This file's directory (FMA's PYTHONPATH=/app, or the working directory) must not shadow the installed package.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != _HERE]
{shadow}
if __name__ == "__main__":
    from {module} import {function}

    sys.exit({function}())
'''
# launcher.py stands where the `launcher` package's name resolves from its directory (`python -c "import launcher"`
# there): imported under that name, it puts the package in its place (the import returns what sys.modules holds).
_SHADOW = """
if __name__ == "launcher":
    import importlib

    del sys.modules[__name__]
    sys.modules[__name__] = importlib.import_module(__name__)
"""


def entry_point(file_name: str) -> str:
    """The text of one thin entry-point file."""
    what, module, function = ENTRY_POINTS[file_name]
    shadow = _SHADOW if file_name == LAUNCHER_SCRIPT else ""
    return _TEMPLATE.format(what=what, module=module, function=function, shadow=shadow)


def write_entry_points(directory: Path) -> list[Path]:
    """Write both files into `directory` (made if missing), executable by everyone."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ENTRY_POINTS:
        path = directory / name
        path.write_text(entry_point(name))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH | stat.S_IRGRP | stat.S_IROTH)
        written.append(path)
    return written


def launcher_main(argv: list[str] | None = None) -> int:
    """dualpods' launcher, under FMA's command name."""
    from .__main__ import main

    main(argv, prog=os.path.basename(sys.argv[0]) or LAUNCHER_SCRIPT)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m launcher.fma_compat",
        description="Write FMA's launcher entry points (launcher.py, launcher_pod_notifier.py) into DIRECTORY.",
    )
    parser.add_argument("directory", type=Path, help="where FMA's LauncherConfigs run launcher.py (FMA's: /app)")
    args = parser.parse_args(argv)
    for path in write_entry_points(args.directory):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
