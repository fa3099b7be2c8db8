"""The three custom resources of group `fma.llm-d.ai/v1alpha1` (FMA 0.6 compatible), plus dualpods' extensions.

Each root class parses the objects kubernetes-asyncio's CustomObjectsApi returns (`from_k8s`) and dumps
back (`to_k8s`); its `RESOURCE` names the plural etc. for API calls. `config/crd/` is generated from
these classes (`python -m api.crdgen`), so the models and the apiserver enforce the same schema. The
models also make the checks FMA's controllers make on a label selector (the apiserver accepts any
operator or key): a controller that cannot parse an object reports the ValidationError in its status.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Final, Literal, Self

from pydantic import Field, JsonValue, field_validator, model_validator

from api import keys
from api.kubemodel import Int32, Int64, KubeModel, kubernetes_definition
from api.quantity import NonNegativeQuantity
from api.selectors import EnhancedNodeSelector, LabelSelector

GROUP: Final = "fma.llm-d.ai"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
# `kubectl get fma` lists all three kinds.
CATEGORY: Final = "fma"


@dataclass(frozen=True)
class Resource:
    """How the API addresses one kind (CustomObjectsApi calls take GROUP, VERSION and `plural`)."""

    kind: str
    plural: str
    short_name: str

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


class ObjectMeta(KubeModel, extra="allow"):
    """The object's metadata; fields not named here (ownerReferences, managedFields, ...) are kept as is."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    deletion_timestamp: str | None = None


# The condition types of all three kinds (docs/api.md, "Status conditions", says what each means per kind).
# `Ready` and `Stalled` are the names kstatus reads (Flux, kpt, cli-utils): Stalled=True is a failure that
# needs a change of the object or of what it names, not more time.
READY: Final = "Ready"
STALLED: Final = "Stalled"
# An InferenceServerConfig with a warm pool: whether the pool holds its declared copies, and why not.
POOL_READY: Final = "PoolReady"
ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(KubeModel):
    """Condition contains details for one aspect of the current state of this API Resource (the shape of
    Kubernetes' metav1.Condition, so `kubectl wait --for=condition=Ready` and kstatus read it)."""

    type: Annotated[
        str,
        Field(
            max_length=316,
            pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
            r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        ),
    ]
    """type of condition in CamelCase: `Ready`, `Stalled`, or an InferenceServerConfig's `PoolReady`."""
    status: ConditionStatus
    """status of the condition, one of True, False, Unknown."""
    observed_generation: Annotated[Int64, Field(ge=0)] = 0
    """observedGeneration is the `metadata.generation` that the condition was set based upon."""
    last_transition_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})]
    """lastTransitionTime is the last time the condition changed from one status to another (RFC 3339)."""
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")]
    """reason is a programmatic identifier (CamelCase) of the condition's last transition."""
    # Optional, unlike metav1.Condition's: the API server refuses an empty string here (it reads it as null),
    # so an empty message is left out.
    message: Annotated[str, Field(max_length=32768)] = ""
    """message is a human readable message with details about the transition; absent when there is none."""


