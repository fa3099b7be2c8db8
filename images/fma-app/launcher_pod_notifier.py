#!/usr/bin/env python3
"""FMA's launcher Pod notifier (the `state-change-reflector` sidecar).

Written by `python3 -m launcher.fma_compat` (dualpods); the code is in the installed package.
"""

import os
import sys

# This file's directory (FMA's PYTHONPATH=/app) would shadow the installed `launcher` package.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != _HERE]

from launcher.pod_notifier import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
