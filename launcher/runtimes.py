"""Model-server runtimes the launcher can fork: how to preload, check options, and serve.

The parent imports a runtime's modules once (`preload`) and checks each instance's options with
the runtime's own argument parser, so a bad flag is a 400 and not a dead child. The runtime's zygote
(`zygote`) also imports what every server imports later, on its way to serving (`prepare_zygote`:
the modules measured as imported by a served instance and not by the launcher). The forked child
calls `serve`, which never returns control to the launcher's code; the runtime's `markers` say which of
its log messages end a start-up phase (`startup_phases`). What vLLM would repeat in every server process
is done once in the preload or cheaper in the instance (`vllm_startup`).
"""

import argparse
import contextlib
import importlib
import importlib.util
import io
import logging
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from . import startup_phases as phases
from . import vllm_startup
from .engine_defaults import KV_CACHE_SIZING_FLAGS, EngineDefaults, Machine, transformers_defaults, vllm_defaults
from .errors import InvalidOptions
from .validation import unreadable_model_entry

_UNSET: Any = object()
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParsedOptions:
    values: argparse.Namespace
    explicit: frozenset[str]  # argparse dests the user set, whatever spelling they used


class Runtime(ABC):
    name: str
    on_cpu = True  # set by preload where it matters
    # Whether its completions give log-probabilities (the post-wake probe compares them too).
    probe_logprobs = True
    # Top-level modules the runtime cannot run without, and the extra that brings them (docs/install.md).
    requires: tuple[str, ...] = ()
    install_hint = ""
    # The log messages that end its start-up phases, and that report the bytes a sleep or wake moved.
    markers: tuple[phases.Marker, ...] = ()
    # What its servers import after the fork (measured: a served instance's sys.modules, its engine
    # processes' included, less the launcher's), imported once in its zygote instead.
    zygote_modules: tuple[str, ...] = ()

    def missing_modules(self) -> list[str]:
        """The required modules that are not installed; an import error inside an installed one is not
        hidden here but raised by `preload`."""
        return [module for module in self.requires if importlib.util.find_spec(module) is None]

    @abstractmethod
    def preload(self) -> None:
        """Import everything a child needs, so forking skips the import cost."""

    def prepare_zygote(self) -> None:
        """In the zygote: do once what every server would do before it touches a model. Nothing here may
        initialise CUDA (a forked child cannot use a CUDA context its parent made): imports only."""
        failed = []
        for module in self.zygote_modules:
            try:
                importlib.import_module(module)
            except Exception as err:  # an optional module missing costs its import time only
                failed.append(f"{module} ({type(err).__name__})")
        if failed:
            log.info("the %s zygote could not import %s; its servers import them themselves", self.name, failed)

    @abstractmethod
    def make_parser(self) -> argparse.ArgumentParser: ...

    @abstractmethod
    def serve(self, argv: list[str]) -> None:
        """Run the model server in the forked child until it is told to stop."""

    def report_sleeps(self, report: Callable[[bool], None]) -> None:
        """In the forked child, before `serve`: have the server call `report` with whether it sleeps after each
        sleep and wake asked of it, before it answers (`sleep_reports`). This one: a server on vLLM's surface
        (`api.vllm_surface`), as the stand-in and the transformers runtime are."""
        from api.vllm_surface import app as surface

        surface.on_sleep_change(report)

    def check(self, values: argparse.Namespace) -> None:  # noqa: B027 - most runtimes need none
        """Cross-option checks the parser alone cannot do; raise ValueError/TypeError."""

    def defaults(self, parsed: ParsedOptions, machine: Machine) -> EngineDefaults:
        """Flags to add when the user did not set them (E6)."""
        return EngineDefaults()

    def wants_gpu_memory(self, parsed: ParsedOptions) -> bool:
        """Whether `defaults` needs the instance's GPUs' free memory measured."""
        return False

    def child_environment(self) -> dict[str, str]:
        return {}

    def is_engine_process(self, title: str) -> bool:
        """Whether a descendant of an instance's server, by its process title, is one the server cannot
        serve without (its death kills the instance); the runtimes here that fork none say no."""
        return False

    @cached_property
    def parser(self) -> argparse.ArgumentParser:
        return self.make_parser()

    def parse(self, argv: list[str]) -> ParsedOptions:
        explicit_probe = self._parse(argv, argparse.Namespace(**{a.dest: _UNSET for a in self.parser._actions}))
        values = self._parse(argv, None)
        try:
            self.check(values)
        except (ValueError, TypeError) as err:
            raise InvalidOptions(f"invalid options: {err}") from None
        explicit = frozenset(k for k, v in vars(explicit_probe).items() if v is not _UNSET)
        return ParsedOptions(values=values, explicit=explicit)

    def _run_parser(self, argv: list[str], namespace: argparse.Namespace | None) -> argparse.Namespace:
        return self.parser.parse_args(argv, namespace)

    def _parse(self, argv: list[str], namespace: argparse.Namespace | None) -> argparse.Namespace:
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                return self._run_parser(argv, namespace)
        except SystemExit:
            raise InvalidOptions(f"invalid options: {_last_error(stderr.getvalue())}") from None
        except (ValueError, TypeError) as err:
            raise InvalidOptions(f"invalid options: {err}") from None


