"""`python -m scripts.cpu_load --seconds N [--workers W]`: keep W cores (default: all) busy for N seconds, as
another cluster's processes on the same machine would, to run the suite under load (issue 21). Bounded: each
worker stops by itself when its time is up, and they all stop with this process."""

import argparse
import multiprocessing
import os
import signal
import sys
import time


def _spin(until: float) -> None:
    while time.monotonic() < until:
        sum(i * i for i in range(10_000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, required=True, help="how long the load lasts (at most 4 hours)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="busy processes (default: one a core)")
    args = parser.parse_args()
    if not 0 < args.seconds <= 4 * 3600:
        parser.error("--seconds must be in (0, 14400]")
    # A SIGTERM (`kill`) ends this process through its exit handlers, which stop the daemon workers; by
    # default it would end this process alone and leave them spinning until their time is up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    until = time.monotonic() + args.seconds
    workers = [multiprocessing.Process(target=_spin, args=(until,), daemon=True) for _ in range(args.workers)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


if __name__ == "__main__":
    main()
