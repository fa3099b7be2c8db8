"""Which Nodes a LauncherPopulationPolicy selects: a label selector plus allocatable-resource ranges, and
(ours, for DRA Nodes) ranges of the devices DRA drivers publish for the Node.

The matching rules are FMA's (reference §4, "Node match"): the labels must match, and every listed
resource must be in the Node's `status.allocatable` within the inclusive range; an empty range map
matches every Node. A Node served by a DRA driver (NVIDIA's `gpu.nvidia.com`) has no GPU allocatable, so
`draDevices` ranges the number of devices each named driver publishes for it in ResourceSlices instead.
"""

from collections.abc import Mapping
from enum import StrEnum
from typing import Final, Self

from pydantic import Field, model_validator

from api.kubemodel import KubeModel, kubernetes_definition
from api.labels import label_value_errors, qualified_name_errors
from api.quantity import Quantity

LABEL_SELECTOR_DEFINITION: Final = "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"


class Operator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


def _check_label(key: str, values: list[str]) -> None:
    """apimachinery's checks when it turns a selector into requirements (LabelSelectorAsSelector)."""
    if errors := qualified_name_errors(key):
        raise ValueError(f"invalid label key {key!r}: {'; '.join(errors)}")
    for value in values:
        if errors := label_value_errors(value):
            raise ValueError(f"invalid label value {value!r} for key {key!r}: {'; '.join(errors)}")


class LabelSelectorRequirement(KubeModel):
    key: str
    """The label key that the selector applies to."""
    operator: Operator
    """In, NotIn, Exists or DoesNotExist."""
    values: list[str] = Field(default_factory=list)
    """Non-empty for In and NotIn, empty for Exists and DoesNotExist."""

    @model_validator(mode="after")
    def _valid(self) -> Self:
        _check_label(self.key, self.values)
        takes_values = self.operator in (Operator.IN, Operator.NOT_IN)
        if takes_values and not self.values:
            raise ValueError(f"operator {self.operator} on {self.key!r} needs at least one value")
        if not takes_values and self.values:
            raise ValueError(f"operator {self.operator} on {self.key!r} takes no values")
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        match self.operator:
            case Operator.IN:
                return labels.get(self.key) in self.values
            case Operator.NOT_IN:
                return labels.get(self.key) not in self.values
            case Operator.EXISTS:
                return self.key in labels
            case Operator.DOES_NOT_EXIST:
                return self.key not in labels


class LabelSelector(KubeModel, json_schema_extra=kubernetes_definition(LABEL_SELECTOR_DEFINITION)):
    """metav1.LabelSelector: all of `matchLabels` and `matchExpressions` must hold; an empty selector
    matches everything."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    @model_validator(mode="after")
    def _valid(self) -> Self:
        for key, value in self.match_labels.items():
            _check_label(key, [value])
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.match_labels.items()) and all(
            requirement.matches(labels) for requirement in self.match_expressions
        )


class ResourceRange(KubeModel):
    """A range by inclusive minimum and maximum quantity values."""

    min: Quantity | None = None
    """The minimum quantity required, or null for no lower bound."""
    max: Quantity | None = None
    """The maximum quantity allowed, or null for no upper bound."""

    def contains(self, quantity: Quantity) -> bool:
        return (self.min is None or self.min <= quantity) and (self.max is None or quantity <= self.max)


class EnhancedNodeSelector(KubeModel):
    """Selects Nodes by labels, by allocatable resources and by the devices DRA drivers publish for them."""

    label_selector: LabelSelector
    """Selects Nodes by their labels."""
    allocatable_resources: dict[str, ResourceRange] = Field(default_factory=dict)
    """Resource name (as in a Node's `status.allocatable`, e.g. `nvidia.com/gpu`, `memory`) to the range
    its allocatable quantity must lie in; a Node without the resource does not match."""
    dra_devices: dict[str, ResourceRange] = Field(default_factory=dict)
    """DRA driver name (a ResourceSlice's `spec.driver`, e.g. `gpu.nvidia.com` for NVIDIA's GPU driver) to the
    range the number of devices it publishes for the Node (slices with `spec.nodeName` set to it, newest pool
    generation) must lie in; a Node for which the driver publishes no device does not match. Not FMA's: for
    Nodes whose GPUs are allocated through DRA, which have no `nvidia.com/gpu` allocatable."""

    def matches(
        self,
        labels: Mapping[str, str],
        allocatable: Mapping[str, str | int | Quantity],
        dra_devices: Mapping[str, int] | None = None,
    ) -> bool:
        """Whether a Node with these labels, `status.allocatable` and device counts per DRA driver is selected."""
        devices = dra_devices or {}
        return (
            self.label_selector.matches(labels)
            and all(
                name in allocatable and bounds.contains(Quantity(allocatable[name]))
                for name, bounds in self.allocatable_resources.items()
            )
            and all(
                devices.get(driver, 0) > 0 and bounds.contains(Quantity(devices[driver]))
                for driver, bounds in self.dra_devices.items()
            )
        )
