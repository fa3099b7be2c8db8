"""Work vLLM repeats in every server process, done once for the launcher's instances or done cheaper.

Measured on a forked instance (py-spy, docs/benchmarks.md): after the imports and the garbage
collector (`fork.freeze_heap`), what an instance of a preloaded process still spent most on, before
it touched its model, was vLLM re-doing per process what the launcher can do once, before any fork:

- `register_kernel_overrides_once`: on a CPU, the worker points vLLM's Triton kernels at the
  platform's C++ fallbacks by scanning every attribute of every loaded module (0.1-0.3 s here, more
  with the zygote's extra modules). Done in the launcher's preload, every fork inherits the result.
- `inspect_models_in_forks`: the first server to see a model architecture has vLLM's registry inspect
  its class in a fresh `python -m vllm...` subprocess (so the server's own process imports no model
  code), which imports vLLM again: 6-9 s here, paid by the first instance of each architecture of
  every new launcher (its cache, `VLLM_CACHE_ROOT/modelinfos`, starts empty with the Pod). A fork of the
  instance's API-server process, which has vLLM imported already and no CUDA context, gives the same
  answer in a fraction of a second, with the same isolation: the model code runs in the fork only.
- `keep_logging_in_forked_engines`: vLLM's engine core applies its logging configuration again as it
  starts, a `dictConfig` whose cost grows with the square of the loggers (0.04-0.1 s here with the
  zygote's ~1,200), even where it is a fork of the API server that applied the same configuration a
  moment before. A forked engine core now applies it only where it differs, as vLLM's API server does.

And one it must not inherit from a fork: `keep_the_listener_out_of_forks` (the API server's listening socket).

All four replace private vLLM functions of the pinned version (`pyproject.toml`), as the CPU engine-core
fork in `runtimes.VllmRuntime.serve` does; where the function is missing (another vLLM) it is left as
vLLM has it, and vLLM's own behaviour is what runs.
"""

import os
import pickle
import select
import signal
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")
# vLLM's own inspection subprocess takes 6-20 s on a 2-core machine; a fork that takes longer is stuck.
FORKED_INSPECTION_TIMEOUT_S = 60.0


def register_kernel_overrides_once() -> None:
    """Register the CPU platform's kernel overrides now, and make the worker's later call a no-op.

    Once the host modules hold the overrides, a module imported later copies the override, so the
    worker's own scan would find nothing to rebind. Only this process's platform object is changed:
    a process vLLM spawns registers them itself. The scan reads deprecated module attributes (torch's
    `reduce_op`), whose warnings say nothing about the launcher, so they are not shown."""
    from vllm.platforms import current_platform

    if not hasattr(current_platform, "register_triton_kernel_overrides"):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        current_platform.register_triton_kernel_overrides()
    current_platform.register_triton_kernel_overrides = lambda: None


def inspect_models_in_forks() -> None:
    """In an instance, before vLLM reads its model's configuration: inspect architectures in a fork."""
    from vllm.model_executor.models import registry

    spawn = getattr(registry, "_run_in_subprocess", None)
    if spawn is not None:
        registry._run_in_subprocess = lambda fn: run_in_fork(fn, fallback=spawn)


def keep_logging_in_forked_engines() -> None:
    """In an instance: its engine core, where forked, keeps the logging configuration it inherited when it
    is the one it would apply (a process vLLM spawns has its own modules and configures its logging)."""
    from vllm import logger
    from vllm.v1.engine import core

    if hasattr(core, "configure_logging") and hasattr(logger, "configure_logging_if_needed"):
        core.configure_logging = logger.configure_logging_if_needed


def keep_the_listener_out_of_forks() -> None:
    """In an instance whose engine core is forked (on a CPU): the fork does not inherit the API server's listening
    socket, as a spawned engine core does not. With it, the engine core held the instance's port too, and vLLM's
    shutdown, which names any other process on its port, asked it for its command line: where the engine core
    had just exited (a zombie), psutil raised, uncaught, and a clean stop ended with exit code 1."""
    from vllm.entrypoints.launchers.api_server import entry

    setup = getattr(entry, "setup_server", None)
    if setup is None:
        return

    def setup_server(*args: Any, **kwargs: Any) -> Any:
        listen_address, sock = setup(*args, **kwargs)
        os.register_at_fork(after_in_child=sock.close)
        return listen_address, sock

    entry.setup_server = setup_server


def run_in_fork(fn: Callable[[], _T], fallback: Callable[[Callable[[], _T]], _T]) -> _T:
    """`fn()`, computed in a forked child; `fallback(fn)` (vLLM's fresh subprocess) where this process has
    a CUDA context (a fork could not use it) or where the fork gives no answer within
    FORKED_INSPECTION_TIMEOUT_S (it is killed)."""
    import torch

    if torch.cuda.is_initialized():
        return fallback(fn)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answers through the pipe, leaves with os._exit, never returns into vLLM
        try:
            os.close(read_end)
            try:
                payload = pickle.dumps((True, fn()))
            except Exception as err:  # reported to the parent, which raises it
                payload = pickle.dumps((False, f"{type(err).__name__}: {err}"))
            with os.fdopen(write_end, "wb") as out:
                out.write(payload)
        finally:
            os._exit(0)
    os.close(write_end)
    raw = _read_all(read_end, FORKED_INSPECTION_TIMEOUT_S)
    if raw is None:  # stuck, likely on a lock another thread held at the fork: vLLM's own way, then
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return fallback(fn)
    os.waitpid(pid, 0)
    if not raw:
        raise RuntimeError("the forked model inspection died without an answer")
    succeeded, value = pickle.loads(raw)
    if not succeeded:
        raise RuntimeError(f"Error raised in the forked model inspection: {value}")
    result: _T = value
    return result


def _read_all(fd: int, timeout_s: float) -> bytes | None:
    """What the pipe `fd` gives until its end (then closed), or None if that takes over `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)
