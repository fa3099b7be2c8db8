"""What `kubectl get lcfg` and `kubectl get lpp` show: the status of LauncherConfigs and policies,
computed by the digest worker from the digest and the launcher Pods in the cache (conditions.py).

A LauncherConfig is Ready (`Valid`) when its template makes a launcher Pod, else Stalled (`TemplateError`).
A policy is Ready (`Populated`) when every launcher it asks for exists and is Ready, Stalled when its spec
or a LauncherConfig it names cannot be used, else not Ready, with the reason launchers are missing: the API
server refuses them (`QuotaExceeded`, `RefusedByAdmission`, ... of refusals.py, with its message), the
scheduler cannot place them (`Unschedulable`, with its message), or they are on their way (`Populating`;
stuck ones named in the message).
"""

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from api import keys, launcher_summary
from api.crds import LauncherConfigStatus, Status
from api.launcher_summary import LauncherSummary
from controller import pods
from controller.conditions import Fault, Readiness, computed, current
from controller.launcher_template import Pod
from controller.populator.key import LauncherKey
from controller.populator.refusals import Refusal

VALID = Readiness(True, "Valid")


def config_status(
    config: Mapping[str, Any], error: str | None, summaries: Iterable[LauncherSummary | None], now: datetime
) -> LauncherConfigStatus:
    """`summaries`: those its launcher Pods carry (None: a launcher without one); they count its instances."""
    problems = [Fault("TemplateError", error)] if error else []
    serving, sleeping = launcher_summary.counts(summary for summary in summaries if summary is not None)
    shown = current(LauncherConfigStatus, config)
    return computed(shown, _generation(config), problems, VALID, now, serving_instances=serving,
                    sleeping_instances=sleeping)  # fmt: skip


def policy_status(
    policy: Mapping[str, Any],
    problems: list[Fault],
    asks: Mapping[LauncherKey, int],
    launchers: Callable[[LauncherKey], list[Pod]],
    refusals: Mapping[LauncherKey, Refusal],
    now: datetime,
) -> Status:
    """`asks`: the launchers the policy asks for per key; `launchers`: a key's launcher Pods, as cached;
    `refusals`: the keys whose last creates the API server refused."""
    readiness = _populated(asks, launchers, refusals)
    return computed(current(Status, policy), _generation(policy), problems, readiness, now)


def _populated(
    asks: Mapping[LauncherKey, int],
    launchers: Callable[[LauncherKey], list[Pod]],
    refusals: Mapping[LauncherKey, Refusal],
) -> Readiness:
    wanted = ready = 0
    stuck: list[str] = []
    unschedulable: list[str] = []
    refused: list[tuple[LauncherKey, Refusal]] = []
    for key, count in sorted(asks.items()):
        live = [pod for pod in launchers(key) if not pods.is_deleting(pod)]
        wanted += count
        ready += min(count, sum(1 for pod in live if pods.is_ready(pod)))
        stuck += sorted(pods.name(pod) for pod in live if pods.labels(pod).get(keys.LAUNCHER_STUCK_LABEL) == "true")
        unschedulable += sorted(f"{pods.name(pod)} ({why})" for pod in live if (why := pods.unschedulable(pod)))
        if key in refusals and len(live) < count:
            refused.append((key, refusals[key]))
    message = f"{ready} of {wanted} launchers Ready"
    message += "".join(f"; refused on node {key.node} ({key.config}): {r.message}" for key, r in refused)
    if unschedulable:
        message += f"; unschedulable: {', '.join(unschedulable)}"
    if stuck:
        message += f"; stuck: {', '.join(stuck)}"
    if ready >= wanted:
        return Readiness(True, "Populated", message)
    reason = refused[0][1].reason if refused else "Unschedulable" if unschedulable else "Populating"
    return Readiness(False, reason, message)


def _generation(obj: Mapping[str, Any]) -> int:
    return int(obj["metadata"].get("generation", 0))
