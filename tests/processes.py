"""Waiting for a test's own subprocess to start its children (forks and workers start asynchronously)."""

import time

import psutil


def children(parent: psutil.Process, count: int, within: float = 30.0) -> list[psutil.Process]:
    """`parent`'s children once there are at least `count`; fails the test after `within` seconds."""
    deadline = time.monotonic() + within
    while len(found := parent.children()) < count:
        assert time.monotonic() < deadline, f"process {parent.pid} did not start {count} children in {within:g} s"
        time.sleep(0.05)
    return found
