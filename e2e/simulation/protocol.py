"""What the loopback kubelet and a simulation process say to each other (JSON over HTTP on 127.0.0.1).

    POST /containers                 ContainerSpec -> 201 Started (exit_code set: it failed at once)
    POST /containers/{id}/stop?grace=S -> Stopped (graceful within S seconds, else cut off: 137)
    POST /containers/{id}/kill       -> Stopped (at once)
    GET  /report[?changed_since=T]   -> Report: what the simulated containers hold now (with T, epoch seconds,
                                        only the requesters whose readiness changed at T or later)

The kubelet resolves everything a container needs (its environment, its volumes as host directories),
exactly as for a process; the simulation process only runs it. Its URL is in the file the kubelet names.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict

from api.launcher import EventType, InstanceState

Role = Literal["requester", "launcher"]
# What a runtime reports for a container killed by SIGKILL (128 + 9).
KILLED = 137


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Mount(_Body):
    """A volume as the container sees it: `target` in the container is `source` on the host."""

    source: str
    target: str
    read_only: bool = False


class ContainerSpec(_Body):
    """One run of one container (a restart is a new run with a new `id`)."""

    id: str
    role: Role
    namespace: str
    pod: str
    uid: str
    container: str
    pod_ip: str
    # The Pod's `command`, expanded (None: the image's entrypoint); the simulation runs the program it names.
    command: list[str] | None = None
    args: list[str]  # after the command (the Pod's `args`; else, without a `command`, the image's `cmd`)
    env: dict[str, str]  # the image's and the Pod's, resolved
    mounts: list[Mount]
    log: str  # host path of this run's log file


class Started(_Body):
    exit_code: int | None = None  # None: running; else it exited at once (the log says why)


class Stopped(_Body):
    exit_code: int


class RequesterReport(_Body):
    """One simulated requester: its readiness as the controller set it over the SPI."""

    namespace: str
    pod: str
    uid: str
    ready: bool
    # (epoch seconds, ready) at each change, in order: when the controller told it ready or unready.
    transitions: list[tuple[float, bool]]


class LedgerEntry(_Body):
    """One event of a simulated launcher's instances, with what the launcher held right after it."""

    at: float  # epoch seconds
    instance: str
    event: EventType
    pool: bool  # the instance is a warm pool's copy (its INSTANCE_POOL annotation)
    running: int  # the launcher's running instances, awake or asleep
    sleeping: int
    sleeping_bytes: int  # what its sleepers hold in host memory (the simulation's SIMULATED_RSS_BYTES each)


class LauncherReport(_Body):
    namespace: str
    pod: str
    uid: str
    instances: list[InstanceState]
    ledger: list[LedgerEntry] = []


class Report(_Body):
    role: Role
    requesters: list[RequesterReport] = []
    launchers: list[LauncherReport] = []
