"""Bodies of the launcher REST API (FMA 0.6's `/v2/vllm/instances`, plus dualpods' E1 fields).

Fields that FMA omits when null are declared optional; serialize with `exclude_none=True`. What FMA's
own launcher shows of them (its state keys and event types) is named here too, for the launcher's
FMA-only mode and for clients that must work with either launcher.
"""

from enum import StrEnum
from typing import Any, Final, Literal

from pydantic import BaseModel, Field

API_VERSION: Final = "2.0"
# FMA's FastAPI title, which its index also carries as `name`.
API_TITLE: Final = "Multi-Instance vLLM Management API"
INSTANCES_PATH: Final = "/v2/vllm/instances"
# The most an un-ranged or open-ended log read returns (FMA's MAX_LOG_RESPONSE_BYTES).
LOG_PAGE_BYTES: Final = 1024 * 1024
# A watch stream that has nothing to report sends an empty line this often (NDJSON readers, FMA's
# included, skip it), so a client can tell a quiet stream from a dead one: one silent for
# WATCH_SILENCE_TIMEOUT_S is taken as lost, and the client lists again.
WATCH_HEARTBEAT_S: Final = 5.0
WATCH_SILENCE_TIMEOUT_S: Final = 20.0

# The longest line the watch stream sends, its newline included: what any NDJSON reader must accept (64 KiB
# is also the default limit of Go's bufio.Scanner). The launcher refuses at create time any instance whose
# events could be longer, with these bounds on what a create carries, each measured as the field's compact
# JSON encoding, as it appears in the events; with the launcher's own fields they sum to less.
MAX_EVENT_BYTES: Final = 64 * 1024
MAX_OPTIONS_BYTES: Final = 16 * 1024
# `effective_options`: the options as the launcher quotes them (shlex), plus the flags it adds.
MAX_EFFECTIVE_OPTIONS_BYTES: Final = 20 * 1024
MAX_ENV_VARS_BYTES: Final = 12 * 1024  # CUDA_VISIBLE_DEVICES as the launcher sets it included
MAX_ANNOTATIONS_BYTES: Final = 8 * 1024
MAX_GPU_UUIDS_BYTES: Final = 2 * 1024


class ErrorReason(StrEnum):
    """Machine-readable cause of a launcher error, in the `reason` field beside FMA's `detail`.

    Clients switch on it instead of searching the message."""

    ALREADY_EXISTS = "AlreadyExists"  # 409: an instance with this ID exists
    PORT_IN_USE = "PortInUse"  # 409: another instance, or another process on this host, holds the port
    NOT_FOUND = "NotFound"  # 404: no such instance (or route)
    UNKNOWN_GPU = "UnknownGPU"  # 400: a gpu_uuids entry this node does not have
    INVALID_OPTIONS = "InvalidOptions"  # 400: the model-server options are refused before the fork
    INVALID_BODY = "InvalidBody"  # 400/413/422: the body, a header or a query parameter is malformed
    NOT_RUNNING = "NotRunning"  # 409: sleep or wake of a stopped instance
    NOT_READY = "NotReady"  # 409: sleep or wake of an instance still starting; retry once it is ready
    REVISION_GONE = "RevisionGone"  # 410: `since` is outside the launcher's event history (or ahead of it)
    UNAUTHORIZED = "Unauthorized"  # 401
    METHOD_NOT_ALLOWED = "MethodNotAllowed"  # 405
    BACKEND_FAILED = "BackendFailed"  # 502: the instance's own server failed a forwarded call, or died in it
    BACKEND_TIMEOUT = "BackendTimeout"  # 504: the instance did not answer a forwarded call in time
    WAKE_CHECK_FAILED = "WakeCheckFailed"  # 502: woken, the instance failed its probe; it was killed
    INTERNAL = "Internal"  # 500


class ValidationIssue(BaseModel):
    """One problem of a request that failed validation, in FastAPI's form (FMA's launcher is FastAPI):
    `loc` starts with where it is (`body`, `query`, `header`), then the field, or the offset of a JSON
    syntax error; `type` and `msg` are pydantic's."""

    type: str
    loc: list[str | int]
    msg: str
    input: Any = None
    ctx: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    """Every error answer of the launcher. `detail` is FMA's field: a message, or for a 422 FastAPI's list of
    validation issues; `reason` (omitted by the FMA-only mode) is for programs."""

    detail: str | list[ValidationIssue]
    reason: ErrorReason | None = None


class StopReason(StrEnum):
    """Why an instance stopped without being asked to (the STOPPED event and the state carry it)."""

    EXITED = "Exited"  # its server process exited by itself (its engine processes alive until then)
    ENGINE_DIED = "EngineDied"  # a process of its tree that it needs (vLLM's engine core) died; all was killed
    UNRESPONSIVE = "Unresponsive"  # its /health failed or timed out too many times in a row; it was killed
    WAKE_CHECK_FAILED = "WakeCheckFailed"  # after a wake it no longer answered its recorded probe; killed


