"""Sleeping copies of a model that the controller makes on its own, with no requester: a drain's copies of the
sleepers of a launcher that must go (drain_plan.py), and a warm pool's copies (pools/plan.py).

A copy is made in two steps, each one launcher call and each idempotent: create the instance (its ID is the
model's on those GPUs, so a second create finds it there), then, once it is ready, put it to sleep. Both plans
say which; `carry_out` makes the calls. Where a copy may go is the same for both: a launcher with room for one
more instance (`maxInstances`, a free port, the host sleeper budget without deleting another sleeper).
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from api.crds import LauncherConfig
from api.launcher import ErrorReason, InstanceState, InstanceStatus, VllmConfig
from controller import pods
from controller.dualpods.collaborators import Clients
from controller.dualpods.memory_budget import host_victims
from controller.dualpods.sleepers import sleepers
from controller.dualpods.snapshot import Caches
from controller.http import HttpError
from controller.instance_probe import instance_port
from controller.launcher_client import error_reason
from controller.launcher_views import ViewSource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LauncherFacts:
    """One launcher as the plans see it. `gpus`: the UUIDs known on its Node (gpu-map, instances, requesters)."""

    name: str
    node: str
    config_name: str
    config: LauncherConfig | None
    instances: Sequence[InstanceState]
    bound_instance: str | None  # the instance serving its requester, if bound
    gpus: Sequence[str] = ()
    available: bool = True  # reachable, synced, Ready, on a schedulable Node


@dataclass(frozen=True)
class Create:
    target: str
    instance_id: str
    config: VllmConfig
    isc: str


@dataclass(frozen=True)
class Sleep:
    target: str
    instance: InstanceState
    isc: str


def no_room(target: LauncherFacts, held: Sequence[InstanceState], port: int, incoming_bytes: int) -> str | None:
    """Why `target`, holding `held`, cannot take one more instance on `port` that will hold `incoming_bytes` asleep
    (None: it can). `target.config` must be known."""
    assert target.config is not None
    spec = target.config.spec
    budget = spec.sleeper_budget.host_memory_bytes
    if len(held) >= spec.max_instances:
        return f"{target.name} holds maxInstances ({spec.max_instances})"
    if any(instance_port(s) == port for s in held):
        return f"{target.name} has an instance on port {port}"
    if budget is not None and host_victims(sleepers(list(held), exclude=""), incoming_bytes, int(budget)) != []:
        return f"{target.name}'s host sleeper budget cannot take {incoming_bytes} bytes more"
    return None


def as_created(created: str, config: VllmConfig) -> InstanceState:
    """A copy a plan creates, as the launcher will report it, so that the plan's next copy counts it."""
    return InstanceState(
        status=InstanceStatus.RUNNING, instance_id=created, revision=0, options=config.options,
        gpu_uuids=config.gpu_uuids, annotations=config.annotations,
    )  # fmt: skip


class NoAddress(Exception):
    """A launcher a plan names has lost its address (gone, or restarting) since the plan was made."""


# What carrying out a plan may meet: a launcher that does not answer, or has no address any more; the pass that
# planned backs off (and plans afresh).
CARRY_OUT_FAILURES = (HttpError, NoAddress)


def launcher_ip(caches: Caches, namespace: str, launcher: str) -> str:
    """The address of a launcher a plan names (it had one when the plan was made)."""
    pod = caches.pods.get(f"{namespace}/{launcher}")
    ip = pods.pod_ip(pod) if pod is not None else None
    if ip is None:
        raise NoAddress(f"launcher {launcher} has no address")
    return ip


async def carry_out(
    clients: Clients,
    ip_of: Callable[[str], str],
    views: ViewSource,
    creates: Sequence[Create],
    sleeps: Sequence[Sleep],
    why: str,
) -> None:
    """The launcher calls of a plan; `why` starts each log line (`drain of launcher-x`, `pool of isc-y`). A copy
    created is in its launcher's view at once, so that the next plan (of this loop or another) counts it."""
    for create in creates:
        log.info("%s: creating %s (%s) on launcher %s", why, create.instance_id, create.isc, create.target)
        try:
            created = await clients.launchers.create_instance(ip_of(create.target), create.instance_id,
                                                              create.config, create.isc, "")  # fmt: skip
        except HttpError as err:
            if error_reason(err) is not ErrorReason.ALREADY_EXISTS:
                raise
            continue
        if (view := views.get(create.target)) is not None:
            view.created(created)
    for sleep in sleeps:
        log.info("%s: putting %s to sleep on launcher %s", why, sleep.instance.instance_id, sleep.target)
        await clients.launchers.sleep(ip_of(sleep.target), sleep.instance.instance_id, sleep.isc, "")
