"""Kubernetes strategic merge patch, applied as apimachinery's `strategicpatch.StrategicMergePatch` (and so
`kubectl patch --type strategic`) applies it, driven by the patch strategies and merge keys of the OpenAPI schema.

FMA turns a requester's `server-patch` annotation into such a patch over the requester's Pod, so the same
annotation must give the same provider Pod here as there. The rules follow apimachinery, quirks included:

- maps merge key by key; `null` deletes a key (an emptied map stays, as `{}`);
- a list merges only where the schema says `x-kubernetes-patch-strategy: merge`: by the merge key for lists of
  objects, as a set for lists of scalars; any other list is replaced whole;
- a value whose key is new to the original is taken from the patch without its nulls and without any object
  holding a `$patch` directive, but a new *list element* is appended exactly as written (nulls, directives and all);
- the `retainKeys` strategy only matters when a patch carries `$retainKeys`: without it, patching a volume's
  source to another type keeps both sources;
- directives: `$patch: replace|delete` on an object or list element (`$patch: merge` is an error), `$retainKeys`,
  `$setElementOrder/<list>`, `$deleteFromPrimitiveList/<list>`; a list's order is the patch's order, with the
  original's other elements kept in their places.

Apimachinery fails on a field its Go types lack (when original and patch both hold it as an object or a list); here
such a field merges as a map, and as a list it is replaced. The Pod's strict decoding reports it afterwards.
"""

import copy
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, Final

DIRECTIVE: Final = "$patch"
RETAIN_KEYS: Final = "$retainKeys"
SET_ELEMENT_ORDER: Final = "$setElementOrder"
DELETE_FROM_PRIMITIVE_LIST: Final = "$deleteFromPrimitiveList"
MERGE: Final = "merge"
REPLACE: Final = "replace"
DELETE: Final = "delete"
_RETAIN_KEYS_STRATEGY: Final = "retainKeys"
# The Pod's definitions, slimmed to what merging reads; `python -m scripts.pod_patch_schema` writes it.
POD_PATCH_SCHEMA: Final = "pod_patch_schema.json"


class StrategicMergePatchError(ValueError):
    """A patch that apimachinery would refuse too (bad directive, missing merge key, inconsistent order list...)."""


@dataclass(frozen=True)
class FieldMeta:
    """How one field merges: the schema of its value, its patch strategy ("merge", "replace" or "") and the
    merge key of its list elements ("" for lists of scalars and for fields that are not merged lists)."""

    schema: "PatchSchema"
    strategy: str
    merge_key: str


class PatchSchema:
    """One node of Kubernetes' OpenAPI definitions (as JSON Schema, `$ref`s into `definitions`), asked only for
    what a strategic merge needs. A node the schema does not describe is open: its fields have no strategy."""

    def __init__(self, definitions: Mapping[str, Any], node: Mapping[str, Any]) -> None:
        while "$ref" in node:
            node = definitions[node["$ref"].rpartition("/")[2]]
        self._definitions = definitions
        self._node = node

    def field(self, key: str) -> FieldMeta:
        """The field `key` of an object, or the values of a map (which have no strategy)."""
        properties = self._node.get("properties", {})
        if key in properties:
            prop = properties[key]
            return FieldMeta(
                PatchSchema(self._definitions, prop),
                _strategy(prop.get("x-kubernetes-patch-strategy", ""), key),
                prop.get("x-kubernetes-patch-merge-key", ""),
            )
        values = self._node.get("additionalProperties")
        return FieldMeta(PatchSchema(self._definitions, values if isinstance(values, Mapping) else {}), "", "")

    def items(self) -> "PatchSchema":
        """The schema of a list's elements."""
        items = self._node.get("items")
        return PatchSchema(self._definitions, items if isinstance(items, Mapping) else {})

    def unknown_fields(self, value: Any, path: str = "") -> list[str]:
        """The fields of `value` that the schema does not describe, as Go's strict decoding names them
        (`spec.containers[0].imag`): FMA decodes a patched Pod strictly, so a misspelt field is an error, not lost."""
        if isinstance(value, list):
            items = self.items()
            return [found for at, item in enumerate(value) for found in items.unknown_fields(item, f"{path}[{at}]")]
        if not isinstance(value, Mapping):
            return []
        properties = self._node.get("properties")
        values = self._node.get("additionalProperties")
        found = []
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if properties is not None and key in properties:
                found += PatchSchema(self._definitions, properties[key]).unknown_fields(item, where)
            elif isinstance(values, Mapping):
                found += PatchSchema(self._definitions, values).unknown_fields(item, where)
            elif properties is not None:
                found.append(where)
        return found


