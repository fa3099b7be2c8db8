"""vLLM's serve flags and serving loop, as every runtime that stands in for vLLM takes and runs them.

A launcher forks a runtime's `main(argv)` with an instance's vLLM options, so the flags that shape what a
client sees (`--model`, `--served-model-name`, `--host`, `--port`, `--max-model-len`) mean what they mean
to vLLM, every other vLLM flag is accepted (each runtime logs those it ignores), and a runtime opens its
port only once its engine is up, logs `serving NAMES on http://HOST:PORT` (the line a launcher waits for),
and serves until SIGTERM or SIGINT, then exits 0.
"""

import argparse
import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from aiohttp import web


def seconds(value: str) -> float:
    """A duration flag: seconds, not negative."""
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return number


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return number


def serve_parser(
    prog: str,
    description: str,
    *,
    model: str | None,
    model_help: str,
    max_model_len: Callable[[str], int | None],
    max_model_len_default: int | None,
    max_model_len_help: str,
    host: Callable[[str], str] = str,
    host_help: str | None = None,
) -> argparse.ArgumentParser:
    """A parser with vLLM's client-visible serve flags; `model` is --model's default (None: required), `host`
    checks --host; a runtime adds its own flags after these."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        allow_abbrev=False,  # a vLLM flag must never be taken for an abbreviation of one of ours
    )
    parser.add_argument("--model", required=model is None, default=model, help=model_help)
    parser.add_argument("--served-model-name", nargs="+", help="names clients use (default: --model)")
    parser.add_argument("--host", type=host, default="127.0.0.1", help=host_help)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-model-len", type=max_model_len, default=max_model_len_default, help=max_model_len_help)
    return parser


def stop_on_signals() -> asyncio.Event:
    """An event SIGTERM and SIGINT set: a runtime serves until then, as vLLM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def serve(
    app: web.Application,
    args: argparse.Namespace,
    served_names: list[str],
    stop: asyncio.Event,
    log: logging.Logger,
    *,
    shutdown_timeout: float,
    access_log: logging.Logger | None,
    on_stop: Callable[[], Awaitable[None]],
) -> None:
    """Serve `app` on `--host` and `--port` until `stop` is set; then `on_stop` (while requests in flight are still
    open: a runtime ends or delays them there) before they get `shutdown_timeout` seconds to finish."""
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout, access_log=access_log)
    await runner.setup()
    try:
        await web.TCPSite(runner, args.host, args.port).start()
        log.info("serving %s on http://%s:%d", ", ".join(served_names), args.host, args.port)
        await stop.wait()
        log.info("shutting down")
    finally:
        await on_stop()
        await runner.cleanup()