class VllmConfig(BaseModel):
    """What to run: the server's command-line options, GPUs, environment and free-form notes."""

    # Unknown fields are ignored, as FMA's launcher does, so newer clients keep working.
    options: str = Field(description="model-server command-line options, split with shell rules")
    gpu_uuids: list[str] | None = None
    env_vars: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    # dualpods extensions: the model-server runtime (E4; default vllm) and the GPU memory to leave
    # for the sleeping instances the LauncherConfig allows (E6; used to size vLLM's share).
    runtime: str | None = None
    gpu_sleeper_reserve_bytes: int | None = Field(default=None, ge=0)
    # Whether each wake is checked against a greedy probe recorded at first ready (default: yes).
    verify_wakes: bool | None = None


class InstanceStatus(StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"


class WakeCheckStatus(StrEnum):
    OFF = "off"  # verify_wakes is false (or the launcher is FMA-only, or runs with --no-verify-wakes)
    PENDING = "pending"  # to be recorded at the instance's first ready
    RECORDED = "recorded"  # every wake is checked against the probe
    UNAVAILABLE = "unavailable"  # the probe could not be recorded (`detail` says why): wakes go unchecked


class WakeProbe(BaseModel):
    """A short greedy completion of the instance, as recorded at its first ready: the prompt's token IDs, the
    token IDs it generated, and their log-probabilities where the runtime gives them."""

    prompt_token_ids: list[int] | None = None  # None where the runtime does not report them (the text is sent)
    token_ids: list[int]
    logprobs: list[float] | None = None


class WakeCheck(BaseModel):
    """The post-wake check of one instance (`InstanceState.wake_check`)."""

    status: WakeCheckStatus
    probe: WakeProbe | None = None
    passed: int = 0  # wakes checked and passed
    last_seconds: float | None = None  # what the last check took
    detail: str | None = None  # why the probe is unavailable, or why the last check failed


class ProcessStats(BaseModel):
    """Resource use of an instance's whole process tree (psutil), in the detailed state only."""

    pid: int
    processes: int
    rss_bytes: int
    cpu_percent: float
    gpu_memory_bytes: int | None = None  # None where NVML is not available


class InstanceState(BaseModel):
    """One instance as the launcher reports it. `revision` is the revision of its last event."""

    status: InstanceStatus
    instance_id: str
    revision: int
    options: str
    gpu_uuids: list[str] | None = None
    env_vars: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    # dualpods extensions (E1, E4, E6): readiness, sleep state, runtime, effective command line, exit code.
    runtime: str | None = None
    ready: bool = False
    sleeping: bool = False
    sleep_level: int | None = None
    effective_options: str | None = None
    defaults_applied: dict[str, str] | None = None
    port: int | None = None
    exit_code: int | None = None
    stop_reason: StopReason | None = None
    wake_check: WakeCheck | None = None
    process: ProcessStats | None = None


class AllInstancesState(BaseModel):
    revision: int
    # dualpods extension (launcher epochs): a fresh ID per launcher process. Revisions restart with the
    # process, so a client that sees a new boot ID must list again. None from a launcher that has none.
    boot_id: str | None = None
    total_instances: int
    running_instances: int
    instances: list[InstanceState]


class InstanceIds(BaseModel):
    revision: int
    boot_id: str | None = None
    instance_ids: list[str]
    count: int


class DeleteAllResult(BaseModel):
    status: Literal["all_stopped"] = "all_stopped"
    stopped_instances: list[InstanceState]
    total_stopped: int


class EventType(StrEnum):
    CREATED = "CREATED"
    READY = "READY"
    SLEEPING = "SLEEPING"
    AWAKE = "AWAKE"
    STOPPED = "STOPPED"
    DELETED = "DELETED"


# What FMA 0.6.4's launcher shows: the keys of its instance state (the null ones omitted; a STOPPED event's
# object adds `exit_code`) and its event types. The rest of InstanceState and EventType are dualpods'.
FMA_STATE_KEYS: Final = frozenset({"status", "instance_id", "revision", "options", "gpu_uuids", "env_vars",
                                   "annotations"})  # fmt: skip
FMA_EVENT_TYPES: Final = frozenset({EventType.CREATED, EventType.STOPPED, EventType.DELETED})


class WatchEvent(BaseModel):
    """One line of the NDJSON watch stream; STOPPED events also carry the exit code, and every event the
    launcher's boot ID."""

    type: EventType
    object: InstanceState
    exit_code: int | None = None
    boot_id: str | None = None


class Health(BaseModel):
    status: Literal["OK"] = "OK"


class Index(BaseModel):
    """`GET /`: FMA's name and version, and each route by name as `"METHOD /path"` (FMA's ten, then
    dualpods' own), so a client can tell which routes a launcher serves."""

    name: str = API_TITLE
    version: str = API_VERSION
    endpoints: dict[str, str]


class ListQuery(BaseModel):
    detail: bool = Field(
        default=True, description="full states (default), or only the IDs; pydantic's boolean spellings"
    )


class WatchQuery(BaseModel):
    since: int | None = Field(
        default=None,
        description="resume after this revision; without it the stream starts with a CREATED event per instance",
    )


class SleepQuery(BaseModel):
    level: int = Field(default=1, ge=1, le=2, description="1 offloads the weights to host memory, 2 discards them")


class LogHeaders(BaseModel):
    Range: str | None = Field(
        default=None,
        pattern=r"^bytes=(\d+)-(\d+)?$",
        description="`bytes=START-END` (inclusive) or `bytes=START-` (at most 1 MiB); without it, 200 with the "
        "first 1 MiB",
    )
