"""What a launcher holds, in a small annotation on its Pod: the answer to "what is hot where" without a
call to any launcher.

The dual-pods controller keeps `dual-pods.llm-d.ai/instances` on every launcher Pod in line with the
launcher's instances (controller/dualpods/launcher_summaries.py); `kubectl dualpods status` reads it
(controller/kubectl_plugin.py). It is bounded, so a launcher with many instances cannot grow its Pod past
what the API server accepts: at most MAX_INSTANCES entries, the busiest first (serving, loading, asleep,
stopped; within a state the most recent change first), and a count of the ones left out.

`since` is when the instance entered its state as the controller saw it: it is carried over from the
annotation as long as the state holds, so a restarted controller keeps it.
"""

import shlex
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api import keys
from api.launcher import InstanceState, InstanceStatus

ANNOTATION = keys.PREFIX + "instances"
MAX_INSTANCES = 16


class SummaryState(StrEnum):
    SERVING = "serving"  # awake and ready
    LOADING = "loading"  # started, not ready yet
    ASLEEP = "asleep"
    STOPPED = "stopped"  # its process ended; the launcher keeps its record until it is deleted


_ORDER = {state: rank for rank, state in enumerate(SummaryState)}


class InstanceSummary(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    id: str
    model: str  # the served model name, else the model path
    isc: str | None = None  # the InferenceServerConfig it was made from, where the controller made it
    state: SummaryState
    gpus: list[str] = Field(default_factory=list)
    host_bytes: int | None = Field(default=None, alias="hostBytes")  # its processes' resident memory
    gpu_bytes: int | None = Field(default=None, alias="gpuBytes")  # where the launcher reads NVML
    since: datetime


class LauncherSummary(BaseModel):
    model_config = ConfigDict(extra="ignore")

    instances: list[InstanceSummary] = Field(default_factory=list)
    omitted: int = 0  # instances beyond MAX_INSTANCES, left out

    def annotation(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)


def parse(annotation: str | None) -> LauncherSummary | None:
    """The summary an annotation holds; None when absent or not a summary (an older or edited one)."""
    if not annotation:
        return None
    try:
        return LauncherSummary.model_validate_json(annotation)
    except ValidationError:
        return None


def counts(summaries: Iterable[LauncherSummary], isc: str | None = None) -> tuple[int, int]:
    """How many instances (of `isc`, or all) serve and how many sleep in `summaries`."""
    states = [e.state for summary in summaries for e in summary.instances if isc is None or e.isc == isc]
    return states.count(SummaryState.SERVING), states.count(SummaryState.ASLEEP)


def annotation_on(pod: Mapping[str, Any] | None) -> str | None:
    """The summary annotation's text on a Pod (None: no Pod, or no summary)."""
    text = (((pod or {}).get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    return str(text) if text is not None else None


def of_pod(pod: Mapping[str, Any]) -> LauncherSummary | None:
    """The summary a launcher Pod carries, if any."""
    return parse(annotation_on(pod))


class ParsedSummaries:
    """Each launcher Pod's summary parsed once per text it carries. A status recount reads every launcher's
    summary (the populator's LauncherConfig counts, once a second while a wave rewrites them): validating them
    all each time took most of the populator's CPU with 5,000 launchers. The parsed summaries are shared, so
    nobody may change them. Keyed by Pod name; `forget` a Pod that goes."""

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[str | None, LauncherSummary | None]] = {}

    def of_pod(self, pod: Mapping[str, Any]) -> LauncherSummary | None:
        text = annotation_on(pod)
        name = str(pod["metadata"]["name"])
        cached = self._by_name.get(name)
        if cached is not None and cached[0] == text:
            return cached[1]
        summary = parse(text)
        self._by_name[name] = (text, summary)
        return summary

    def forget(self, name: str) -> None:
        self._by_name.pop(name, None)


def model_name(options: str) -> str:
    """The name clients ask for: `--served-model-name` (its first value), else `--model`, else "?"."""
    try:
        words = shlex.split(options)
    except ValueError:
        words = options.split()
    found: dict[str, str] = {}
    for index, word in enumerate(words):
        flag, equals, value = word.partition("=")
        if flag in ("--served-model-name", "--model") and flag not in found:
            if equals:
                found[flag] = value
            elif index + 1 < len(words):
                found[flag] = words[index + 1]
    return found.get("--served-model-name") or found.get("--model") or "?"


def state_of(instance: InstanceState) -> SummaryState:
    if instance.status is InstanceStatus.STOPPED:
        return SummaryState.STOPPED
    if not instance.ready:
        return SummaryState.LOADING
    return SummaryState.ASLEEP if instance.sleeping else SummaryState.SERVING


def summarize(instances: Iterable[InstanceState], previous: LauncherSummary | None, now: datetime) -> LauncherSummary:
    """The summary of `instances`, keeping each unchanged state's `since` from `previous`."""
    before = {entry.id: entry for entry in (previous.instances if previous else [])}
    entries = []
    for instance in instances:
        state = state_of(instance)
        earlier = before.get(instance.instance_id)
        held = earlier if earlier is not None and earlier.state is state else None
        process = instance.process  # in a launcher's lists, not in its events: keep the last one seen
        entries.append(
            InstanceSummary(
                id=instance.instance_id,
                model=model_name(instance.options),
                isc=(instance.annotations or {}).get(keys.INSTANCE_ISC_NAME),
                state=state,
                gpus=list(instance.gpu_uuids or []),
                host_bytes=process.rss_bytes if process else held and held.host_bytes,
                gpu_bytes=process.gpu_memory_bytes if process else held and held.gpu_bytes,
                since=held.since if held is not None else now,
            )
        )
    entries.sort(key=lambda entry: (_ORDER[entry.state], -entry.since.timestamp(), entry.id))
    return LauncherSummary(instances=entries[:MAX_INSTANCES], omitted=max(0, len(entries) - MAX_INSTANCES))
