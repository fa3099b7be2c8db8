"""Write config/validating-admission-policies/ from the chart's template (the single source):
`.venv/bin/python -m scripts.admission_policies`."""

from pathlib import Path
from typing import Any

import yaml

from scripts.helm_chart import REPO, render_chart

TEMPLATE = "templates/admission-policies.yaml"
CONFIG_DIR = REPO / "config" / "validating-admission-policies"
CONCATENATED = REPO / "config" / "validating-admission-policies.yaml"
HEADER = (
    f"# Generated from charts/dualpods/{TEMPLATE} by `.venv/bin/python -m scripts.admission_policies`;\n"
    "# edit the template, not this file. Needs Kubernetes >= 1.30. See docs/operations.md.\n"
)
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
Obj = dict[str, Any]


def rendered_policies(release: str = "dualpods", namespace: str = "dualpods-system") -> list[Obj]:
    """The chart's policies and bindings without the release's labels: what config/ holds for `kubectl apply`."""
    docs = [d for d in render_chart(release, namespace, "admissionPolicies.enabled=true") if d["kind"] in POLICY_KINDS]
    for doc in docs:
        del doc["metadata"]["labels"]
    return docs


class _LiteralDumper(yaml.SafeDumper):
    """Multi-line strings (the CEL expressions) as literal blocks and no line folding, so config/ stays readable."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_LiteralDumper.add_representer(str, _represent_str)


def _dump(doc: Obj) -> str:
    return yaml.dump(doc, Dumper=_LiteralDumper, sort_keys=False, width=1_000)


def generated_files(release: str = "dualpods", namespace: str = "dualpods-system") -> dict[Path, str]:
    """One file per object, as FMA lays them out, and their concatenation (which FMA's installer applies)."""
    docs = rendered_policies(release, namespace)
    files = {CONFIG_DIR / f"{doc['metadata']['name']}.yaml": HEADER + _dump(doc) for doc in docs}
    files[CONCATENATED] = HEADER + "---\n".join(_dump(doc) for doc in docs)
    return files


def main() -> None:
    """Write config/ from the chart."""
    CONFIG_DIR.mkdir(exist_ok=True)
    for path in CONFIG_DIR.glob("*.yaml"):
        path.unlink()
    for path, text in generated_files().items():
        path.write_text(text)
        print(path.relative_to(REPO))


if __name__ == "__main__":
    main()
