"""`python3 -m scripts.images build [NAME ...]`: build the images (all by default) with buildah;
`context`: only prepare the build context (for docker, podman or buildah by hand, docs/install.md);
`tools`: only install the container tools (apt-get) where they are missing;
`list`: each image's reference, size and user."""

import argparse
import sys

from scripts.images import catalogue, tools
from scripts.images.pipeline import CONTEXT, build_all, prepare_context


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
    commands.add_parser("tools", help="install buildah, podman, runc and mmdebstrap where missing (apt-get)")
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
        elif args.command == "tools":
            tools.ensure_installed()
        else:
            list_images()
    except tools.ToolError as error:
        sys.exit(f"images: {error}")


if __name__ == "__main__":
    main()
