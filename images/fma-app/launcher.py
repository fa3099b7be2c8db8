#!/usr/bin/env python3
"""FMA's launcher command (`python3 launcher.py ...`): dualpods' launcher.

Written by `python3 -m launcher.fma_compat` (dualpods); the code is in the installed package.
"""

import os
import sys

# This file's directory (FMA's PYTHONPATH=/app) would shadow the installed `launcher` package.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != _HERE]

from launcher.fma_compat import launcher_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(launcher_main())