class KnownArgsRuntime(Runtime):
    """A runtime that takes vLLM's serve flags and ignores those it does not use, so one option
    string serves either runtime."""

    def _run_parser(self, argv: list[str], namespace: argparse.Namespace | None) -> argparse.Namespace:
        values, _ignored = self.parser.parse_known_args(argv, namespace)
        return values


def _check_model_readable(model: str) -> None:
    problem = unreadable_model_entry(model)
    if problem is not None:
        raise ValueError(problem)


def platform_is_cpu() -> bool:
    """No GPU for the runtimes here. vLLM's detection uses NVML and never initialises CUDA, which a
    process that forks must not do."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _last_error(usage_and_error: str) -> str:
    """argparse prints its usage, then `prog: error: message`; keep the message."""
    lines = [line for line in usage_and_error.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if ": error: " in line:
            return line.split(": error: ", 1)[1]
    return lines[-1] if lines else "rejected by the argument parser"


class VllmRuntime(Runtime):
    """vLLM's OpenAI-compatible server, run in-process in the forked child."""

    name = "vllm"
    requires = ("vllm", "torch")
    install_hint = "install dualpods[launcher-cpu], or build on vLLM's image (images/launcher-gpu.Dockerfile)"
    # Flags that would make the server unreachable where the launcher looks for it (plain HTTP on --port).
    UNREACHABLE_FLAGS = {
        "uds": "--uds (a Unix socket instead of the port)",
        "grpc": "--grpc (gRPC instead of HTTP on the port)",
        "headless": "--headless (no API server)",
        "ssl_keyfile": "--ssl-keyfile (HTTPS)",
        "ssl_certfile": "--ssl-certfile (HTTPS)",
    }
    # vLLM names its engine-core and worker processes `<prefix>::EngineCore`, `<prefix>::Worker_TP0`, ...
    process_title_prefix = "VLLM::"
    markers = (
        phases.marker(phases.CONFIGURED, r"^Initializing a V1 LLM engine"),
        phases.marker(phases.WEIGHTS_LOADED, r"^(Loading weights took|Model loading took)"),
        phases.marker(phases.KV_CACHE_PROFILED, r"KV cache size: [\d,]+ tokens"),
        phases.marker(phases.WARMED_UP, r"^init engine \(profile, create kv cache, warmup model\) took"),
        phases.marker(phases.LISTENING, r"^Application startup complete"),
        phases.marker(phases.SLEPT, r"^Sleep mode freed (?P<size>[\d.]+) (?P<unit>GiB) memory"),
    )
    zygote_modules = (
        # the API server's
        "uvicorn.lifespan.on",
        "uvicorn.protocols.http.httptools_impl",
        "uvicorn.protocols.websockets.websockets_sansio_impl",
        "fastapi.staticfiles",
        "prometheus_client.multiprocess",
        "prometheus_fastapi_instrumentator",
        "model_hosting_container_standards",
        "model_hosting_container_standards.sagemaker",
        "vllm.entrypoints.anthropic.api_router",
        "vllm.entrypoints.cohere.api_router",
        "vllm.entrypoints.generate.api_router",
        "vllm.entrypoints.generate.generative_scoring.api_router",
        "vllm.entrypoints.generate.structured_decisions.api_router",
        "vllm.entrypoints.openai.chat_completion.api_router",
        "vllm.entrypoints.openai.chat_completion.batch_serving",
        "vllm.entrypoints.openai.completion.api_router",
        "vllm.entrypoints.openai.models.api_router",
        "vllm.entrypoints.openai.responses.api_router",
        "vllm.entrypoints.rl.factories",
        "vllm.entrypoints.rl.online.api_router",
        "vllm.entrypoints.scale_out.factories",
        "vllm.entrypoints.scale_out.derender.api_router",
        "vllm.entrypoints.scale_out.render.api_router",
        "vllm.entrypoints.scale_out.token_in_token_out.api_router",
        "vllm.entrypoints.serve.dev.cache.api_router",
        "vllm.entrypoints.serve.dev.rpc.api_router",
        "vllm.entrypoints.serve.dev.server_info.api_router",
        "vllm.entrypoints.serve.dev.sleep.api_router",
        "vllm.entrypoints.serve.elastic_ep.api_router",
        "vllm.entrypoints.serve.instrumentator.metrics",
        "vllm.entrypoints.serve.instrumentator.offline_docs",
        "vllm.entrypoints.serve.lora.api_router",
        "vllm.entrypoints.serve.profile.api_router",
        "vllm.entrypoints.serve.tokenize.api_router",
        "vllm.entrypoints.serve.utils.fingerprint",
        "vllm.entrypoints.serve.utils.orca_metrics",
        "vllm.entrypoints.serve.utils.sse_keep_alive",
        "vllm.renderers.hf",
        "vllm.transformers_utils.chat_templates.registry",
        "vllm.v1.engine.async_llm",
        "vllm.v1.engine.core_client",
        "vllm.v1.metrics.loggers",
        "vllm.v1.metrics.prometheus",
        "vllm.collect_env",
        # the engine core's and its worker's
        "compressed_tensors",
        "compressed_tensors.compressors",
        "compressed_tensors.quantization",
        "compressed_tensors.transform",
        "compressed_tensors.offload",
        "loguru",
        "vllm.distributed.elastic_ep.elastic_execute",
        "vllm.model_executor.layers.quantization.compressed_tensors.utils",
        "vllm.model_executor.layers.quantization.online.fp8",
        "vllm.model_executor.layers.quantization.online.int8",
        "vllm.model_executor.layers.quantization.online.mxfp4",
        "vllm.model_executor.layers.quantization.online.mxfp8",
        "vllm.model_executor.layers.quantization.online.nvfp4",
        "vllm.v1.attention.backends.cpu_attn",
        "vllm.v1.core.kv_cache_manager",
        "vllm.v1.core.sched.scheduler",
        "vllm.v1.pool.flash_maxsim.flash_maxsim_rerank",
    )

    def preload(self) -> None:
        for module in ("vllm.entrypoints.launchers.api_server.entry", "vllm.v1.engine.core"):
            importlib.import_module(module)
        import vllm.envs

        # Read at import by vLLM's set_process_title, so the launcher's own environment decides it.
        self.process_title_prefix = f"{vllm.envs.VLLM_PROCESS_NAME_PREFIX}::"
        self.on_cpu = platform_is_cpu()
        if self.on_cpu:
            importlib.import_module("vllm.v1.worker.cpu_worker")  # the worker runs in the engine core here
            # Children inherit AMX tile permission across fork; without it a bf16 request on an
            # AMX CPU dies with SIGILL (docs/fma-compatibility.md). No torch op runs here.
            import torch

            with contextlib.suppress(Exception):
                torch.cpu._init_amx()
            vllm_startup.register_kernel_overrides_once()
        self.parser  # noqa: B018 - build it once, here, not on the first request

    def make_parser(self) -> argparse.ArgumentParser:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser: argparse.ArgumentParser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
        return parser

    def check(self, values: argparse.Namespace) -> None:
        from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

        for dest, flag in self.UNREACHABLE_FLAGS.items():
            if getattr(values, dest, None):
                raise ValueError(f"{flag} is not supported: the launcher reaches instances over plain HTTP on --port")
        validate_parsed_serve_args(values)
        model = values.model_tag or values.model
        if model.startswith(("/", "./", "../")) and not os.path.exists(model):
            raise ValueError(f"model path {model} does not exist on this node")
        _check_model_readable(model)
        if self.on_cpu and values.enable_sleep_mode:
            raise ValueError(
                "--enable-sleep-mode is not supported by vLLM on the CPU platform; leave it out "
                "(the launcher's sleep/wake still pauses and resumes the engine)"
            )

    def defaults(self, parsed: ParsedOptions, machine: Machine) -> EngineDefaults:
        return vllm_defaults(parsed.explicit, machine)

    def wants_gpu_memory(self, parsed: ParsedOptions) -> bool:
        return not self.on_cpu and not parsed.explicit & KV_CACHE_SIZING_FLAGS

    def is_engine_process(self, title: str) -> bool:
        return title.startswith(self.process_title_prefix)

    def child_environment(self) -> dict[str, str]:
        env = {"VLLM_SERVER_DEV_MODE": "1"}  # the /sleep, /wake_up and /is_sleeping routes
        if self.on_cpu:
            # With the worker inside the engine-core process and that process forked (below),
            # nothing re-imports vLLM: ~6 s to healthy instead of ~25-50 s.
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        return env

    def serve(self, argv: list[str]) -> None:
        import multiprocessing

        import vllm.v1.engine.utils as engine_utils
        from vllm.entrypoints.launchers.api_server import entry

        if self.on_cpu:
            # The CPU platform forces `spawn`, which would re-import vLLM in the engine core.
            engine_utils.get_mp_context = lambda: multiprocessing.get_context("fork")
            vllm_startup.keep_the_listener_out_of_forks()
        vllm_startup.inspect_models_in_forks()
        vllm_startup.keep_logging_in_forked_engines()
        sys.argv = ["vllm serve", *argv]
        entry.main()

    def report_sleeps(self, report: Callable[[bool], None]) -> None:
        """vLLM's /sleep and /wake_up await its engine client's `sleep` and `wake_up` (`AsyncLLM`, in the server's
        process), then answer: what the engine core says right after each is reported first."""
        from vllm.v1.engine.async_llm import AsyncLLM

        sleep, wake_up = AsyncLLM.sleep, AsyncLLM.wake_up

        async def reported_sleep(engine: AsyncLLM, *args: Any, **kwargs: Any) -> None:
            await sleep(engine, *args, **kwargs)
            report(await engine.is_sleeping())

        async def reported_wake_up(engine: AsyncLLM, *args: Any, **kwargs: Any) -> bool:
            awake: bool = await wake_up(engine, *args, **kwargs)
            report(await engine.is_sleeping())
            return awake

        AsyncLLM.sleep, AsyncLLM.wake_up = reported_sleep, reported_wake_up


