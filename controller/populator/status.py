"""What `kubectl get lcfg` and `kubectl get lpp` show: the status of LauncherConfigs and policies,
computed by the digest worker from the digest and the launcher Pods in the cache (conditions.py).

A LauncherConfig is Ready (`Valid`) when its template makes a launcher Pod, else Stalled (`TemplateError`).
A policy is Ready (`Populated`) when every launcher it asks for exists and is Ready, `Populating` while
some are missing, starting, or stuck (named in the message), Stalled when its spec or a LauncherConfig it
names cannot be used.
"""

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from api import keys
from api.crds import Status
from controller import pods
from controller.conditions import Problem, Readiness, computed, current
from controller.launcher_template import Pod
from controller.populator.key import LauncherKey

VALID = Readiness(True, "Valid")


def config_status(config: Mapping[str, Any], error: str | None, now: datetime) -> Status:
    problems = [Problem("TemplateError", error)] if error else []
    return computed(current(Status, config), _generation(config), problems, VALID, now)


def policy_status(
    policy: Mapping[str, Any],
    problems: list[Problem],
    asks: Mapping[LauncherKey, int],
    launchers: Callable[[LauncherKey], list[Pod]],
    now: datetime,
) -> Status:
    """`asks`: the launchers the policy asks for per key; `launchers`: a key's launcher Pods, as cached."""
    return computed(current(Status, policy), _generation(policy), problems, _populated(asks, launchers), now)


def _populated(asks: Mapping[LauncherKey, int], launchers: Callable[[LauncherKey], list[Pod]]) -> Readiness:
    wanted = ready = 0
    stuck: list[str] = []
    for key, count in sorted(asks.items()):
        live = [pod for pod in launchers(key) if not pods.is_deleting(pod)]
        wanted += count
        ready += min(count, sum(1 for pod in live if pods.is_ready(pod)))
        stuck += sorted(pods.name(pod) for pod in live if pods.labels(pod).get(keys.LAUNCHER_STUCK_LABEL) == "true")
    message = f"{ready} of {wanted} launchers Ready"
    if stuck:
        message += f"; stuck: {', '.join(stuck)}"
    return Readiness(ready >= wanted, "Populated" if ready >= wanted else "Populating", message)


def _generation(obj: Mapping[str, Any]) -> int:
    return int(obj["metadata"].get("generation", 0))
