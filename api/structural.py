"""Turn JSON Schemas into the structural OpenAPI v3 schemas that apiextensions.k8s.io/v1 CRDs require.

Two kinds of input meet here: the JSON Schemas pydantic derives from our models, and Kubernetes' own
definitions (JSON Schema 2020-12, as bundled by kubernetes-validate) for the parts we embed, such as a
PodSpec. Both are turned into one inlined tree: `$ref`s resolved, nullable unions collapsed, integer-or-
string unions spelled `x-kubernetes-int-or-string`, and keys a CRD may not carry dropped. Anything else
unexpected raises, so a new construct in a model or in a newer Kubernetes schema is noticed, not mangled.
"""

from collections.abc import Mapping
from typing import Any, Final

from api.kubemodel import KUBERNETES_DEFINITION
from api.quantity import QUANTITY_SCHEMA

# Keys apiextensions.k8s.io/v1 accepts and that we pass through unchanged.
KEPT_KEYS: Final = frozenset(
    {
        "description",
        "type",
        "format",
        "enum",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minProperties",
        "maxProperties",
        "required",
        "x-kubernetes-int-or-string",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-validations",
    }
)
# Keys dropped on purpose: titles are pydantic's; defaults would be applied by the apiserver to stored
# objects (ours are Python-side omitempty defaults); strategic-merge-patch hints and unions have no
# place in a CRD schema (custom resources take merge and apply patches, driven by x-kubernetes-list-*).
_DROPPED: Final = frozenset(
    {
        "title",
        "default",
        "x-kubernetes-patch-merge-key",
        "x-kubernetes-patch-strategy",
        "x-kubernetes-unions",
        "x-kubernetes-group-version-kind",
    }
)
# Kubernetes definitions replaced by our own spelling (the same one our Quantity fields use).
_OVERRIDES: Final = {"io.k8s.apimachinery.pkg.api.resource.Quantity": QUANTITY_SCHEMA}
# List-map keys must be required or defaulted. Kubernetes declares defaults in its Go types (`+default=`),
# but the JSON Schemas we read have lost them, so the ones we need are restated here.
LIST_MAP_KEY_DEFAULTS: Final = {("io.k8s.api.core.v1.ContainerPort", "protocol"): "TCP"}
# Kubernetes defaults these to "", which the 1.20 API server refused as a CRD default (it read it as null);
# their lists become atomic instead (as imagePullSecrets was before Kubernetes 1.34): merged as a whole.
ATOMIC_INSTEAD: Final = frozenset({("io.k8s.api.core.v1.LocalObjectReference", "name")})


class SchemaError(ValueError):
    """A construct the conversion does not know how to express in a structural schema."""


def _ref_name(ref: str) -> str:
    """`#/$defs/X` and `/api/_definitions.json#/$defs/X` both name definition X."""
    return ref.rpartition("/")[2]


def _without_null(schema: Mapping[str, Any]) -> dict[str, Any]:
    """`type: [integer, "null"]` -> `type: integer`; nullability is expressed by leaving a field out."""
    result = dict(schema)
    kind = result.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise SchemaError(f"cannot express type {kind}")
        result["type"] = kinds[0]
    return result