class Status(KubeModel):
    """What the controllers observed of this object."""

    observed_generation: Int64 = 0
    """`observedGeneration` is the `metadata.generation` last seen by the controller."""
    errors: list[str] = Field(default_factory=list)
    """`errors` reports problems seen in the desired state of this object; in particular, in the version
    reported by `observedGeneration`."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """dualpods extension: `Ready` and `Stalled` (Kubernetes' condition shape, one of each type). Stalled is True
    exactly when `errors` is not empty, its message those errors joined by "; ". An InferenceServerConfig with a
    warm pool has `PoolReady` too."""

    def condition(self, kind: str) -> Condition | None:
        """The condition of type `kind`, if the controller has set one."""
        return next((c for c in self.conditions if c.type == kind), None)


class CustomResource(KubeModel):
    """An object of one of our kinds; `apiVersion` and `kind` are checked on input and added on output."""

    RESOURCE: ClassVar[Resource]

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: KubeModel  # narrowed by each kind
    status: Status = Field(default_factory=Status)

    @model_validator(mode="before")
    @classmethod
    def _check_type(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            for field, expected in (("apiVersion", API_VERSION), ("kind", cls.RESOURCE.kind)):
                if field in data and data[field] != expected:
                    raise ValueError(f"{field} is {data[field]!r}, expected {expected!r}")
        return data

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any]) -> Self:
        """Parse an object as the API returns it (a JSON dict); raises pydantic.ValidationError."""
        return cls.model_validate(obj)

    def to_k8s(self) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": self.RESOURCE.kind, **super().to_k8s()}


# --- validation rules the API server runs (CEL, x-kubernetes-validations) ----------------------------------------
# Kubernetes' CEL `format` library (1.31+) checks names exactly as apimachinery does; an object stored before a rule
# existed stays updatable as long as the field the rule is on does not change (validation ratcheting, 1.30+).


def _rule(rule: str, message: str, **extra: str) -> dict[str, JsonValue]:
    return {"rule": rule, "message": message, **extra}


def _metadata_key_rules(kind: str) -> list[JsonValue]:
    """What the dual-pods controller would refuse at binding time in a map of routing `kind`s."""
    reserved = " || ".join(f"k.startsWith('{prefix}')" for prefix in keys.RESERVED_METADATA_PREFIXES)
    prefixes = ", ".join(keys.RESERVED_METADATA_PREFIXES)
    return [
        _rule(
            "self.all(k, !format.qualifiedName().validate(k).hasValue())",
            f"every {kind} key must be a qualified name ([DNS subdomain prefix/]name of at most 63 alphanumerics, "
            "'-', '_' or '.', starting and ending with an alphanumeric)",
        ),
        _rule(
            f"!self.exists(k, {reserved})",
            f"{kind} keys must not use the reserved prefixes {prefixes}",
            messageExpression=f"'{kind} key ' + self.filter(k, {reserved})[0] + ' uses a reserved prefix ({prefixes})'",
        ),
    ]


_LABEL_VALUE_RULE: Final = _rule(
    "self.all(k, !format.labelValue().validate(self[k]).hasValue())",
    "every label value must be a valid label value (at most 63 alphanumerics, '-', '_' or '.', starting and ending "
    "with an alphanumeric, or empty)",
)
_LAUNCHER_CONTAINER_RULE: Final = _rule(
    f"has(self.spec.containers) && self.spec.containers.exists(c, c.name == '{keys.INFERENCE_SERVER_CONTAINER}')",
    f"podTemplate.spec must have a container named {keys.INFERENCE_SERVER_CONTAINER} (it runs the launcher)",
    fieldPath=".spec.containers",
    reason="FieldValueRequired",
)
VALIDATIONS: Final = "x-kubernetes-validations"
# Routing labels and annotations per InferenceServerConfig, and a label value's length: bounds on what the rules above
# cost the API server. Only the CRD carries them, never the models: an object stored before they existed must still
# parse, so that the controllers can report what is wrong with it.
ROUTING_KEY_BOUNDS: Final[dict[str, JsonValue]] = {"maxProperties": 64}
LABEL_VALUE_BOUND: Final[dict[str, JsonValue]] = {"maxLength": 63}


# --- InferenceServerConfig -------------------------------------------------------------------------


class ModelServerConfig(KubeModel):
    """ModelServerConfig defines the configuration for the model server."""

    port: Annotated[Int32, Field(ge=1, le=65535)]
    """Port is the port on which the vLLM server will listen. Particularly, management of vLLM instances'
    sleep state is done through this port."""
    options: str = ""
    """Options are the vLLM startup options, excluding Port."""
    env_vars: dict[str, str] = Field(default_factory=dict, alias="env_vars")
    """EnvVars are the environment variables for the vLLM instance."""
    labels: dict[str, Annotated[str, Field(json_schema_extra=LABEL_VALUE_BOUND)]] = Field(
        default_factory=dict,
        json_schema_extra={**ROUTING_KEY_BOUNDS, VALIDATIONS: [*_metadata_key_rules("label"), _LABEL_VALUE_RULE]},
    )
    """Labels are applied to the server-providing Pod while bound. Keys must be valid Kubernetes label keys
    and must not use reserved prefixes (dual-pods.llm-d.ai/, kubernetes.io/, k8s.io/). Values must be
    valid Kubernetes label values."""
    annotations: dict[str, str] = Field(
        default_factory=dict, json_schema_extra={**ROUTING_KEY_BOUNDS, VALIDATIONS: _metadata_key_rules("annotation")}
    )
    """Annotations are applied to the server-providing Pod while bound. Keys must be valid Kubernetes
    annotation keys and must not use reserved prefixes (dual-pods.llm-d.ai/, kubernetes.io/, k8s.io/)."""


class LoraAdapter(KubeModel):
    """dualpods extension: a LoRA adapter the model server serves under its own model name."""

    name: Annotated[str, Field(min_length=1)]
    """Name is the model name clients use to ask for this adapter."""
    path: Annotated[str, Field(min_length=1)]
    """Path is where the adapter's files are, as the model server sees them."""


class WarmPool(KubeModel):
    """dualpods extension: sleeping copies of this model that the fleet keeps ready ahead of demand, so that its
    first requesters start hot (a wake, seconds) even after a quiet night. The dual-pods controller makes them on
    idle GPUs (no awake instance, no requester bound or on its way) of launchers of this config's LauncherConfig,
    within their `maxInstances` and sleeper budgets, and makes another when a requester wakes one. A pool never
    displaces an awake instance or a bound requester; when real demand needs the room, a budget deletes the
    copies beyond the declared count first, then the least recently used sleepers, and the pool fills again
    where it can."""

    sleepers: Annotated[Int32, Field(ge=0, le=1024)]
    """Sleepers is how many sleeping copies to keep ready."""
    gpus: Annotated[Int32, Field(ge=1, le=64)] = 1
    """GPUs is how many GPUs each copy uses: as many as this model's requesters ask for."""
    node_selector: LabelSelector = Field(default_factory=LabelSelector)
    """NodeSelector picks the Nodes that may hold copies (all Nodes when empty)."""
    min_nodes: Annotated[Int32, Field(ge=1, le=1024)] = 1
    """MinNodes is how many Nodes at least the copies are spread over (while there are that many copies): a
    Node drained or lost takes no more than its share of the pool with it."""


class InferenceServerConfigSpec(KubeModel):
    """Spec defines the desired state of the InferenceServerConfig."""

    launcher_config_name: str
    """LauncherConfigName is the name of the LauncherConfig that this InferenceServerConfig belongs to."""
    model_server_config: ModelServerConfig
    """ModelServerConfig defines the configuration for the model server."""
    lora_adapters: list[LoraAdapter] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """dualpods extension: LoRA adapters the model server loads at start and keeps in step with this
    list while it runs (loading and unloading through vLLM's /v1/load_lora_adapter and
    /v1/unload_lora_adapter), without restarting it. Adapters are not part of an instance's identity."""
    warm_pool: WarmPool | None = None
    """dualpods extension: the warm pool of this model (none when absent or `sleepers: 0`)."""


class InstanceCountingStatus(Status):
    """A status that counts launcher instances, as the launchers' summaries show them."""

    serving_instances: Annotated[Int32, Field(ge=0)] = 0
    """dualpods extension: how many launcher instances of this config are awake and ready, as the launcher Pods'
    `dual-pods.llm-d.ai/instances` summaries show them."""
    sleeping_instances: Annotated[Int32, Field(ge=0)] = 0
    """dualpods extension: how many launcher instances of this config are asleep, ready to be woken (a hot
    start), as the launcher Pods' `dual-pods.llm-d.ai/instances` summaries show them."""


class PoolStatus(KubeModel):
    """dualpods extension: how full the warm pool is."""

    declared: Annotated[Int32, Field(ge=0)]
    """Declared is the pool's `sleepers`."""
    ready: Annotated[Int32, Field(ge=0)]
    """Ready is how many copies are asleep where a requester could wake one now: a free GPU of a Node the pool
    selects, in a launcher no requester holds."""
    loading: Annotated[Int32, Field(ge=0)] = 0
    """Loading is how many copies are being made (loading, or about to be put to sleep)."""
    nodes: Annotated[Int32, Field(ge=0)] = 0
    """Nodes is over how many Nodes the ready copies are spread."""


class InferenceServerConfigStatus(InstanceCountingStatus):
    """What the dual-pods controller observed of this InferenceServerConfig."""

    pool: PoolStatus | None = None
    """dualpods extension: the warm pool, when one is declared (its condition is `PoolReady`)."""

    served_requesters: Annotated[Int32, Field(ge=0)] = 0
    """dualpods extension: how many server-requesting Pods naming this config are served now: bound to a
    server-providing Pod whose instance of this config is awake, and told they are ready."""


class InferenceServerConfig(CustomResource):
    """InferenceServerConfig is the Schema for the InferenceServerConfigs API. It represents the
    configuration parameters required to launch the vLLM process inside the launcher pod."""

    RESOURCE: ClassVar[Resource] = Resource("InferenceServerConfig", "inferenceserverconfigs", "isc")

    spec: InferenceServerConfigSpec
    status: InferenceServerConfigStatus = Field(default_factory=InferenceServerConfigStatus)


# --- LauncherConfig --------------------------------------------------------------------------------


class PodTemplateMetadata(KubeModel):
    """The metadata of launcher Pods made from the template (only labels and annotations are kept)."""

    labels: dict[str, str] = Field(default_factory=dict)
    """Labels for organizing and categorizing objects."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations for storing arbitrary non-identifying metadata."""


class PodTemplate(KubeModel, json_schema_extra={VALIDATIONS: [_LAUNCHER_CONTAINER_RULE]}):
    """A Pod template whose metadata fields are declared explicitly so that the CRD schema keeps them."""

    metadata: PodTemplateMetadata = Field(default_factory=PodTemplateMetadata)
    spec: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra=kubernetes_definition("io.k8s.api.core.v1.PodSpec")
    )
    """Spec defines the behavior of pods created from this template (a core/v1 PodSpec)."""


