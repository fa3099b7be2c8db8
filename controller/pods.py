"""Reading Pods as the API server's JSON: the few facts the controllers need of them."""

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from api import keys

Pod = dict[str, Any]


def meta(pod: Pod) -> dict[str, Any]:
    metadata: dict[str, Any] = pod["metadata"]
    return metadata


def name(pod: Pod) -> str:
    return str(meta(pod)["name"])


def namespace(pod: Pod) -> str:
    return str(meta(pod).get("namespace") or "")


def uid(pod: Pod) -> str:
    return str(meta(pod)["uid"])


def labels(pod: Pod) -> dict[str, str]:
    return meta(pod).get("labels") or {}


def annotations(pod: Pod) -> dict[str, str]:
    return meta(pod).get("annotations") or {}


def finalizers(pod: Pod) -> list[str]:
    return list(meta(pod).get("finalizers") or [])


def is_deleting(pod: Pod) -> bool:
    return bool(meta(pod).get("deletionTimestamp"))


def is_unschedulable(node: Pod | None) -> bool:
    """A Node marked unschedulable (`kubectl cordon`)."""
    return node is not None and bool((node.get("spec") or {}).get("unschedulable"))


def is_cordoned(node: Pod | None) -> bool:
    """A Node cordoned or being deleted: new Pods cannot be placed there, and a drain may follow. (A Node not in the
    cache is not: its Pods go with it.)"""
    return node is not None and (is_deleting(node) or is_unschedulable(node))


def accelerators(pod: Pod) -> list[str] | None:
    """The GPUs a requester's accelerators annotation records (None before the controller asked for them)."""
    known = annotations(pod).get(keys.ACCELERATORS_ANNOTATION)
    return known.split(",") if known else None


def node_name(pod: Pod) -> str | None:
    node: str | None = pod.get("spec", {}).get("nodeName")
    return node


def pod_ip(pod: Pod) -> str | None:
    ip: str | None = pod.get("status", {}).get("podIP")
    return ip


def is_failed(pod: Pod) -> bool:
    return pod.get("status", {}).get("phase") in ("Failed", "Succeeded")


def is_ready(pod: Pod) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def unschedulable(pod: Pod) -> str | None:
    """The scheduler's message while it cannot place the Pod (PodScheduled False, reason Unschedulable)."""
    conditions = pod.get("status", {}).get("conditions") or []
    for condition in conditions:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message") or "unschedulable") if condition.get("status") == "False" else None
    return None


def container_status(pod: Pod, container: str = keys.INFERENCE_SERVER_CONTAINER) -> dict[str, Any]:
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status.get("name") == container:
            found: dict[str, Any] = status
            return found
    return {}


def container_running(pod: Pod) -> bool:
    return "running" in (container_status(pod).get("state") or {})


def container_ready(pod: Pod) -> bool:
    return bool(container_status(pod).get("ready"))


def container_age_s(pod: Pod) -> float | None:
    """Seconds since the container last started; None while it is not running."""
    started = ((container_status(pod).get("state") or {}).get("running") or {}).get("startedAt")
    if not started:
        return None
    return (datetime.now().astimezone() - datetime.fromisoformat(started)).total_seconds()


def restart_count(pod: Pod) -> int:
    return int(container_status(pod).get("restartCount") or 0)


# Container waiting reasons that no wait will fix: the kubelet cannot run the container as it is.
_BROKEN = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                     "CreateContainerError", "RunContainerError"})  # fmt: skip
CRASH_LOOP_RESTARTS = 3  # restarts in a row after which a container in CrashLoopBackOff counts as failing


def container_failing(pod: Pod) -> bool:
    """The container cannot run or keeps crashing (not one restart: a past restart is no failure)."""
    status = container_status(pod)
    reason = ((status.get("state") or {}).get("waiting") or {}).get("reason")
    crash_looping = reason == "CrashLoopBackOff" and restart_count(pod) >= CRASH_LOOP_RESTARTS
    return reason in _BROKEN or crash_looping


def is_lost(pod: Pod, node: dict[str, Any] | None) -> bool:
    """Really gone as a server: its node is gone or going, the Pod failed, or its container is failing.
    A NotReady spell (of the Pod or of its node) or a past restart is not loss."""
    return node is None or is_deleting(node) or is_failed(pod) or container_failing(pod)


def timestamp(value: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 time from the API server."""
    return datetime.fromisoformat(value).timestamp() if value else None


def deletion_time(pod: Pod) -> float | None:
    """When the Pod's deletion is due (its deletionTimestamp: the request plus its grace period)."""
    return timestamp(meta(pod).get("deletionTimestamp"))


def not_ready_since(pod: Pod) -> float | None:
    """When its Ready condition last turned false; None while it is Ready (or never said)."""
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") != "True":
            return timestamp(condition.get("lastTransitionTime"))
    return None


DUAL_PODS_FIELD_MANAGER = "dual-pods-controller"  # FMA's controller name, the field manager of its writes


def last_used(pod: Pod) -> str:
    """When the dual-pods controller last changed the Pod (its managedFields entry, FMA's measure), else its
    creation. RFC 3339 UTC times compare as strings."""
    written = [
        str(entry["time"])
        for entry in meta(pod).get("managedFields") or []
        if entry.get("manager") == DUAL_PODS_FIELD_MANAGER and entry.get("time")
    ]
    return max(written, default=str(meta(pod).get("creationTimestamp") or ""))


def is_requester(pod: Pod) -> bool:
    found = annotations(pod)
    return keys.INFERENCE_SERVER_CONFIG_ANNOTATION in found or keys.SERVER_PATCH_ANNOTATION in found


def is_launcher(pod: Pod) -> bool:
    return keys.LAUNCHER_CONFIG_NAME_LABEL in labels(pod)


def is_direct_provider(pod: Pod) -> bool:
    """A Pod made from a requester's server patch (FMA's direct mode), bound or asleep."""
    return keys.NOMINAL_ANNOTATION in annotations(pod)


@dataclass(frozen=True)
class Binding:
    """The `requester` annotation of a provider: the authoritative record of a binding."""

    requester_uid: str
    requester_name: str


def binding(pod: Pod) -> Binding | None:
    parts = annotations(pod).get(keys.REQUESTER_ANNOTATION, "").split(" ")
    if len(parts) != 2 or not all(parts):
        return None
    return Binding(parts[0], parts[1])


def json_annotation(pod: Pod, key: str) -> Any:
    raw = annotations(pod).get(key)
    return json.loads(raw) if raw else None
