"""Kubernetes label syntax (apimachinery's IsQualifiedName and IsValidLabelValue), with its error wording.

Used to validate label selectors, and by the dual-pods controller for an ISC's routing labels and
annotations (keys must be qualified names, label values valid).
"""

import re
from typing import Final

_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_MAX: Final = 63
_PREFIX_MAX: Final = 253
_NAME_RULE: Final = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
)


def qualified_name_errors(key: str) -> list[str]:
    """Why `key` is not a qualified name (`[prefix/]name`, e.g. `nvidia.com/gpu.present`); empty if it is."""
    prefix, slash, name = key.rpartition("/")
    errors: list[str] = []
    if slash and not prefix:
        errors.append("prefix part must be non-empty")
    elif slash and (len(prefix) > _PREFIX_MAX or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        errors.append(f"prefix part must be a lowercase DNS subdomain of at most {_PREFIX_MAX} characters")
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > _NAME_MAX:
        errors.append(f"name part must be no more than {_NAME_MAX} characters")
    elif not _NAME.fullmatch(name):
        errors.append(f"name part {_NAME_RULE}")
    return errors


def label_value_errors(value: str) -> list[str]:
    """Why `value` is not a valid label value (empty is valid); empty if it is."""
    if len(value) > _NAME_MAX:
        return [f"must be no more than {_NAME_MAX} characters"]
    if value and not _NAME.fullmatch(value):
        return [_NAME_RULE]
    return []