class SleeperBudget(KubeModel):
    """dualpods extension: memory that the sleeping instances of one launcher may hold, in bytes.

    Before an instance is put to sleep, and before one is woken, the dual-pods controller checks these
    budgets and deletes least-recently-used sleepers to stay within them; when that cannot work it
    reports an error in the requester's status rather than attempting a wake that would fail. An unset
    budget means no byte limit (only `maxInstances` applies). Quantities such as `32Gi` or plain
    integers are accepted."""

    host_memory_bytes: NonNegativeQuantity | None = None
    """Host (CPU) memory that all sleeping instances of one launcher may hold together: a level-1 sleep
    keeps the model's weights in host memory."""
    gpu_memory_bytes: NonNegativeQuantity | None = None
    """GPU memory that the sleeping instances of one launcher may hold together on any one GPU: a
    sleeping vLLM instance still holds its CUDA context and allocator pools (about 1-2 GiB each)."""


class LauncherConfigSpec(KubeModel):
    """LauncherConfigSpec defines the configuration to manage the nominal server-providing pod definition."""

    max_instances: Annotated[Int32, Field(ge=1)]
    """MaxInstances is the maximum number of vLLM instances (awake or sleeping) that one launcher Pod may
    hold."""
    pod_template: PodTemplate = Field(default_factory=PodTemplate)
    """PodTemplate defines the pod specification for the server-providing pod. Its container named
    `inference-server` runs the launcher."""
    # Described by SleeperBudget's docstring, which becomes the field's description in the CRD.
    sleeper_budget: SleeperBudget = Field(default_factory=SleeperBudget)
    verify_wakes: bool = True
    """dualpods extension: whether the launcher checks every wake of this config's instances before the
    requester is told ready: a short greedy probe recorded at the instance's first ready is replayed after
    each wake, and an instance that answers otherwise is killed and replaced (`WakeCheckFailed`). Read when
    an instance is created; FMA's controllers ignore it."""


