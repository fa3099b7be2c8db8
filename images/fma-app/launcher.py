#!/usr/bin/env python3
"""FMA's launcher command (`python3 launcher.py ...`): dualpods' launcher.

Written by `python3 -m launcher.fma_compat` (dualpods); the code is in the installed package.
"""

import os
import sys

# This file's directory (FMA's PYTHONPATH=/app, or the working directory) must not shadow the installed package.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != _HERE]

if __name__ == "launcher":
    import importlib

    del sys.modules[__name__]
    sys.modules[__name__] = importlib.import_module(__name__)

if __name__ == "__main__":
    from launcher.fma_compat import launcher_main

    sys.exit(launcher_main())