def _strategy(declared: str, key: str) -> str:
    """The strategy besides `retainKeys`, which applying a patch ignores (only `$retainKeys` in a patch counts)."""
    strategies = [s for s in declared.split(",") if s]
    others = [s for s in strategies if s != _RETAIN_KEYS_STRATEGY]
    if len(strategies) > 2 or len(others) > 1:
        raise StrategicMergePatchError(f"unexpected patch strategy {declared!r} for field {key!r}")
    return others[0] if others else ""


@functools.cache
def pod_schema() -> PatchSchema:
    """The core/v1 Pod of the Kubernetes version whose PodSpec `api/` embeds (FMA 0.6 builds against it)."""
    document = json.loads((files("gocompat") / POD_PATCH_SCHEMA).read_text())
    definitions: dict[str, Any] = document["definitions"]
    return PatchSchema(definitions, definitions[document["root"]])


def apply_strategic_merge_patch(
    original: Mapping[str, Any], patch: Mapping[str, Any], schema: PatchSchema
) -> dict[str, Any]:
    """`original` patched by `patch`; neither argument is modified."""
    return _merge_map(copy.deepcopy(dict(original)), copy.deepcopy(dict(patch)), schema)


def _merge_map(original: dict[str, Any], patch: dict[str, Any], schema: PatchSchema) -> dict[str, Any]:
    """Go's `mergeMap`, with `MergeParallelList` and `IgnoreUnmatchedNulls`; both maps are ours to change."""
    if DIRECTIVE in patch:
        directive = patch.pop(DIRECTIVE)
        if directive == REPLACE:
            return patch
        if directive == DELETE:
            return {}
        raise StrategicMergePatchError(f"unknown patch type {directive!r} in map {patch}")
    _apply_retain_keys(original, patch)
    _apply_element_orders(original, patch, schema)
    for key, value in patch.items():
        is_delete_list = key.startswith(DELETE_FROM_PRIMITIVE_LIST)
        if is_delete_list:
            key = _directive_target(key, DELETE_FROM_PRIMITIVE_LIST)
        if value is None:
            original.pop(key, None)
        elif key not in original or type(original[key]) is not type(value):
            if not is_delete_list:
                _set_or_drop(original, key, _without_directives(_without_nulls(value)))
        elif isinstance(value, dict):
            field = schema.field(key)
            original[key] = value if field.strategy == REPLACE else _merge_map(original[key], value, field.schema)
        elif isinstance(value, list):
            original[key] = _merge_list_field(original[key], value, schema.field(key), is_delete_list)[0]
        else:
            original[key] = value
    return original


def _set_or_drop(target: dict[str, Any], key: str, kept: tuple[Any, bool]) -> None:
    value, keep = kept
    if keep:
        target[key] = value
    else:
        target.pop(key, None)


def _directive_target(key: str, prefix: str) -> str:
    """`$setElementOrder/containers` -> `containers`."""
    head, slash, target = key.partition("/")
    if not slash or head != prefix:
        raise StrategicMergePatchError(f"invalid patch format: {key!r} is not {prefix}/<field>")
    return target


def _without_nulls(value: Any) -> Any:
    """The value with every null-valued map entry removed, at any depth (a new key's value must not carry them)."""
    if isinstance(value, dict):
        for key in [k for k, v in value.items() if v is None]:
            del value[key]
        for item in value.values():
            _without_nulls(item)
    elif isinstance(value, list):
        for item in value:
            _without_nulls(item)
    return value


