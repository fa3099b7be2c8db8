"""Bodies of the launcher REST API (FMA 0.6's `/v2/vllm/instances`, plus dualpods' E1 fields).

Fields that FMA omits when null are declared optional; serialize with `exclude_none=True`.
"""

from enum import StrEnum
from typing import Final, Literal

from pydantic import BaseModel, Field

API_VERSION: Final = "2.0"
INSTANCES_PATH: Final = "/v2/vllm/instances"
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
    INTERNAL = "Internal"  # 500


class ErrorBody(BaseModel):
    """Every error answer of the launcher (but a 416, which has no body, as in FMA)."""

    detail: str  # FMA's field: what is wrong, for people
    reason: ErrorReason  # for programs


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
    name: str
    version: str = API_VERSION
    endpoints: dict[str, str]
