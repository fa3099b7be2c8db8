"""Sleeping and waking a launcher's instance, whichever API its launcher speaks.

Dualpods' launcher sleeps and wakes its instances itself (E1): its routes, then its SLEEPING or AWAKE event
brings the next pass. A launcher that speaks only FMA's API (its index lacks those routes; see
controller.launcher_views) is gone around, as FMA's controller does: vLLM's own `POST /sleep?level=1` and
`POST /wake_up` on the instance's port (dev-mode endpoints: the instance runs with VLLM_SERVER_DEV_MODE=1).
No event follows, so their 200 is recorded in the launcher's view (`ViewSource.learn`), whose change
brings the next pass just the same. Before a decision that would lose an instance (the unbind deletes one
that is still loading), `as_it_is` asks such an instance itself when the views have not yet seen it serve.
"""

from api.launcher import InstanceState, InstanceStatus
from controller import pods
from controller.dualpods.passes import Pass
from controller.http import HttpError
from controller.instance_probe import instance_port


def _around_launcher(p: Pass, launcher: pods.Pod, state: InstanceState) -> int | None:
    """The instance's port where its launcher does not sleep and wake it; None where it does."""
    view = p.world.views.get(pods.name(launcher))
    if view is None or view.extensions:
        return None
    port = instance_port(state)
    if port is None:  # the bind's tidying deletes such instances, as FMA's controller does
        raise ValueError(f"instance {state.instance_id} has no inference-port annotation: its port is not known")
    return port


def _address(launcher: pods.Pod) -> str:
    ip = pods.pod_ip(launcher)
    assert ip is not None  # a launcher whose instances are known has an address
    return ip


async def sleep(p: Pass, launcher: pods.Pod, state: InstanceState, isc_name: str, requester: str) -> None:
    await _turn(p, launcher, state, isc_name, requester, asleep=True)


async def wake(p: Pass, launcher: pods.Pod, state: InstanceState, isc_name: str, requester: str) -> None:
    await _turn(p, launcher, state, isc_name, requester, asleep=False)


async def _turn(p: Pass, launcher: pods.Pod, state: InstanceState, isc_name: str, requester: str, asleep: bool) -> None:
    port, ip = _around_launcher(p, launcher, state), _address(launcher)
    if port is None:
        through_launcher = p.clients.launchers.sleep if asleep else p.clients.launchers.wake
        await through_launcher(ip, state.instance_id, isc_name, requester)
        return
    await (p.clients.servers.sleep if asleep else p.clients.servers.wake)(ip, port, requester)
    p.world.views.learn(pods.name(launcher), state.instance_id, sleeping=asleep)


async def as_it_is(p: Pass, launcher: pods.Pod, state: InstanceState, requester: str) -> InstanceState:
    """`state`; for a running instance of an FMA launcher not yet seen serving (the views probe it within
    moments of each list), what vLLM's `/is_sleeping` says now, recorded in the view."""
    port = _around_launcher(p, launcher, state)
    if port is None or state.ready or state.status is not InstanceStatus.RUNNING:
        return state
    try:
        sleeping = await p.clients.servers.is_sleeping(_address(launcher), port, requester)
    except HttpError:
        return state  # it does not serve yet: still loading
    name = pods.name(launcher)
    p.world.views.learn(name, state.instance_id, sleeping)
    view = p.world.views.get(name)
    return view.instances.get(state.instance_id, state) if view is not None else state