def _without_directives(value: Any) -> tuple[Any, bool]:
    """The value without the objects that carry `$patch`, at any depth, and whether anything is left to keep."""
    if isinstance(value, dict):
        if DIRECTIVE in value:
            return None, False
        for key in list(value):
            _set_or_drop(value, key, _without_directives(value[key]))
        return value, True
    if isinstance(value, list):
        return [item for item, keep in map(_without_directives, value) if keep], True
    return value, True


def _apply_retain_keys(original: dict[str, Any], patch: dict[str, Any]) -> None:
    """`$retainKeys: [...]`: the original keeps only the listed keys, and the patch may set no others."""
    if RETAIN_KEYS not in patch:
        return
    retained = patch.pop(RETAIN_KEYS)
    if not isinstance(retained, list):
        raise StrategicMergePatchError(f"invalid patch format of {RETAIN_KEYS}: {retained!r} is not a list")
    allowed = {key for key in retained if isinstance(key, str)}
    for key, value in patch.items():
        directive = key.startswith((DELETE_FROM_PRIMITIVE_LIST, SET_ELEMENT_ORDER))
        if value is not None and not directive and key not in allowed:
            raise StrategicMergePatchError(f"patch sets {key!r}, which its {RETAIN_KEYS} {retained} omits")
    for key in [k for k in original if k not in allowed]:
        del original[key]


def _merge_list_field(
    original: list[Any], patch: list[Any], field: FieldMeta, is_delete_list: bool
) -> tuple[list[Any], list[Any]]:
    """Go's `mergeSliceHandler`: only merge-strategy lists (and `$deleteFromPrimitiveList`) merge. Returns the
    result and the original as Go's caller sees it afterwards (see `_merge_list`)."""
    if field.strategy != MERGE and not is_delete_list:
        return patch, original
    return _merge_list(original, patch, field.schema.items(), field.merge_key, is_delete_list)


def _merge_list(
    original: list[Any], patch: list[Any], items: PatchSchema, merge_key: str, is_delete_list: bool
) -> tuple[list[Any], list[Any]]:
    """Go's `mergeSlice`: merge by key (objects) or as a set (scalars), then put the result in order.

    Go deletes elements of a list of objects by shifting the rest down in the list's own array, and appends new
    ones into the slots that frees. The caller's view of the original list shares that array, and the
    `$setElementOrder` step orders by it, so that view is returned too: it decides the order of a `kubectl apply`
    patch that both deletes and adds containers, say."""
    if not original and not patch:
        return original, original
    of_maps = _element_type(original, patch) is dict
    if not of_maps:
        if is_delete_list:
            return [item for item in original if not _contains(patch, item)], original
        merged = _unique(original + patch)
        view = original
    else:
        if not merge_key:
            raise StrategicMergePatchError(f"cannot merge lists of objects without a merge key: {patch}")
        array, live, plain, replace = _apply_element_directives(original, patch, merge_key)
        original, patch = (plain, []) if replace else (array[:live], plain)
        merged = list(original)
        for element in patch:
            at = _find(merged, merge_key, _merge_key_value(element, merge_key))
            if at is None:
                merged.append(element)
            else:
                merged[at] = _merge_map(merged[at], element, items)
        view = array if replace else (merged + array[len(merged) :])[: len(array)]
    patch_items, server_only = _partition(merged, patch, merge_key)
    return _normalize_order(patch_items, server_only, patch, original, merge_key, of_maps), view


def _element_type(*lists: list[Any]) -> type:
    """Go's `sliceElementType`: every element of the lists has one JSON type, and is not a list."""
    kinds = {type(item) for items in lists for item in items}
    if not kinds:
        raise StrategicMergePatchError("no elements in any of the given lists")
    if len(kinds) > 1 or type(None) in kinds:
        raise StrategicMergePatchError(f"list element types are not identical: {list(lists)}")
    (kind,) = kinds
    if kind is list:
        raise StrategicMergePatchError("lists of lists are not supported")
    return kind