class TransformersRuntime(KnownArgsRuntime):
    """The transformers fallback runtime (E4, E5): `python -m transformers_runtime` in the child."""

    name = "transformers"
    requires = ("transformers", "peft", "torch")
    install_hint = "install dualpods[launcher-cpu] or dualpods[launcher-gpu]"
    markers = (
        phases.marker(phases.WEIGHTS_LOADED, r"^model loaded in"),
        phases.marker(phases.LISTENING, r"^serving .* on http://"),
        phases.marker(phases.SLEPT, r"^level 1: (?P<size>[\d.]+) (?P<unit>MB) of weights to host memory"),
    )
    zygote_modules = (
        "transformers_runtime.app",
        "transformers.models.auto.modeling_auto",
        "transformers.models.auto.tokenization_auto",
        "transformers.models.llama.modeling_llama",
        "transformers.tokenization_utils_fast",
        "safetensors.torch",
    )

    def preload(self) -> None:
        for module in ("transformers_runtime.cli", "transformers", "peft", "torch"):
            importlib.import_module(module)
        self.on_cpu = platform_is_cpu()
        self.parser  # noqa: B018

    def make_parser(self) -> argparse.ArgumentParser:
        from transformers_runtime import build_parser

        return build_parser()

    def check(self, values: argparse.Namespace) -> None:
        _check_model_readable(values.model)

    def defaults(self, parsed: ParsedOptions, machine: Machine) -> EngineDefaults:
        return transformers_defaults(parsed.explicit, machine)

    def serve(self, argv: list[str]) -> None:
        from transformers_runtime import main

        main(argv)


class StandInRuntime(KnownArgsRuntime):
    """The stand-in server (`standin`, the simulation runtime) in place of every runtime, for
    simulations and tests that need many instances or exact timings. It accepts vLLM's flags and
    ignores those it does not model. As vLLM, it forks an engine process (unless `--no-engine-process`),
    which its liveness watches."""

    name = "stand-in"
    markers = (phases.marker(phases.LISTENING, r"^serving .* on http://"),)
    zygote_modules = ("api.vllm_surface.app", "standin.engine")

    def preload(self) -> None:
        import standin  # noqa: F401

        self.parser  # noqa: B018

    def is_engine_process(self, title: str) -> bool:
        from standin.engine_core import ENGINE_TITLE

        return title.startswith(ENGINE_TITLE)

    def make_parser(self) -> argparse.ArgumentParser:
        from standin import build_parser

        return build_parser()

    def serve(self, argv: list[str]) -> None:
        from standin import main

        main(argv)
