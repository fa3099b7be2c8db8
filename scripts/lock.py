"""Write requirements.lock from a `pip install --dry-run --report` of the project (see `make lock`)."""

import json
import sys

HEADER = """\
# Exact versions of every package `make venv` installs, resolved from pyproject.toml by `make lock`.
# `make venv` removes torchvision, torchaudio, torchcodec and triton after installing: their wheels
# do not load next to torch 2.13.0+cpu, and nothing here needs them.
"""


def main(report_path: str) -> None:
    with open(report_path) as report_file:
        report = json.load(report_file)
    pins = sorted(
        (item["metadata"]["name"].lower(), item["metadata"]["version"])
        for item in report["install"]
        if item["metadata"]["name"].lower() != "dualpods"
    )
    sys.stdout.write(HEADER + "".join(f"{name}=={version}\n" for name, version in pins))


if __name__ == "__main__":
    main(sys.argv[1])
