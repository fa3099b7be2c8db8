"""`python -m e2e.kubelet --config kubelet.yaml`: run the loopback kubelet in the foreground."""

import argparse
import asyncio
import logging
from pathlib import Path

from e2e.kubelet.config import KubeletConfig
from e2e.kubelet.kubelet import Kubelet
from kube.gc_thresholds import tune_for_caches


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m e2e.kubelet", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="kubelet configuration (YAML, see config.py)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_for_caches()
    asyncio.run(Kubelet(KubeletConfig.load(args.config)).run())


if __name__ == "__main__":
    main()
