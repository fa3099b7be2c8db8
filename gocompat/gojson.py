"""Go's `encoding/json` output, byte for byte, for the values FMA hashes (FMA builds with Go 1.25).

FMA's hashes are SHA-256 sums of `json.Marshal` output, so matching them takes Go's encoding exactly:

- strings escape `"`, `\\`, `\\n`, `\\r`, `\\t`, `\\b`, `\\f`, other control characters as `\\u00xx`, and HTML's
  `<`, `>`, `&` and U+2028/U+2029 as `\\u003c`..., everything else raw UTF-8 (invalid UTF-8 becomes U+FFFD);
- an untyped value (`map[string]any` from JSON, as a strategic merge patch leaves it) has its map keys sorted and
  every number as a float64: shortest form, plain below 1e21, exponent (`1e+21`, `1e-7`) otherwise;
- a typed value (a `corev1.Pod`) follows its Go struct: fields in declaration order, `omitempty` leaving out false, 0,
  "", nil pointers and empty slices and maps but never a struct, `omitzero` leaving out zero values, inline structs
  flattened, map keys sorted; and before that, decoding it as Kubernetes decodes JSON drops unknown fields
  (case-sensitively) and canonicalizes quantities ("1000m" is "1"). `typed` does both steps, returning the value
  in Go's order for `marshal`.

The Go struct layout is data, `pod_go_types.json`, written by `scripts.pod_go_types` from k8s.io/api v0.34.10.
"""

import functools
import json
import math
import re
from decimal import Decimal
from importlib.resources import files
from typing import Any, Final

from api.quantity import canonical_quantity

POD_GO_TYPES: Final = "pod_go_types.json"
_SCALAR_ZERO: Final = {"string": "", "types.UID": "", "bool": False}
_INTEGERS: Final = frozenset({"int", "int32", "int64", "uint", "uint32", "uint64"})
_ESCAPES: Final = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
_NEEDS_ESCAPE: Final = re.compile('["\\\\\x00-\x1f<>&\u2028\u2029\ud800-\udfff]')


class GoTypeError(ValueError):
    """A value Go could not decode into its type (a string where a number belongs, ...), and where it is."""

    def __init__(self, problem: str, path: tuple[str, ...] = ()) -> None:
        super().__init__(f"{'.'.join(path)}: {problem}" if path else problem)
        self.problem, self.path = problem, path

    def within(self, field: str) -> "GoTypeError":
        return GoTypeError(self.problem, (field, *self.path))


