"""The steps that act on the requester itself (or on nothing): report an inconsistency, drop or delete it,
record its GPUs (and bind it in the same pass where it can), settle its metadata, forget a pair that is gone.

The steps of a bound launcher are in serving.py, of a release in release.py, of direct mode in direct.py,
of the bind in binding.py; the phase table (phases.py) names each phase's one step.
"""

from api import keys
from api.launcher import InstanceStatus
from controller import pods
from controller.dualpods import binding
from controller.dualpods.outcomes import DONE, Problem, StepResult, Wait
from controller.dualpods.passes import Pass
from controller.dualpods.snapshot import Mode
from controller.http import HttpError

SPI_STARTUP_RETRY_S = 0.05
SPI_STARTUP_WINDOW_S = 60.0


async def nothing(p: Pass) -> StepResult:
    """Nothing to do: an event (a Pod's IP, a launcher's readiness, an instance's READY) brings the next pass."""
    return DONE


async def forget(p: Pass) -> StepResult:
    """Both Pods are gone: forget what memory holds of them (as FMA drops an inference server's state)."""
    p.memory.forget_gone(lambda: {pods.uid(pod) for pod in p.world.caches.pods.items()})
    p.memory.phases.pop(p.s.name, None)
    return DONE


async def conflicted(p: Pass) -> StepResult:
    return Problem.of(f"requester {p.s.name} is bound to several providers: "
                      f"{', '.join((pods.name(p.provider), *p.s.others))}")  # fmt: skip


async def invalid(p: Pass) -> StepResult:
    return Problem.of(
        f"the annotations {keys.SERVER_PATCH_ANNOTATION} and {keys.INFERENCE_SERVER_CONFIG_ANNOTATION} "
        "exclude each other",
        retry=False,
    )


async def unhold(p: Pass) -> StepResult:
    p.want("no running provider", finalizer=False)
    return DONE


async def cordoned(p: Pass) -> StepResult:
    await p.delete(p.requester, f"node {pods.node_name(p.requester)} is cordoned and no provider is bound")
    return DONE


async def lost(p: Pass) -> StepResult:
    instance = p.s.instance
    if instance is not None and instance.status is InstanceStatus.STOPPED:
        why = f"its instance {p.s.wanted} stopped with exit code {instance.exit_code}"
        if instance.stop_reason is not None:
            why += f" ({instance.stop_reason})"
        await p.lose(why)
    else:
        await p.lose(f"its instance {p.s.wanted} vanished from launcher")
    return DONE


async def settle(p: Pass) -> StepResult:
    """Bring the requester's metadata in line with its binding (and its status with this clean pass)."""
    p.want("binding", settled=True)
    return DONE


async def record_gpus(p: Pass) -> StepResult:
    """Ask the requester for its GPUs once; the annotation keeps them for every later pass (its update
    brings the next one)."""
    requester = p.requester
    try:
        gpus = await p.clients.requesters.gpu_uuids(requester, p.s.isc_name)
    except HttpError as err:
        age = pods.container_age_s(requester)
        if err.reply is None and (age is None or age < SPI_STARTUP_WINDOW_S):
            # Its process is still starting and nothing announces when it listens: look again
            # soon rather than after an exponential back-off that would outlast the start-up.
            return Wait(SPI_STARTUP_RETRY_S, f"the requester does not answer yet ({err})")
        return Problem.of(f"cannot query the requester's GPUs: {err}")
    if not gpus:
        return Problem.of("the assigned set of GPUs is empty")
    p.want("record GPUs", gpus=gpus)
    return DONE


async def record_gpus_and_bind(p: Pass) -> StepResult:
    """NEEDS_GPUS: ask the requester for its GPUs and, where the recorded GPUs make it UNBOUND (launcher mode,
    bindable), bind it in the same pass: its GPUs and its binding go in one requester write."""
    result = await record_gpus(p)
    if p.wants.gpus is None or not p.s.bindable or p.s.mode is not Mode.LAUNCHER:
        return result
    return await binding.bind(p, p.wants.gpus)
