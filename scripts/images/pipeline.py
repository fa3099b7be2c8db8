"""The whole build: tools, build context, base image, then each image in order (skipping those up to date)."""

import sys
import time
from pathlib import Path

from scripts.images import build, catalogue, rootfs, tools, wheelhouse

CONTEXT = wheelhouse.REPO / "build" / "images" / "context"
LOGS = wheelhouse.REPO / "build" / "images" / "logs"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def prepare_context() -> Path:
    """The build context (docs/install.md); returns the wheelhouse it was made from."""
    started = time.monotonic()
    cached = wheelhouse.ensure_wheelhouse(catalogue.closures())
    wheelhouse.prepare_context(CONTEXT, cached)
    say(f"build context {CONTEXT} ready in {time.monotonic() - started:.1f} s (wheelhouse {cached})")
    return cached


def source_url() -> str:
    """org.opencontainers.image.source: the checkout's remote, when it has one."""
    try:
        return tools.output(["git", "-C", str(wheelhouse.REPO), "remote", "get-url", "origin"]).strip()
    except tools.ToolError:
        return ""


def build_all(names: list[str]) -> None:
    """Build the named images and those they are built on; each one's result on stderr. One build at a time on
    the machine: a second waits for the first, then finds what it built up to date."""
    started = time.monotonic()
    tools.ensure_installed()
    with tools.machine_lock("build"):
        cached = prepare_context()
        bases = {catalogue.DEBIAN: rootfs.ensure_base()}
        source = source_url()
        for image in catalogue.with_bases(names):
            args = build.build_args(image, bases[image.base], source)
            result = build.build(image, args, CONTEXT, cached, LOGS / f"{image.name}.log")
            bases[image.name] = image.reference
            state = f"built in {result.seconds:.1f} s" if result.built else "up to date"
            say(f"{image.reference:<48} {state}")
    say(f"images ready in {time.monotonic() - started:.1f} s")