def _apply_element_directives(
    original: list[Any], patch: list[Any], merge_key: str
) -> tuple[list[Any], int, list[Any], bool]:
    """Go's `mergeSliceWithSpecialElements`: apply the `$patch: delete` elements as Go does, in the original's array
    (`live` elements remain at its front); note a `$patch: replace` element, which makes the patch's other elements
    the whole list. Returns the array, `live`, those other elements, and whether to replace."""
    array = list(original)
    live = len(array)
    plain = []
    replace = False
    for element in patch:
        if DIRECTIVE not in element:
            plain.append(element)
            continue
        directive = element[DIRECTIVE]
        if directive == DELETE:
            value = _merge_key_value(element, merge_key)
            while (at := _find(array[:live], merge_key, value)) is not None:
                array[at : live - 1] = array[at + 1 : live]
                live -= 1
        elif directive == REPLACE:
            replace = True
        elif directive == MERGE:
            raise StrategicMergePatchError("merging lists cannot yet be specified in the patch")
        else:
            raise StrategicMergePatchError(f"unknown patch type {directive!r} in list element {element}")
    return array, live, plain, replace


def _apply_element_orders(original: dict[str, Any], patch: dict[str, Any], schema: PatchSchema) -> None:
    """Go's `mergePatchIntoOriginal`: merge each list that has a `$setElementOrder/<list>` and order it: the listed
    elements as listed, the original's others interleaved where they were. Removes what it handled from `patch`."""
    for directive in [k for k in patch if k.startswith(SET_ELEMENT_ORDER)]:
        order = patch.pop(directive)
        key = _directive_target(directive, SET_ELEMENT_ORDER)
        if not isinstance(order, list):
            raise StrategicMergePatchError(f"invalid patch format of {directive}: {order!r} is not a list")
        current: list[Any] | None = original.get(key)
        incoming: list[Any] | None = patch.get(key)
        for where, holder, value in (("original", original, current), ("patch", patch, incoming)):
            if key in holder and not isinstance(value, list):
                raise StrategicMergePatchError(f"{directive}: the {where}'s {key!r} is not a list: {value!r}")
        field = schema.field(key)
        _check_order(incoming or [], order, field.merge_key)
        if current is not None and incoming is not None:
            merged, current = _merge_list_field(current, incoming, field, False)
        elif current is not None:
            merged = current
        elif incoming is not None:
            merged = _without_directives(incoming)[0]
        else:
            continue
        patch_items, server_only = _partition(merged, order, field.merge_key)
        of_maps = _element_type(current or [], incoming or []) is dict
        original[key] = _normalize_order(patch_items, server_only, order, current or [], field.merge_key, of_maps)
        patch.pop(key, None)


def _check_order(patch: list[Any], order: list[Any], merge_key: str) -> None:
    """The patch's elements (but deletions) must appear in `$setElementOrder` in the same relative order."""
    if not order or not patch:
        return
    elements = [e for e in patch if not _is_delete_element(e)] if merge_key else patch
    at = listed = 0
    while at < len(elements) and listed < len(order):
        if isinstance(elements[at], dict) and DIRECTIVE in elements[at]:
            at += 1
            continue
        if _key_equal(elements[at], order[listed], merge_key):
            at += 1
        listed += 1
    if at < len(elements) and listed >= len(order):
        raise StrategicMergePatchError(f"the order in patch list {patch} doesn't match {SET_ELEMENT_ORDER} {order}")


def _is_delete_element(element: Any) -> bool:
    if not isinstance(element, dict):
        raise StrategicMergePatchError(f"expected an object in a list with a merge key, got {element!r}")
    return bool(element.get(DIRECTIVE) == DELETE)


def _key_equal(left: Any, right: Any, merge_key: str) -> bool:
    if not merge_key:
        return _same(left, right)
    return _same(_merge_key_value(left, merge_key), _merge_key_value(right, merge_key))


def _merge_key_value(element: Any, merge_key: str) -> Any:
    if not isinstance(element, dict):
        raise StrategicMergePatchError(f"expected an object in a list with merge key {merge_key!r}, got {element!r}")
    if merge_key not in element:
        raise StrategicMergePatchError(f"map: {element} does not contain declared merge key: {merge_key}")
    return element[merge_key]