class LauncherConfigStatus(InstanceCountingStatus):
    """What the launcher populator observed of this LauncherConfig: its template's problems, and the instances
    on the launchers made from it."""


class LauncherConfig(CustomResource):
    """LauncherConfig is the Schema for the LauncherConfigs API. It represents the configuration to manage
    the nominal server-providing pod definition."""

    RESOURCE: ClassVar[Resource] = Resource("LauncherConfig", "launcherconfigs", "lcfg")

    spec: LauncherConfigSpec
    status: LauncherConfigStatus = Field(default_factory=LauncherConfigStatus)


# --- LauncherPopulationPolicy ----------------------------------------------------------------------


class CountForLauncher(KubeModel):
    """How many launchers of one LauncherConfig each selected Node should have."""

    launcher_config_name: str
    """LauncherConfigName is the name of the LauncherConfig this policy applies to."""
    launcher_count: Annotated[Int32, Field(ge=0)]
    """LauncherCount is the total number of launcher pods to maintain."""


class LauncherPopulationPolicySpec(KubeModel):
    """LauncherPopulationPolicySpec defines policy for one type of Node."""

    enhanced_node_selector: EnhancedNodeSelector
    """Selects the target Nodes by labels and by allocatable resources, for example
    `{labelSelector: {matchLabels: {nvidia.com/gpu.present: "true"}}, allocatableResources:
    {nvidia.com/gpu: {min: 8, max: 8}}}`."""
    count_for_launcher: list[CountForLauncher] = Field(
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["launcherConfigName"]}
    )
    """CountForLauncher declares the desired number of launchers on the relevant Node, for various
    LauncherConfigs; each LauncherConfig at most once."""

    @classmethod
    def empty(cls) -> "LauncherPopulationPolicySpec":
        """FMA's zero-valued spec: every Node selected, no launcher asked for."""
        return cls.model_validate({"enhancedNodeSelector": {"labelSelector": {}}, "countForLauncher": []})

    @field_validator("count_for_launcher")
    @classmethod
    def _unique_names(cls, counts: list[CountForLauncher]) -> list[CountForLauncher]:
        names = [count.launcher_config_name for count in counts]
        if duplicates := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"launcherConfigName listed more than once: {', '.join(duplicates)}")
        return counts


