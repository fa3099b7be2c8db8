"""Where the cluster's programs come from: `build-control-plane.sh` builds etcd and the control plane of the
pinned Kubernetes release from Go modules, once, and caches them outside the repository."""

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "e2e" / "cluster" / "build-control-plane.sh"


class MissingBinaryError(RuntimeError):
    """A program the cluster needs is not installed."""


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of the cluster's programs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path

    @classmethod
    def locate(cls, minor: str | None = None) -> "Binaries":
        """Find (or build, the first time) every program of Kubernetes `minor` (default: $DUALPODS_K8S_MINOR, else
        the version `make test` runs); a clear error when one cannot be had."""
        argv = ["bash", str(BUILD_SCRIPT), *([minor] if minor else [])]
        built = subprocess.run(argv, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, check=False)
        if built.returncode != 0:
            raise MissingBinaryError(f"{BUILD_SCRIPT} failed with exit code {built.returncode}")
        bin_dir = Path(built.stdout.strip().splitlines()[-1])
        return cls(
            etcd=bin_dir / "etcd",
            kube_apiserver=bin_dir / "kube-apiserver",
            kube_controller_manager=bin_dir / "kube-controller-manager",
            kube_scheduler=bin_dir / "kube-scheduler",
        )