def _same(left: Any, right: Any) -> bool:
    """Go's `==` on decoded JSON values: 1 and 1.0 (int64, float64) or 1 and true differ; objects equal nothing."""
    return type(left) is type(right) and not isinstance(left, (dict, list)) and bool(left == right)


def _holds(item: dict[str, Any], merge_key: str, value: Any) -> bool:
    """Whether the object's merge key is present and equals `value`."""
    return merge_key in item and _same(item[merge_key], value)


def _contains(items: Sequence[Any], value: Any) -> bool:
    return any(_same(item, value) for item in items)


def _unique(items: list[Any]) -> list[Any]:
    """Scalars without repeats, first occurrences kept."""
    result: list[Any] = []
    for item in items:
        if not _contains(result, item):
            result.append(item)
    return result


def _find(items: list[Any], merge_key: str, value: Any) -> int | None:
    """The position of the first object whose merge key equals `value`."""
    for at, item in enumerate(items):
        if not isinstance(item, dict):
            raise StrategicMergePatchError(f"value for key {at} is not a map")
        if _holds(item, merge_key, value):
            return at
    return None


def _identity(item: Any, merge_key: str, of_maps: bool) -> Any:
    """What ordering compares: an object's merge key value, or a scalar itself."""
    if of_maps:
        return item.get(merge_key) if isinstance(item, dict) else None
    return item


def _index(items: Sequence[Any], item: Any, merge_key: str, of_maps: bool) -> int:
    """Go's `index`: the first position of `item` in `items`, or -1."""
    wanted = _identity(item, merge_key, of_maps)
    for at, candidate in enumerate(items):
        if _same(_identity(candidate, merge_key, of_maps), wanted):
            return at
    return -1


def _partition(merged: list[Any], by: list[Any], merge_key: str) -> tuple[list[Any], list[Any]]:
    """The merged elements that `by` names (by merge key, or by value for scalars), and the others."""
    named: list[Any] = []
    others: list[Any] = []
    for item in merged:
        if merge_key:
            found = _find(by, merge_key, _merge_key_value(item, merge_key)) is not None
        else:
            found = _contains(by, item)
        (named if found else others).append(item)
    return named, others


def _normalize_order(
    patch_items: list[Any],
    server_only: list[Any],
    patch_order: list[Any],
    server_order: list[Any],
    merge_key: str,
    of_maps: bool,
) -> list[Any]:
    """Go's `normalizeElementOrder`: patch elements in the patch's order, the others in the original's, the two
    interleaved by their places in the original (a patch element comes first where the original cannot tell)."""
    right = _sort_by(patch_items, patch_order, merge_key, of_maps)
    left = _sort_by(server_only, server_order, merge_key, of_maps)
    result: list[Any] = []
    while left and right:
        at_left = _index(server_order, left[0], merge_key, of_maps)
        at_right = _index(server_order, right[0], merge_key, of_maps)
        result.append((left if 0 <= at_left < at_right else right).pop(0))
    return result + left + right


def _sort_by(items: list[Any], order: list[Any], merge_key: str, of_maps: bool) -> list[Any]:
    """Go's `normalizeSliceOrder`: a stable sort by position in `order`, `$patch: delete` elements last.

    Go's comparator calls an element absent from `order` smaller than anything, which is no ordering, so the result
    depends on the sort algorithm: this is the insertion sort `sort.SliceStable` runs on up to 20 elements (beyond
    that, Go merges sorted blocks, which gives the same result unless such elements are present; only malformed
    patches, like an empty `$setElementOrder` beside additions, produce them)."""
    deletions: list[Any] = []
    if of_maps:
        for item in items + order:
            _merge_key_value(item, merge_key)
        deletions = [item for item in items if _is_delete_element(item)]
        items = [item for item in items if not _is_delete_element(item)]
    ranked = [(_index(order, item, merge_key, of_maps), item) for item in items]
    for end in range(1, len(ranked)):
        at = end
        while at > 0 and (ranked[at][0] < ranked[at - 1][0] or min(ranked[at][0], ranked[at - 1][0]) < 0):
            ranked[at - 1], ranked[at] = ranked[at], ranked[at - 1]
            at -= 1
    return [item for _, item in ranked] + deletions