class LauncherPopulationPolicy(CustomResource):
    """LauncherPopulationPolicy defines the policy for pro-active creation of launcher Pods for a given type
    of Node. For a (Node, LauncherConfig) pair the population policy is the maximum count over the
    policies that select the Node and name the LauncherConfig, and 0 when none does; the number of
    launchers kept is the larger of that and what the server-requesting Pods need."""

    RESOURCE: ClassVar[Resource] = Resource("LauncherPopulationPolicy", "launcherpopulationpolicies", "lpp")

    spec: LauncherPopulationPolicySpec = Field(default_factory=lambda: LauncherPopulationPolicySpec.empty())
    """Optional, as in FMA: a policy without one (Go's zero spec) asks for no launchers."""


KINDS: Final[tuple[type[CustomResource], ...]] = (InferenceServerConfig, LauncherConfig, LauncherPopulationPolicy)


def parse_object(obj: Mapping[str, Any]) -> CustomResource:
    """Any object of our three kinds, chosen by its `kind`; ValueError for another kind."""
    kind = next((kind for kind in KINDS if kind.RESOURCE.kind == obj.get("kind")), None)
    if kind is None:
        raise ValueError(f"kind {obj.get('kind')!r} is none of {', '.join(k.RESOURCE.kind for k in KINDS)}")
    return kind.from_k8s(obj)
