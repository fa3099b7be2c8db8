"""The pydantic base of every Kubernetes object schema in `api/`, and the few types they share.

Fields are snake_case in Python and camelCase on the wire (Kubernetes' convention); attribute
docstrings become the field descriptions of the generated CRDs, so they are written for users.
"""

from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, Strict
from pydantic.alias_generators import to_camel

# A JSON-schema key telling the CRD generator to use a Kubernetes definition (e.g.
# "io.k8s.api.core.v1.PodSpec") for this node instead of the schema pydantic derives.
KUBERNETES_DEFINITION: Final = "x-dualpods-kubernetes-definition"


def kubernetes_definition(name: str) -> dict[str, Any]:
    """`json_schema_extra` for a field or model whose CRD schema is Kubernetes' own definition `name`."""
    return {KUBERNETES_DEFINITION: name}


class KubeModel(BaseModel):
    """camelCase aliases (Python code may use either name), fields unknown to the schema ignored (the
    apiserver prunes them too), attribute docstrings as descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        use_attribute_docstrings=True,
    )

    def to_k8s(self) -> dict[str, Any]:
        """The JSON object, with Go's `omitempty`: fields equal to their defaults are left out.

        So an emptied list disappears from the output; write status with a replace (PUT), not a merge
        patch, or old entries would stay.
        """
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)


# Go's int32/int64 fields: JSON integers only (no "8005" strings, no floats, no booleans). The int32 range
# goes into the CRD, so the apiserver rejects what a Go client could not decode; the int64 one cannot (the
# apiserver keeps bounds as float64, where 2**63 - 1 rounds up and overflows).
Int32 = Annotated[int, Strict(), Field(ge=-(2**31), le=2**31 - 1, json_schema_extra={"format": "int32"})]
Int64 = Annotated[int, Strict(), Field(json_schema_extra={"format": "int64"})]
