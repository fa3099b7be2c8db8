"""Bodies of the launcher REST API (FMA 0.6's `/v2/vllm/instances`, plus dualpods' E1 fields).

Fields that FMA omits when null are declared optional; serialize with `exclude_none=True`.
"""

from enum import StrEnum
from typing import Final, Literal

from pydantic import BaseModel, Field

API_VERSION: Final = "2.0"
INSTANCES_PATH: Final = "/v2/vllm/instances"


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
    process: ProcessStats | None = None


class AllInstancesState(BaseModel):
    revision: int
    total_instances: int
    running_instances: int
    instances: list[InstanceState]


class InstanceIds(BaseModel):
    revision: int
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
    """One line of the NDJSON watch stream; STOPPED events also carry the exit code."""

    type: EventType
    object: InstanceState
    exit_code: int | None = None


class Health(BaseModel):
    status: Literal["OK"] = "OK"


class Index(BaseModel):
    name: str
    version: str = API_VERSION
    endpoints: dict[str, str]
