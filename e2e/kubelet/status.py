"""What the kubelet reports in `pods/status`: container states and the Pod's phase and conditions."""

import datetime
from dataclasses import dataclass, field
from typing import Any, Literal

from kubernetes_asyncio import client


def timestamp(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass
class Terminated:
    exit_code: int
    reason: str
    started_at: datetime.datetime | None
    finished_at: datetime.datetime
    container_id: str | None

    def to_api(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "finishedAt": timestamp(self.finished_at),
        }
        if self.started_at is not None:
            state["startedAt"] = timestamp(self.started_at)
        if self.container_id is not None:
            state["containerID"] = self.container_id
        return state


@dataclass
class ContainerStatus:
    """One container as the kubelet sees it; `to_api` gives the `containerStatuses` entry."""

    name: str
    image: str
    state: Literal["waiting", "running", "terminated"] = "waiting"
    reason: str = "ContainerCreating"
    message: str | None = None
    started_at: datetime.datetime | None = None
    terminated: Terminated | None = None
    last_terminated: Terminated | None = None
    container_id: str | None = None
    ready: bool = False
    started: bool = False
    restart_count: int = 0

    def to_api(self) -> dict[str, Any]:
        if self.state == "running":
            state: dict[str, Any] = {"running": {"startedAt": timestamp(self.started_at or now())}}
        elif self.state == "terminated" and self.terminated is not None:
            state = {"terminated": self.terminated.to_api()}
        else:
            state = {"waiting": {"reason": self.reason} | ({"message": self.message} if self.message else {})}
        status: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": f"loopback://{self.image}",
            "state": state,
            "lastState": {"terminated": self.last_terminated.to_api()} if self.last_terminated else {},
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
        }
        if self.container_id is not None:
            status["containerID"] = self.container_id
        return status


@dataclass
class PodState:
    """Everything the Pod's status is computed from."""

    pod_ip: str | None = None
    host_ip: str | None = None
    start_time: datetime.datetime | None = None
    init: list[ContainerStatus] = field(default_factory=list)
    containers: list[ContainerStatus] = field(default_factory=list)
    sandbox_ready: bool = False  # address and volumes in place: containers can start (PodReadyToStartContainers)
    initialized: bool = False
    failed_reason: str | None = None  # admission or init failure: the Pod is Failed
    failed_message: str | None = None
    released: bool = False  # containers stopped for good and resources returned
    transitions: dict[str, tuple[str, datetime.datetime]] = field(default_factory=dict)


def phase(state: PodState) -> str:
    if state.failed_reason is not None:
        return "Failed"
    if not state.initialized:
        return "Pending"
    if state.released and all(c.state == "terminated" for c in state.containers):
        codes = [c.terminated.exit_code if c.terminated else 1 for c in state.containers]
        return "Succeeded" if all(code == 0 for code in codes) else "Failed"
    if any(c.state == "running" or c.restart_count > 0 or c.terminated for c in state.containers):
        return "Running"
    return "Pending"


def _condition(state: PodState, generation: int | None, kind: str, ok: bool, reason: str) -> dict[str, Any]:
    value = "True" if ok else "False"
    previous = state.transitions.get(kind)
    if previous is None or previous[0] != value:
        state.transitions[kind] = (value, now())
    # An explicit null removes a stale reason: the patch merges conditions by type.
    return {
        "type": kind,
        "status": value,
        "observedGeneration": generation,
        "lastTransitionTime": timestamp(state.transitions[kind][1]),
        "reason": None if ok else reason,
    }


def pod_status(pod: client.V1Pod, state: PodState) -> dict[str, Any]:
    """The `pods/status` strategic-merge patch, as a 1.35 kubelet writes it (PodReadyToStartContainers, the
    observed generation); conditions owned by others (PodScheduled, gates) are kept."""
    containers_ready = state.initialized and all(c.ready for c in state.containers)
    gates = [g.condition_type for g in pod.spec.readiness_gates or []]
    others = {c.type: c.status for c in (pod.status.conditions if pod.status else None) or []}
    gates_ok = all(others.get(g) == "True" for g in gates)
    generation = pod.metadata.generation
    conditions = [
        _condition(state, generation, "PodReadyToStartContainers", state.sandbox_ready, "SandboxNotReady"),
        _condition(state, generation, "Initialized", state.initialized, "ContainersNotInitialized"),
        _condition(state, generation, "ContainersReady", containers_ready, "ContainersNotReady"),
        _condition(
            state,
            generation,
            "Ready",
            containers_ready and gates_ok,
            "ContainersNotReady" if not containers_ready else "ReadinessGatesNotReady",
        ),
    ]
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "phase": phase(state),
        "conditions": conditions,
        "containerStatuses": [c.to_api() for c in state.containers],
    }
    if state.init:
        status["initContainerStatuses"] = [c.to_api() for c in state.init]
    if state.failed_reason is not None:
        status["reason"] = state.failed_reason
        status["message"] = state.failed_message
    if state.host_ip is not None:
        status["hostIP"] = state.host_ip
    if state.pod_ip is not None:
        status["podIP"] = state.pod_ip
        status["podIPs"] = [{"ip": state.pod_ip}]
    if state.start_time is not None:
        status["startTime"] = timestamp(state.start_time)
    return {"metadata": {"uid": pod.metadata.uid}, "status": status}
