"""Write gocompat/pod_go_types.json, the Go struct layout of a Kubernetes Pod as k8s.io/api declares it:
`.venv/bin/python -m scripts.pod_go_types SRC` (`--check` only compares).

FMA hashes Pods by marshalling them with Go's encoding/json, whose output follows the Go types: fields in
declaration order, `omitempty`/`omitzero`, structs always present, inline (embedded) structs flattened. Kubernetes'
OpenAPI keeps none of that (its properties are sorted), so the layout is read from the Go sources themselves. SRC
is a GOPATH-style folder holding `k8s.io/api` and `k8s.io/apimachinery` at the version FMA 0.6 builds with
(v0.34.10; e.g. `git archive v0.34.10` of kubernetes/api and kubernetes/apimachinery). Only declarations are
read: this writes data (names, order, tags), no Kubernetes code.

Each type is either a struct, `[[json name, type, flags], ...]` (flags: `o` omitempty, `z` omitzero, `i` inline), or
a named non-struct type, `{"underlying": type}`. Types are spelled as in Go, qualified by package for the
apimachinery ones (`meta.ObjectMeta`); `resource.Quantity`, `intstr.IntOrString` and `meta.Time` marshal
themselves and are left opaque.
"""

import json
import re
import sys
from pathlib import Path
from typing import Any, Final

from scripts.generated_file import write_or_check

OUT: Final = Path(__file__).resolve().parents[1] / "gocompat" / "pod_go_types.json"
VERSION: Final = "v0.34.10"
PACKAGES: Final = {
    "core": "k8s.io/api/core/v1",
    "meta": "k8s.io/apimachinery/pkg/apis/meta/v1",
}
ALIASES: Final = {"metav1": "meta", "v1": "core"}  # how core/v1 refers to other packages
OPAQUE: Final = frozenset(
    {"resource.Quantity", "intstr.IntOrString", "meta.Time", "meta.MicroTime", "meta.FieldsV1", "types.UID"}
)
BUILTIN: Final = frozenset(
    {"map", "string", "bool", "byte", "int", "int32", "int64", "uint", "uint32", "uint64", "float32", "float64"}
)
ROOTS: Final = ("core.Pod",)

_TYPE_DECL: Final = re.compile(r"^type (\w+) (struct \{|[^\s{][^{]*)$")
_FIELD: Final = re.compile(r"^\t(?:(\w+)\s+)?([\w.*\[\]]+)(?:\s+`([^`]*)`)?\s*(?://.*)?$")
_JSON_TAG: Final = re.compile(r'json:"([^"]*)"')


class Layout:
    """The declarations read from one package's sources: structs as field lists, other named types."""

    def __init__(self, package: str, sources: list[Path]) -> None:
        self.package = package
        self.structs: dict[str, list[tuple[str, str, str]]] = {}
        self.named: dict[str, str] = {}
        for source in sources:
            self._read(source.read_text().splitlines())

    def _read(self, lines: list[str]) -> None:
        current: str | None = None
        for line in lines:
            if current is None:
                if match := _TYPE_DECL.match(line):
                    name, rest = match.groups()
                    if rest == "struct {":
                        current = name
                        self.structs[name] = []
                    else:
                        self.named[name] = self.qualify(rest.strip())
                continue
            if line == "}":
                current = None
                continue
            field = _FIELD.match(line)
            if not field or line.lstrip().startswith("//"):
                continue
            go_name, go_type, tag = field.groups()
            tags = _JSON_TAG.search(tag or "")
            options = (tags.group(1) if tags else "").split(",")
            json_name, flags = options[0], ""
            if json_name == "-":
                continue
            if go_name is None and not json_name:  # embedded without a name of its own: flattened
                flags += "i"
            json_name = json_name or (go_name or go_type.rpartition(".")[2])
            flags += "o" if "omitempty" in options[1:] else ""
            flags += "z" if "omitzero" in options[1:] else ""
            self.structs[current].append((json_name, self.qualify(go_type), flags))

    def qualify(self, go_type: str) -> str:
        """`go_type` with every type name qualified by its package (`meta.ObjectMeta`, `core.Container`)."""

        def one(match: re.Match[str]) -> str:
            name = match.group(0)
            if name in BUILTIN:
                return name
            package, _, short = name.rpartition(".")
            if package:
                return f"{ALIASES.get(package, package)}.{short}"
            return f"{self.package}.{name}"

        return re.sub(r"[\w.]+", one, go_type)


def _referenced(go_type: str) -> list[str]:
    return [name for name in re.findall(r"[\w.]+", go_type) if "." in name]


def pod_go_types(src: Path) -> dict[str, Any]:
    """The layout of every type a Pod reaches; the file's whole content."""
    layouts = {
        short: Layout(short, sorted(p for p in (src / path).glob("*.go") if not p.name.endswith("_test.go")))
        for short, path in PACKAGES.items()
    }
    types: dict[str, Any] = {}
    wanted = list(ROOTS)
    while wanted:
        name = wanted.pop()
        if name in types or name in OPAQUE:
            continue
        package, _, short = name.partition(".")
        layout = layouts.get(package)
        if layout is None:
            raise SystemExit(f"{name}: package {package} is neither read nor opaque")
        if short in layout.structs:
            fields = layout.structs[short]
            types[name] = [list(field) for field in fields]
            wanted += [ref for _, go_type, _ in fields for ref in _referenced(go_type)]
        elif short in layout.named:
            types[name] = {"underlying": layout.named[short]}
            wanted += _referenced(layout.named[short])
        else:
            raise SystemExit(f"{name}: no declaration found under {src / PACKAGES[package]}")
    return {
        "$comment": f"Generated by `python -m scripts.pod_go_types` from k8s.io/api {VERSION}. Do not edit.",
        "version": VERSION,
        "opaque": sorted(OPAQUE),
        "types": dict(sorted(types.items())),
    }


def render(src: Path) -> str:
    return json.dumps(pod_go_types(src), indent=1) + "\n"


def main(argv: list[str]) -> int:
    paths = [a for a in argv if not a.startswith("--")]
    if len(paths) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    return write_or_check(OUT, render(Path(paths[0])), "--check" in argv, "python -m scripts.pod_go_types SRC")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
