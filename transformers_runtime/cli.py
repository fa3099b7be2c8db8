"""`python -m transformers_runtime`: vLLM's serve flags, so an instance's vLLM options work unchanged.

The flags that mean something here mean what they mean to vLLM; every other vLLM flag
(`--enforce-eager`, `--kv-cache-memory-bytes 67108864`, ...) is accepted, logged and ignored.
The launcher forks `main(argv)` the way it forks vLLM's entry point.
"""

import argparse
import asyncio
import logging
import os
import shlex
import warnings
from pathlib import Path

from api import log_format
from api.openai_errors import ApiError
from api.vllm_surface.cli import positive_int, seconds, serve, serve_parser, stop_on_signals

from .app import ServerState, create_app
from .engine import Engine, ModelContext
from .lora import AdapterRegistry, AdapterSlots, parse_lora_module
from .metrics import Metrics
from .model import DEVICE_CHOICES, DTYPE_CHOICES, Checkpoint, ModelHolder
from .sleep import SleepManager
from .text import TextCodec

log = logging.getLogger("transformers_runtime")
SHUTDOWN_GRACE_S = 2.0  # a stream cut by SIGTERM ends with "abort" within a token; this bounds the rest


def _max_model_len(value: str) -> int | None:
    """vLLM accepts `auto` (and -1) for "the model's own maximum"."""
    if value in ("auto", "-1"):
        return None
    return positive_int(value)


def build_parser() -> argparse.ArgumentParser:
    parser = serve_parser(
        "python -m transformers_runtime",
        "An OpenAI-compatible server on transformers with vLLM's sleep/wake and LoRA endpoints. "
        "Unknown vLLM flags are accepted and ignored.",
        model=None,
        model_help="local model directory (nothing is downloaded)",
        max_model_len=_max_model_len,
        max_model_len_default=None,
        max_model_len_help="context length; auto: the model's (default)",
        host_help="address to listen on (default: 127.0.0.1)",
    )
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help="auto: checkpoint's on GPU, fp32 on CPU")
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="auto", help="auto: cuda when torch sees one")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow the model directory's own code")
    lora = parser.add_argument_group("LoRA")
    lora.add_argument("--enable-lora", action="store_true", help="serve adapters and /v1/(un)load_lora_adapter")
    lora.add_argument(
        "--lora-modules",
        nargs="+",
        type=parse_lora_module,
        default=[],
        metavar="NAME=PATH",
        help='adapters loaded at start: name=path or JSON {"name", "path", "base_model_name"} (implies --enable-lora)',
    )
    lora.add_argument("--max-loras", type=positive_int, default=4, help="adapters attached at once (LRU beyond)")
    serving = parser.add_argument_group("admission")
    serving.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=256,
        help="sequences decoded together in one batch (the largest n, too)",
    )
    serving.add_argument(
        "--max-waiting-requests", type=positive_int, default=256, help="queued or held requests before 429"
    )
    serving.add_argument(
        "--sleep-wait-timeout", type=seconds, default=300.0, help="seconds a request waits for a wake before 503"
    )
    log_format.add_argument(parser)
    return parser


def _load(args: argparse.Namespace, slots: AdapterSlots) -> tuple[Checkpoint, TextCodec, ModelHolder]:
    """Everything slow and blocking: config, tokenizer, weights, static adapters."""
    checkpoint = Checkpoint.inspect(
        Path(args.model), args.dtype, args.device, args.max_model_len, args.trust_remote_code
    )
    codec = TextCodec.load(checkpoint.path, checkpoint.eos_ids, args.trust_remote_code)
    holder = ModelHolder(checkpoint.load_model)
    holder.load()
    for adapter in args.lora_modules:
        slots.attach(holder.module, adapter)
    log.info(
        "%s on %s as %s, max-model-len %d",
        checkpoint.path,
        checkpoint.device,
        str(checkpoint.dtype).removeprefix("torch."),
        checkpoint.max_model_len,
    )
    return checkpoint, codec, holder


async def _serve(args: argparse.Namespace) -> None:
    stop = stop_on_signals()
    served_names: list[str] = args.served_model_name or [args.model]
    registry = AdapterRegistry(served_names)
    for adapter in args.lora_modules:
        registry.register(adapter)
    slots = AdapterSlots(args.max_loras)
    # Like vLLM, the port opens only once the model is loaded: until then clients see "connection refused".
    checkpoint, codec, holder = await asyncio.to_thread(_load, args, slots)
    if stop.is_set():
        return
    context = ModelContext(holder, codec, slots)
    engine = Engine(
        SleepManager(holder), args.max_waiting_requests, args.sleep_wait_timeout, context, args.max_num_seqs
    )
    metrics = Metrics(served_names[0])
    metrics.watch(
        running=lambda: engine.running,
        waiting=lambda: engine.waiting,
        sleep_level=lambda: engine.sleep_level,
        adapters=lambda: len(registry),
        load_seconds=lambda: holder.load_seconds,
    )
    state = ServerState(
        served_names=served_names,
        checkpoint=checkpoint,
        context=context,
        engine=engine,
        registry=registry,
        metrics=metrics,
        lora_enabled=args.enable_lora or bool(args.lora_modules),
        vocab_size=holder.module.get_input_embeddings().num_embeddings,
        max_num_seqs=args.max_num_seqs,
    )
    engine.start()
    # Every request in flight is aborted first: a stream cut by SIGTERM ends with "abort" within a token.
    await serve(
        create_app(state),
        args,
        served_names,
        stop,
        log,
        shutdown_timeout=SHUTDOWN_GRACE_S,
        access_log=None,
        on_stop=engine.close,
    )


def _quiet_libraries() -> None:
    """transformers and peft report progress bars and load reports that say nothing to a server's operator."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=UserWarning, module="peft")


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then return (exit status 0). Blocks; `argv` as vLLM's serve flags."""
    args, ignored = build_parser().parse_known_args(argv)
    log_format.configure("transformers_runtime", "info", args.log_format)
    if ignored:
        log.info("ignoring flags the transformers runtime does not use: %s", shlex.join(ignored))
    # Offline only; effective where huggingface_hub is not imported yet (a forked child inherits the parent's).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _quiet_libraries()
    try:
        asyncio.run(_serve(args))
    except (ValueError, OSError) as error:  # a model that cannot be served: say why, exit 1
        log.error("cannot serve: %s", error)
        raise SystemExit(1) from None
    except ApiError as error:  # a --lora-modules entry that cannot be loaded
        log.error("cannot serve: %s", error.message)
        raise SystemExit(1) from None
