"""FMA's `dual-pods.llm-d.ai/server-patch` annotation: a Go `text/template` rendered with `missingkey=error`, then
read as YAML into the strategic merge patch it spells.

Only the part of `text/template` that server patches use is rendered: text, `{{ .Key }}`, `{{/* comments */}}` and
the `{{-`/`-}}` whitespace trimming. Any other action (`if`, `range`, pipelines, functions, ...) is refused with an
error naming it, rather than rendered differently from Go. A key the data lacks is an error, as with Go's
`missingkey=error`; FMA's data is a struct whose `LocalVolume` is always empty, so a caller that wants FMA's exact
behaviour passes `LocalVolume: ""` rather than leaving it out.

The YAML is read as Go's `sigs.k8s.io/yaml` (go-yaml v2, YAML 1.1) reads it, since that decides what the patch
means: `y`/`n`/`on`/`off` are booleans, dates and `1:30` stay strings, `0777` is octal and `1e3` a number, a
whole number written as a float is an integer, and mapping keys become strings. Of several YAML documents, only the
first counts.
"""

import math
import re
from collections.abc import Hashable, Mapping
from typing import Any, Final

import yaml

_SPACES: Final = " \t\r\n"  # what Go's template lexer trims and allows around trim markers
_FIELD: Final = re.compile(r"\.([^\W\d]\w*)")


class GoTemplateError(ValueError):
    """The template is malformed, uses a construct outside the supported subset, or names a key not in the data."""


class PatchYAMLError(ValueError):
    """The rendered template is not YAML, or not a YAML mapping that converts to a JSON object."""


def render_template(source: str, data: Mapping[str, str]) -> str:
    """The template rendered with `data`, as Go's `text/template` with `missingkey=error` renders it."""
    out: list[str] = []
    at = 0
    trim_next = False
    while (start := source.find("{{", at)) >= 0:
        text = source[at:start]
        inner = start + 2
        if source.startswith("-", inner) and _is_space(source, inner + 1):
            text = text.rstrip(_SPACES)
            inner += 2
        out.append(text.lstrip(_SPACES) if trim_next else text)
        if source.startswith("/*", inner):
            at, trim_next = _comment_end(source, inner, start)
        else:
            at, trim_next, key = _action(source, inner, start)
            if key not in data:
                known = ", ".join(sorted(data)) or "none"
                raise GoTemplateError(f"{_where(source, start)}: no value for key {key!r} (keys: {known})")
            out.append(data[key])
    out.append(source[at:].lstrip(_SPACES) if trim_next else source[at:])
    return "".join(out)


def _is_space(source: str, at: int) -> bool:
    return source[at : at + 1] != "" and source[at] in _SPACES


def _where(source: str, start: int) -> str:
    return f"line {source.count(chr(10), 0, start) + 1}"


def _closing(source: str, at: int) -> tuple[int, bool] | None:
    """Where the text after a `}}` (or ` -}}`) found at `at` begins, and whether it trims that text's spaces."""
    if source.startswith("}}", at):
        return at + 2, False
    if _is_space(source, at) and source.startswith("-}}", at + 1):
        return at + 4, True
    return None


def _comment_end(source: str, inner: int, start: int) -> tuple[int, bool]:
    end = source.find("*/", inner + 2)
    closing = None if end < 0 else _closing(source, end + 2)
    if closing is None:
        raise GoTemplateError(_where(source, start) + ": a comment must end with */}} (or */ -}})")
    return closing


def _action(source: str, inner: int, start: int) -> tuple[int, bool, str]:
    """A `{{ .Key }}` action: where the text after it begins, whether it trims that, and the key."""
    end = source.find("}}", inner)
    if end < 0:
        raise GoTemplateError(f"{_where(source, start)}: unclosed action")
    body = source[inner:end]
    trim_after = body.endswith("-") and _is_space(body, len(body) - 2)
    if trim_after:
        body = body[:-2]
    field = _FIELD.fullmatch(body.strip(_SPACES))
    if field is None:
        raise GoTemplateError(
            f"{_where(source, start)}: unsupported template construct {source[start : end + 2]!r}: "
            "only {{ .Key }}, {{/* comments */}} and {{- -}} trimming are supported"
        )
    return end + 2, trim_after, field.group(1)


