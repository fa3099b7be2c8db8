"""A build-once cache for built artefacts (wheels, image root filesystems, tiny models, LoRA adapters) under
`$DUALPODS_CACHE`.

Building a tiny model costs seconds of torch/transformers work, a root filesystem minutes; every test
session, image build and the demo would repeat it. Entries are built in a temporary sibling directory and
renamed into place, so a reader never sees a half-written entry and two concurrent builders cannot corrupt
one another.
"""

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

Builder = Callable[[Path], None]


def cache_root() -> Path:
    """The cache directory: `$DUALPODS_CACHE`, by default `~/.cache/dualpods`."""
    return Path(os.environ.get("DUALPODS_CACHE", "~/.cache/dualpods")).expanduser()


@contextmanager
def report_build(what: str, out_dir: Path) -> Iterator[None]:
    """Around a successful build into `out_dir`: say what was built, where, and how long it took."""
    start = time.monotonic()
    yield
    elapsed = time.monotonic() - start
    size = sum(f.stat().st_size for f in out_dir.iterdir() if f.is_file())
    print(f"built {what} in {out_dir} ({size / 1e6:.2f} MB) in {elapsed:.1f} s", file=sys.stderr)


def readable_by_all(tree: Path) -> None:
    """Every file readable and every directory searchable by any user: a container that mounts an entry runs
    as a non-root user (safetensors, for one, writes its files owner-only)."""
    for path in [tree, *tree.rglob("*")]:
        wanted = path.stat().st_mode | (0o755 if path.is_dir() else 0o644)
        if path.stat().st_mode != wanted:
            path.chmod(wanted)


def ensure_built(kind: str, key: str, build: Builder) -> Path:
    """Return `<cache>/<kind>/<key>`, building it with `build` first if it is not there yet."""
    final = cache_root() / kind / key
    if final.is_dir():
        readable_by_all(final)  # entries built before this rule
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=final.parent))
    try:
        with report_build(key, final):
            build(scratch)
            readable_by_all(scratch)
            try:
                scratch.rename(final)
            except OSError:
                if not final.is_dir():
                    raise
                # Another process finished the same entry first; theirs is equivalent.
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final