def _escape(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if "\ud800" <= char <= "\udfff":
        return "\ufffd"
    return f"\\u{ord(char):04x}"


def string(text: str) -> str:
    """A JSON string as Go writes it."""
    return '"' + _NEEDS_ESCAPE.sub(lambda m: _escape(m.group(0)), text) + '"'


def float64(number: float) -> str:
    """A float64 as Go's encoding/json writes it: the shortest digits that read back the same, plain from 1e-6 up
    to 1e21, else with an exponent of at least two digits (`1e+21`), a negative one without its leading zero."""
    if not math.isfinite(number):
        raise GoTypeError(f"json: unsupported value: {number}")
    if number == 0:
        return "-0" if math.copysign(1, number) < 0 else "0"
    shortest = repr(number)  # Python's repr is the shortest round-trip form too
    if 1e-6 <= abs(number) < 1e21:
        return format(Decimal(shortest).normalize(), "f")
    return re.sub(r"e-0(\d)$", r"e-\1", shortest)


def marshal(value: Any, sort_keys: bool = True) -> str:
    """`value` as Go's json.Marshal writes it: sorted keys and float64 numbers for an untyped value
    (`sort_keys`), or the order and numbers as given (a value `typed` made, integers staying integers)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return string(value)
    if isinstance(value, int):
        return float64(float(value)) if sort_keys else str(value)
    if isinstance(value, float):
        return float64(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(marshal(item, sort_keys) for item in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value) if sort_keys else list(value)
        return "{" + ",".join(f"{string(k)}:{marshal(value[k], sort_keys)}" for k in keys) + "}"
    raise GoTypeError(f"json: unsupported type: {type(value).__name__}")


@functools.cache
def _layouts() -> dict[str, Any]:
    types: dict[str, Any] = json.loads((files("gocompat") / POD_GO_TYPES).read_text())["types"]
    return types


_MISSING: Final = object()


def typed(value: Any, go_type: str) -> Any:
    """`value` (JSON) decoded into `go_type` (e.g. "core.Pod") and encoded again, as Go orders and omits it."""
    return _typed(value, go_type)


def _typed(value: Any, go_type: str) -> Any:
    if go_type.startswith("*"):
        return None if value is None or value is _MISSING else _typed(value, go_type[1:])
    if go_type.startswith("[]"):
        if value is None or value is _MISSING:
            return None
        if not isinstance(value, list):
            raise GoTypeError(f"cannot decode {type(value).__name__} into Go {go_type}")
        return [_typed(item, go_type[2:]) for item in value]
    if go_type.startswith("map["):
        if value is None or value is _MISSING:
            return None
        if not isinstance(value, dict):
            raise GoTypeError(f"cannot decode {type(value).__name__} into Go {go_type}")
        element = go_type[go_type.index("]") + 1 :]
        return {key: _typed(value[key], element) for key in sorted(value)}
    absent = value is None or value is _MISSING
    if go_type in _SCALAR_ZERO or go_type in _INTEGERS:
        zero = _SCALAR_ZERO.get(go_type, 0)
        if absent:
            return zero
        expected = int if go_type in _INTEGERS else type(zero)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise GoTypeError(f"cannot decode {value!r} into Go {go_type}")
        return value
    if go_type == "resource.Quantity":
        return "0" if absent else canonical_quantity(str(value))
    if go_type == "intstr.IntOrString":
        return 0 if absent else value
    if go_type in ("meta.Time", "meta.MicroTime", "meta.FieldsV1"):
        return None if absent else value
    layout = _layouts().get(go_type)
    if layout is None:
        raise GoTypeError(f"no layout for Go type {go_type}")
    if isinstance(layout, dict):
        return _typed(value, layout["underlying"])
    if not absent and not isinstance(value, dict):
        raise GoTypeError(f"cannot decode {type(value).__name__} into Go {go_type}")
    return _struct({} if absent else value, layout)


def _struct(value: dict[str, Any], layout: list[list[str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, go_type, flags in layout:
        if "i" in flags:
            out.update(_typed(value, go_type))
            continue
        try:
            encoded = _typed(value.get(name, _MISSING), go_type)
        except GoTypeError as err:
            raise err.within(name) from None
        if ("o" in flags and _empty(encoded, go_type)) or ("z" in flags and _zero(encoded, go_type)):
            continue
        out[name] = encoded
    return out


def _underlying(go_type: str) -> str:
    layout = _layouts().get(go_type)
    return _underlying(layout["underlying"]) if isinstance(layout, dict) else go_type


def _empty(encoded: Any, go_type: str) -> bool:
    """Go's omitempty: false, 0, "", a nil pointer, an empty slice or map; never a struct."""
    kind = _underlying(go_type)
    if kind.startswith("*"):
        return encoded is None
    if kind.startswith(("[]", "map[")):
        return not encoded
    if kind in _SCALAR_ZERO or kind in _INTEGERS:
        return encoded in ("", 0, False)
    return False


def _zero(encoded: Any, go_type: str) -> bool:
    """Go's omitzero: the zero value (a nil slice or map, not an empty one; a zero Time or struct)."""
    kind = _underlying(go_type)
    if kind.startswith(("*", "[]", "map[")) or kind in ("meta.Time", "meta.MicroTime"):
        return encoded is None
    if kind in _SCALAR_ZERO or kind in _INTEGERS:
        return encoded in ("", 0, False)
    return bool(encoded == _typed(_MISSING, kind))