class _GoYAMLLoader(yaml.SafeLoader):
    """PyYAML's safe loader with go-yaml v2's implicit types in place of PyYAML's YAML 1.1 ones, and mapping keys
    turned into strings as Go's YAML-to-JSON conversion turns them (so `1` and `true` stay two keys)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        self.flatten_mapping(node)
        return {
            _json_key(self.construct_object(key, deep=deep)): self.construct_object(value, deep=deep)
            for key, value in node.value
        }


_KEPT_TAGS: Final = ("tag:yaml.org,2002:null", "tag:yaml.org,2002:merge")
_BOOL_TAG: Final = "tag:yaml.org,2002:bool"
_NUMBER_TAG: Final = "tag:dualpods:go-yaml-number"
_BOOLS: Final = {
    **dict.fromkeys(["y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"], True),
    **dict.fromkeys(["n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"], False),
}
_SPECIAL_FLOATS: Final = {
    **dict.fromkeys([".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"], math.inf),
    **dict.fromkeys(["-.inf", "-.Inf", "-.INF"], -math.inf),
    **dict.fromkeys([".nan", ".NaN", ".NAN"], math.nan),
}
# go-yaml v2's yamlStyleFloat: what it reads as a float once no integer syntax fits.
_GO_FLOAT: Final = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INT_BASES: Final = {"0x": 16, "0o": 8, "0b": 2}
_INT64: Final = range(-(2**63), 2**63)

_GoYAMLLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag in _KEPT_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_GoYAMLLoader.add_implicit_resolver(_BOOL_TAG, re.compile(f"(?:{'|'.join(_BOOLS)})$"), list("yYnNtTfFoO"))
_GoYAMLLoader.add_implicit_resolver(_NUMBER_TAG, re.compile(r"[-+.0-9]"), list("-+.0123456789"))


def _go_bool(loader: yaml.SafeLoader, node: yaml.Node) -> bool:
    return _BOOLS[loader.construct_scalar(node)]  # type: ignore[arg-type]


def _go_number(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    """A plain scalar that starts like a number: go-yaml v2 reads an integer, else a YAML-style float, else keeps
    the text (a date, `1:30`, `0.0.1`...)."""
    text: str = loader.construct_scalar(node)  # type: ignore[arg-type]
    if text in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[text]
    if text.startswith("."):
        return float(text) if _GO_FLOAT.fullmatch(text) else text
    plain = text.replace("_", "")
    number = _go_int(plain)
    if number is not None:
        return number
    return float(plain) if _GO_FLOAT.fullmatch(plain) else text


def _go_int(text: str) -> int | None:
    """Go's `strconv.ParseInt(text, 0, 64)` without its range: 0x, 0o and 0b prefixes, a leading 0 for octal."""
    sign, digits = (text[0], text[1:]) if text[:1] in ("+", "-") else ("", text)
    prefix = digits[:2].lower()
    if prefix in _INT_BASES:
        base, body = _INT_BASES[prefix], digits[2:]
    elif len(digits) > 1 and digits.startswith("0"):
        base, body = 8, digits[1:]
    else:
        base, body = 10, digits
    if not body or any(char not in "0123456789abcdef"[:base] for char in body.lower()):
        return None
    return -int(body, base) if sign == "-" else int(body, base)


_GoYAMLLoader.add_constructor(_BOOL_TAG, _go_bool)
_GoYAMLLoader.add_constructor(_NUMBER_TAG, _go_number)


def load_patch_yaml(text: str) -> dict[str, Any]:
    """The patch that YAML `text` spells, as JSON types; empty YAML is the empty patch."""
    try:
        document = next(yaml.load_all(text, Loader=_GoYAMLLoader), None)
    except yaml.YAMLError as error:
        raise PatchYAMLError(f"the server patch is not valid YAML: {error}") from error
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise PatchYAMLError(f"the server patch must be a YAML mapping (a patch of a Pod), not {document!r}")
    patch: dict[str, Any] = _as_json(document, "")
    return patch


def _as_json(value: Any, path: str) -> Any:
    """The value as JSON has it after Go's YAML-to-JSON conversion and decoding: a float with a whole value within
    int64 is read back as an integer, an integer beyond int64 as a float."""
    if isinstance(value, dict):
        return {key: _as_json(item, f"{path}.{key}" if path else key) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_json(item, f"{path}[{at}]") for at, item in enumerate(value)]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value if value in _INT64 else float(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PatchYAMLError(f"the server patch's {path or 'value'} is {value}, which JSON cannot hold")
        return int(value) if value.is_integer() and int(value) in _INT64 else value
    raise PatchYAMLError(f"the server patch's {path or 'value'} is a {type(value).__name__}, which JSON cannot hold")


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    raise PatchYAMLError(f"the server patch has a mapping key {key!r}, which JSON cannot hold; quote it")


def render_server_patch(source: str, data: Mapping[str, str]) -> dict[str, Any]:
    """The strategic merge patch that a `server-patch` annotation spells for `data` (e.g. `NodeName`)."""
    return load_patch_yaml(render_template(source, data))
