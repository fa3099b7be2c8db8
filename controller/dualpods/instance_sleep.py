"""Sleeping and waking a launcher's instance, whichever API its launcher speaks.

Dualpods' launcher sleeps and wakes its instances itself (E1): its routes, then its SLEEPING or AWAKE event
brings the next pass. A launcher that speaks only FMA's API (its index lacks those routes; see
controller.launcher_views) is gone around, as FMA's controller does: vLLM's own `POST /sleep?level=1` and
`POST /wake_up` on the instance's port (dev-mode endpoints: the instance runs with VLLM_SERVER_DEV_MODE=1).
No event follows, so their 200 is recorded in the launcher's view (`ViewSource.learn`), whose change
brings the next pass just the same.
"""

from api.launcher import InstanceState
from controller import pods
from controller.dualpods.passes import Pass
from controller.dualpods.selection import instance_port


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
    port = _around_launcher(p, launcher, state)
    if port is None:
        await p.clients.launchers.sleep(_address(launcher), state.instance_id, isc_name, requester)
        return
    await p.clients.servers.sleep(_address(launcher), port, requester)
    p.world.views.learn(pods.name(launcher), state.instance_id, sleeping=True)


async def wake(p: Pass, launcher: pods.Pod, state: InstanceState, isc_name: str, requester: str) -> None:
    port = _around_launcher(p, launcher, state)
    if port is None:
        await p.clients.launchers.wake(_address(launcher), state.instance_id, isc_name, requester)
        return
    await p.clients.servers.wake(_address(launcher), port, requester)
    p.world.views.learn(pods.name(launcher), state.instance_id, sleeping=False)
