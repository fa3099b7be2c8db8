#!/usr/bin/env python3
"""FMA's launcher Pod notifier (the `state-change-reflector` sidecar).

Written by `python3 -m launcher.fma_compat` (dualpods); the code is in the installed package.
"""

import os
import sys

# This file's directory (FMA's PYTHONPATH=/app, or the working directory) must not shadow the installed package.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != _HERE]

if __name__ == "__main__":
    from launcher.pod_notifier import main

    sys.exit(main())
