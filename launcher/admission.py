"""Whether a create is admitted, and what it starts: a plan over the request, the instances the launcher
holds and what the manager measured of the GPUs, with no I/O of its own.

A create is `read` (its ID, sizes, runtime and options, with the runtime's parser), then the manager
gathers the GPU facts the request needs (`GpuFacts`: the indices of its GPU UUIDs, their free memory where
the runtime's defaults need it), then `plan` decides, and the manager asks the OS whether the port is free
right after, with no await from `plan` to the insert, so two creates cannot race past the checks. The
checks run in a fixed order: that order is which error a client sees for a request with several faults.
"""

import re
import shlex
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from api.launcher import ErrorReason, VllmConfig

from . import validation
from .engine_defaults import EngineDefaults, GpuMemory, Machine
from .errors import BadRequest, Conflict, InvalidOptions
from .instance import DEFAULT_RUNTIME
from .runtimes import ParsedOptions, Runtime

INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class LauncherFacts:
    """What of the launcher itself a create must fit."""

    host: str  # the address every instance binds
    port: int  # the launcher's own API port, which no instance may take
    cpu_kv_cache_bytes: int  # an instance's KV cache on a CPU when its options do not size it


@dataclass(frozen=True)
class Held:
    """The instances the launcher holds, which a create must not clash with."""

    ids: Collection[str]
    ports: Mapping[int, str]  # each running instance's port → its ID


@dataclass(frozen=True)
class Request:
    """A create's body as its runtime reads it."""

    instance_id: str
    config: VllmConfig
    runtime: Runtime
    argv: list[str]  # the user's options, split
    parsed: ParsedOptions
    port: int


@dataclass(frozen=True)
class GpuFacts:
    """What the manager measured for a request."""

    indices: list[int] | None = None  # of its GPU UUIDs; None where it names none
    memory: list[GpuMemory] | None = None  # free and total, where its runtime's defaults need them


@dataclass(frozen=True)
class Admission:
    """A create that passed every check: what to start, and how."""

    instance_id: str
    config: VllmConfig  # with the GPUs' CUDA_VISIBLE_DEVICES echoed in `env_vars`
    runtime: Runtime
    parsed: ParsedOptions
    argv: list[str]  # the effective options: the user's, the defaults added, the launcher's --host
    defaults: EngineDefaults
    port: int
    env: dict[str, str]  # the instance's environment (the user's, and CUDA_VISIBLE_DEVICES)


def runtime_named(runtimes: Mapping[str, Runtime], name: str | None) -> Runtime:
    runtime = runtimes.get(name or DEFAULT_RUNTIME)
    if runtime is None:
        raise BadRequest(f"unknown runtime {name!r}; this launcher runs: {', '.join(sorted(runtimes))}")
    return runtime


def _check_id_free(instance_id: str, held: Held) -> None:
    if instance_id in held.ids:
        raise Conflict(f"Instance {instance_id} already exists", ErrorReason.ALREADY_EXISTS)


def read(
    config: VllmConfig,
    instance_id: str,
    runtimes: Mapping[str, Runtime],
    launcher: LauncherFacts,
    held: Held,
) -> Request:
    """The request, or the error of its first fault that needs no measurement (the runtime's parser may
    look at a local model path)."""
    if not INSTANCE_ID.match(instance_id):
        raise BadRequest(
            f"invalid instance ID {instance_id!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    _check_id_free(instance_id, held)
    validation.check_body_sizes(config)
    runtime = runtime_named(runtimes, config.runtime)
    try:
        argv = shlex.split(config.options)
    except ValueError as err:
        raise InvalidOptions(f"invalid options: cannot split {config.options!r}: {err}") from None
    parsed = runtime.parse(argv)
    if "host" in parsed.explicit and parsed.values.host != launcher.host:
        raise InvalidOptions(
            f"invalid options: --host {parsed.values.host} is not this launcher's address {launcher.host}; "
            "leave --host out and the launcher sets it"
        )
    port = int(parsed.values.port)
    validation.check_port(port, launcher.port)
    return Request(instance_id, config, runtime, argv, parsed, port)


def environment(request: Request, indices: list[int] | None) -> dict[str, str]:
    """The instance's environment: the user's, and the GPUs it asked for as CUDA_VISIBLE_DEVICES (where it
    names none, as FMA: an empty list leaves every GPU visible)."""
    env = dict(request.config.env_vars or {})
    if indices is not None:
        env[VISIBLE_DEVICES] = ",".join(str(i) for i in indices)
    return env


def plan(request: Request, facts: GpuFacts, launcher: LauncherFacts, held: Held) -> Admission:
    """What to start for `request`, or the error of its first fault. Pure."""
    env = environment(request, facts.indices)
    config = request.config
    if facts.indices is not None:
        # Echoed in the state, as FMA does, so clients see the devices the instance got.
        config = config.model_copy(update={"env_vars": env})
    validation.check_environment(env)
    machine = Machine(
        on_cpu=request.runtime.on_cpu,
        gpus=facts.memory,
        cpu_kv_cache_bytes=launcher.cpu_kv_cache_bytes,
        sleeper_reserve_bytes=config.gpu_sleeper_reserve_bytes or 0,
    )
    defaults = request.runtime.defaults(request.parsed, machine)
    effective = [*request.argv, *defaults.flags]
    if "host" not in request.parsed.explicit:
        effective += ["--host", launcher.host]
    validation.check_effective_options(shlex.join(effective))
    _check_id_free(request.instance_id, held)  # again: another create may have taken it meanwhile
    holder = held.ports.get(request.port)
    if holder is not None:
        raise Conflict(f"port {request.port} is already used by instance {holder}", ErrorReason.PORT_IN_USE)
    return Admission(request.instance_id, config, request.runtime, request.parsed, effective, defaults,
                     request.port, env)  # fmt: skip
