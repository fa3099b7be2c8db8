"""The local base image: a Debian bookworm root filesystem made with mmdebstrap, since no public image can
be pulled here.

Bookworm's python3 is 3.11, the minor version of python:3.11-slim, which real users build from. The tarball
is cached under `$DUALPODS_CACHE/images/`, keyed by its recipe, and imported into local container storage
under a tag that carries the same key, so a changed recipe can never be mistaken for the cached one.
"""

import hashlib
import json
from pathlib import Path

from scripts.build_cache import ensure_built
from scripts.images import tools

SUITE = "bookworm"
VARIANT = "minbase"
# Python with venv (and the pip wheel venv uses), CA certificates for model downloads, and the libnuma vLLM's
# CPU kernels link.
PACKAGES = ["python3", "python3-venv", "ca-certificates", "libnuma1"]
# Documentation and translations are left out of the image.
DPKG_EXCLUDES = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*"]
REPOSITORY = "localhost/dualpods/debian"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def recipe_key() -> str:
    recipe = {"suite": SUITE, "variant": VARIANT, "packages": PACKAGES, "excludes": DPKG_EXCLUDES, "path": PATH}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def reference() -> str:
    return f"{REPOSITORY}:{SUITE}-{recipe_key()}"


def _mmdebstrap(out: Path) -> None:
    excludes = [f"--dpkgopt=path-exclude={pattern}" for pattern in DPKG_EXCLUDES]
    # Copyright files stay: the licenses of what the image ships.
    keep = "--dpkgopt=path-include=/usr/share/doc/*/copyright"
    tarball = out / "rootfs.tar"
    argv = ["mmdebstrap", "--quiet", f"--variant={VARIANT}", f"--include={','.join(PACKAGES)}", *excludes, keep]
    tools.run([*argv, SUITE, str(tarball)], quiet=True)


def ensure_base() -> str:
    """The base image's reference, made (cached tarball, then `podman import`) when it is not in storage."""
    name = reference()
    with tools.machine_lock("base"):
        if tools.image_exists(name):
            return name
        cached = ensure_built("images", f"debian-{SUITE}-{recipe_key()}", _mmdebstrap)
        # What debian:bookworm's own image configuration says; an imported tarball has none.
        config = [f"--change={change}" for change in (f"ENV PATH={PATH}", "ENV LANG=C.UTF-8", 'CMD ["bash"]')]
        tools.run(["podman", "import", "--quiet", *config, str(cached / "rootfs.tar"), name], quiet=True)
        return name