def _canonical(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Schema keys in alphabetical order (as controller-gen writes them); property names keep model order."""
    result: dict[str, Any] = {}
    for key in sorted(schema):
        value = schema[key]
        if key == "properties":
            result[key] = {name: _canonical(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
            result[key] = _canonical(value)
        elif key == "anyOf":
            result[key] = [_canonical(branch) for branch in value]
        else:
            result[key] = value
    return result


class StructuralConverter:
    """Converts a schema whose `$ref`s point into `definitions` (pydantic's `$defs`); nodes marked with
    KUBERNETES_DEFINITION, and everything below them, come from Kubernetes' definitions."""

    def __init__(self, kubernetes: Mapping[str, Any], *, kubernetes_descriptions: bool) -> None:
        self._kubernetes = kubernetes
        self._kubernetes_descriptions = kubernetes_descriptions

    def convert(self, schema: Mapping[str, Any], definitions: Mapping[str, Any]) -> dict[str, Any]:
        return _canonical(self._node(schema, definitions, ()))

    def _node(self, schema: Mapping[str, Any], definitions: Mapping[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
        """`path` lists the definitions being expanded, to report errors and refuse recursion."""
        if KUBERNETES_DEFINITION in schema:
            return self._kubernetes_definition(schema[KUBERNETES_DEFINITION], path, schema.get("description"))
        if "$ref" in schema:
            return self._ref(schema, definitions, path)
        for union in ("anyOf", "oneOf"):
            if union in schema:
                return self._union(schema, union, definitions, path)
        result: dict[str, Any] = {}
        for key, value in _without_null(schema).items():
            if key == "properties":
                result[key] = {name: self._node(sub, definitions, path) for name, sub in value.items()}
            elif key == "items" or (key == "additionalProperties" and isinstance(value, Mapping)):
                result[key] = self._node(value, definitions, path)
            elif key == "description":
                if (description := self._description(schema, definitions)) is not None:
                    result[key] = description
            elif key in KEPT_KEYS:
                result[key] = value
            elif key not in _DROPPED:
                raise SchemaError(f"unsupported schema key {key!r} in {_where(path)}")
        if "type" not in result and not result.get("x-kubernetes-int-or-string"):
            raise SchemaError(f"a structural schema needs a type, in {_where(path)}: {dict(schema)}")
        if result.get("x-kubernetes-list-type") == "map":
            _require_list_map_keys(result, schema, path)
        return result

    def _ref(self, schema: Mapping[str, Any], definitions: Mapping[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
        """The referenced definition, with the referring node's keys (its description) taking precedence."""
        name = _ref_name(schema["$ref"])
        if definitions is self._kubernetes:
            if extra := set(schema) - {"$ref", "description"}:
                raise SchemaError(f"unsupported keys {sorted(extra)} next to $ref {name}")
            return self._kubernetes_definition(name, path, self._description(schema, definitions))
        if name in path:
            raise SchemaError(f"recursive model {name} in {_where(path)}")
        merged = {**definitions[name], **{k: v for k, v in schema.items() if k != "$ref"}}
        return self._node(merged, definitions, (*path, name))

    def _kubernetes_definition(self, name: str, path: tuple[str, ...], description: str | None) -> dict[str, Any]:
        if name in path:
            raise SchemaError(f"recursive definition {name} in {_where(path)}")
        if name in _OVERRIDES:
            result = dict(_OVERRIDES[name])
        elif name in self._kubernetes:
            result = self._node(self._kubernetes[name], self._kubernetes, (*path, name))
        else:
            raise SchemaError(f"no Kubernetes definition {name}")
        if description is not None:
            result["description"] = description
        return result

    def _description(self, schema: Mapping[str, Any], definitions: Mapping[str, Any]) -> str | None:
        if definitions is self._kubernetes and not self._kubernetes_descriptions:
            return None
        description = schema.get("description")
        return None if description is None else str(description)

    def _union(
        self, schema: Mapping[str, Any], union: str, definitions: Mapping[str, Any], path: tuple[str, ...]
    ) -> dict[str, Any]:
        """`X | None` becomes X; integer-or-string becomes `x-kubernetes-int-or-string`."""
        rest = {k: v for k, v in schema.items() if k != union}
        branches = [_without_null(b) for b in schema[union] if b != {"type": "null"}]
        if len(branches) == 1:
            return self._node({**branches[0], **rest}, definitions, path)
        kinds = {branch.get("type") for branch in branches}
        if kinds not in ({"integer", "string"}, {"number", "string"}) or any(len(b) != 1 for b in branches):
            raise SchemaError(f"cannot express the union {schema[union]} in {_where(path)}")
        scalar = self._node({**rest, "x-kubernetes-int-or-string": True}, definitions, path)
        return {"anyOf": [{"type": "integer"}, {"type": "string"}], **scalar}


def _where(path: tuple[str, ...]) -> str:
    return " -> ".join(path) or "the root"


def _require_list_map_keys(converted: dict[str, Any], schema: Mapping[str, Any], path: tuple[str, ...]) -> None:
    """Each list-map key must be required or defaulted: add the defaults Kubernetes declares, or make the
    list atomic where it has none we can write."""
    item = converted["items"]
    item_name = _ref_name(schema["items"].get("$ref", ""))
    for key in converted["x-kubernetes-list-map-keys"]:
        if key in item.get("required", ()) or "default" in item["properties"][key]:
            continue
        if (item_name, key) in ATOMIC_INSTEAD:
            converted["x-kubernetes-list-type"] = "atomic"
            del converted["x-kubernetes-list-map-keys"]
            return
        if (item_name, key) not in LIST_MAP_KEY_DEFAULTS:
            raise SchemaError(f"list-map key {key!r} of {item_name} ({_where(path)}) is neither required nor defaulted")
        item["properties"][key]["default"] = LIST_MAP_KEY_DEFAULTS[(item_name, key)]
