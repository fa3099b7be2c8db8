"""`python3 -m scripts.images build [NAME ...]`: build the images (all by default) with buildah;
`context`: only prepare the build context (for docker, podman or buildah by hand, docs/install.md);
`list`: each image's reference, size and user."""

import argparse
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
    started = time.monotonic()
    tools.ensure_installed()
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


def list_images() -> None:
    for image in catalogue.IMAGES:
        found = tools.inspect(image.reference)
        if found is None:
            print(f"{image.reference:<48} not built")
            continue
        user = found.get("Config", {}).get("User") or "root"
        print(f"{image.reference:<48} {found['Size'] / 1e6:8.0f} MB  user {user}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m scripts.images", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build_command = commands.add_parser("build", help="build the images (with the images they are built on)")
    build_command.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(catalogue.BY_NAME)}")
    commands.add_parser("context", help=f"prepare the build context in {CONTEXT}")
    commands.add_parser("list", help="each image's reference, size and user")
    args = parser.parse_args(argv)
    unknown = sorted(set(getattr(args, "names", [])) - set(catalogue.BY_NAME))
    if unknown:
        parser.error(f"no image {', '.join(unknown)}; the images: {', '.join(catalogue.BY_NAME)}")
    try:
        if args.command == "build":
            build_all(args.names or list(catalogue.BY_NAME))
        elif args.command == "context":
            prepare_context()
        else:
            list_images()
    except tools.ToolError as error:
        sys.exit(f"images: {error}")


if __name__ == "__main__":
    main()
