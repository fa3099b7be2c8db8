"""The stand-in's command line: vLLM's serve flags, so a launcher can run it in place of vLLM.

The flags that shape what a client sees (`--model`, `--served-model-name`, `--host`, `--port`,
`--max-model-len`) mean what they mean to vLLM; every other vLLM flag (`--dtype float32`,
`--enforce-eager`, ...) is accepted and ignored, so an instance's vLLM option string works unchanged.
As vLLM, it logs at the level VLLM_LOGGING_LEVEL names (default INFO).
"""

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import shlex

from aiohttp.log import access_logger

from api.vllm_surface.app import create_app
from api.vllm_surface.cli import positive_int, seconds, serve, serve_parser, stop_on_signals
from standin.engine import Engine
from standin.engine_core import EngineCore

log = logging.getLogger("standin")

# Lets held requests (asleep, mid-delay) end promptly on SIGTERM instead of pinning the process.
SHUTDOWN_GRACE_S = 0.5


def _loopback_host(host: str) -> str:
    """Only loopback addresses: tests must never open a port beyond 127.0.0.0/8."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise argparse.ArgumentTypeError(f"the stand-in binds loopback addresses only, not {host!r}")
    return host


def build_parser() -> argparse.ArgumentParser:
    """vLLM's client-visible serve flags plus the stand-in's delays; see `main` for the rest."""
    parser = serve_parser(
        "python -m standin",
        "A test double with vLLM's HTTP surface; unknown vLLM flags are ignored.",
        model="standin-model",
        model_help="model path or name (only reported)",
        max_model_len=int,
        max_model_len_default=2048,
        max_model_len_help="reported in /v1/models",
        host=_loopback_host,
    )
    delays = parser.add_argument_group("delays (seconds)")
    delays.add_argument("--startup-delay", type=seconds, default=0.0, help="before listening at all")
    delays.add_argument("--sleep-delay", type=seconds, default=0.0, help="of each POST /sleep")
    delays.add_argument("--wake-delay", type=seconds, default=0.0, help="of each POST /wake_up")
    delays.add_argument("--request-delay", type=seconds, default=0.0, help="of each inference request")
    delays.add_argument(
        "--shutdown-delay", type=seconds, default=0.0, help="from SIGTERM to exiting (a server slow to stop)"
    )
    parser.add_argument(
        "--engine-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="generate through a separate engine process, as vLLM's EngineCore; when it dies the server stays "
        "up, wedged: /health answers 200, every inference request 500 (default: on)",
    )
    parser.add_argument(
        "--corrupt-after-wake",
        type=positive_int,
        default=None,
        metavar="N",
        help="answer other tokens from the N-th wake on (a model a sleep/wake cycle corrupted; N >= 1)",
    )
    return parser


async def _serve(args: argparse.Namespace, core: EngineCore | None) -> None:
    try:
        await _listen(args, core)
    finally:
        if core is not None:
            await core.close()


async def _listen(args: argparse.Namespace, core: EngineCore | None) -> None:
    stop = stop_on_signals()
    # vLLM opens its port only once the engine is up; until then a client sees "connection refused".
    if args.startup_delay:
        log.info("listening in %.1f s (--startup-delay)", args.startup_delay)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(args.startup_delay):
            await stop.wait()
    if stop.is_set():
        return
    if core is not None:
        await core.connect()
    engine = Engine(
        args.served_model_name or [args.model],
        args.model,
        args.max_model_len,
        sleep_delay=args.sleep_delay,
        wake_delay=args.wake_delay,
        request_delay=args.request_delay,
        corrupt_after_wake=args.corrupt_after_wake,
        core=core,
    )
    await serve(
        create_app(engine),
        args,
        engine.served_names,
        stop,
        log,
        shutdown_timeout=SHUTDOWN_GRACE_S,
        access_log=access_logger,
        on_stop=lambda: asyncio.sleep(args.shutdown_delay),
    )


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then return (exit status 0). Blocks; `argv` as vLLM's."""
    args, ignored = build_parser().parse_known_args(argv)
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper()
    if level not in logging.getLevelNamesMapping():
        level = "INFO"
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    if ignored:
        log.info("ignoring flags the stand-in does not model: %s", shlex.join(ignored))
    # Forked before any event loop runs, and ready before the server listens (as vLLM's engine core).
    core = EngineCore.start() if args.engine_process else None
    asyncio.run(_serve(args, core))
