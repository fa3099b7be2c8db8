"""An InferenceServerConfig's routing metadata: labels and annotations put on a bound provider.

They are checked when a binding is made and applied only once the instance serves, so a provider is
never an inference endpoint (e.g. of an InferencePool) before it can answer.
"""

from pydantic import BaseModel, Field

from api import keys
from api.crds import InferenceServerConfig
from api.labels import label_value_errors, qualified_name_errors
from controller import pods
from controller.pods import Pod


def _reserved(key: str) -> bool:
    return key.startswith(keys.RESERVED_METADATA_PREFIXES)


class RoutingMetadata(BaseModel):
    """The committed set, as stored in the provider's isc-routing-metadata annotation."""

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


def committed_routing(provider: Pod) -> RoutingMetadata:
    """The set committed on a provider at its binding (empty when unbound)."""
    return RoutingMetadata.model_validate_json(
        pods.annotations(provider).get(keys.ISC_ROUTING_METADATA_ANNOTATION) or "{}"
    )


def from_isc(isc: InferenceServerConfig) -> RoutingMetadata:
    server = isc.spec.model_server_config
    return RoutingMetadata(labels=dict(server.labels), annotations=dict(server.annotations))


def problems(routing: RoutingMetadata, pod_labels: dict[str, str], pod_annotations: dict[str, str]) -> list[str]:
    """Why this metadata cannot go on a Pod that already carries `pod_labels` and `pod_annotations`."""
    found: list[str] = []
    for kind, entries, existing in (
        ("label", routing.labels, pod_labels),
        ("annotation", routing.annotations, pod_annotations),
    ):
        for key, value in entries.items():
            found += [f"{kind} key {key!r}: {e}" for e in qualified_name_errors(key)]
            if _reserved(key):
                found.append(f"{kind} key {key!r} uses a reserved prefix")
            if key in existing:  # even with the same value: unbinding removes the key, the Pod's own with it
                found.append(f"{kind} {key!r} is already on the Pod")
            if kind == "label":
                found += [f"label {key!r} value {value!r}: {e}" for e in label_value_errors(value)]
    return found


def outdated_routing(provider: Pod) -> list[str]:
    """Why the routing metadata committed at the provider's binding no longer fits it (the rules changed, or
    the Pod came to carry one of its keys on its own)."""
    routing = committed_routing(provider)
    other_labels = {k: v for k, v in pods.labels(provider).items() if k not in routing.labels}
    other_annotations = {k: v for k, v in pods.annotations(provider).items() if k not in routing.annotations}
    return problems(routing, other_labels, other_annotations)
