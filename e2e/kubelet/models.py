"""Kubernetes JSON (the dicts an informer caches) into kubernetes-asyncio's typed models.

The kubelet works on `V1Pod`s, which the client builds only inside its private, name-mangled deserializer.
This reads the models' public schema instead: each model class names its attributes' types
(`openapi_types`: "str", "list[V1Container]", "dict(str, str)", "datetime", a model's name) and their JSON
keys (`attribute_map`). Timestamps are read by the standard library: the API server writes RFC 3339, and
dateutil's general parser, the client's, was a quarter of the kubelet's time with hundreds of Nodes.
"""

import datetime
import functools
import re
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio.client import models

Decode = Callable[[Any], Any]

_LIST = re.compile(r"list\[(.*)\]")
_DICT = re.compile(r"dict\(([^,]*), (.*)\)")
_PRIMITIVES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}


def from_json(data: Any, type_name: str) -> Any:
    """`data` as the type the client calls `type_name` ("V1Pod", "list[V1Container]", "datetime"...)."""
    return None if data is None else _decoder(type_name)(data)


@functools.cache
def _decoder(type_name: str) -> Decode:
    if listed := _LIST.fullmatch(type_name):
        item = listed.group(1)
        return lambda data: [from_json(value, item) for value in data]
    if mapped := _DICT.fullmatch(type_name):
        value_type = mapped.group(2)
        return lambda data: {key: from_json(value, value_type) for key, value in data.items()}
    if type_name == "object":
        return lambda data: data
    if type_name == "datetime":
        return datetime.datetime.fromisoformat
    if type_name == "date":
        return datetime.date.fromisoformat
    if type_name in _PRIMITIVES:
        return functools.partial(_primitive, _PRIMITIVES[type_name])
    return functools.partial(_model, getattr(models, type_name))


def _primitive(kind: type, data: Any) -> Any:
    try:
        return kind(data)
    except TypeError:  # not convertible: kept as sent, as the client keeps it
        return data


def _model(model: Any, data: Any) -> Any:
    if not model.openapi_types:
        return data
    keys = model.attribute_map
    return model(
        **{name: from_json(data[keys[name]], kind) for name, kind in model.openapi_types.items() if keys[name] in data}
    )
