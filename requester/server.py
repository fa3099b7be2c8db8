"""Runs the requester's HTTP servers on one address until SIGTERM or SIGINT, then stops them gracefully.

Graceful means: stop accepting, close idle keep-alive connections at once, and give requests in
flight up to `shutdown_timeout` seconds (FMA waits 60 s), so an idle requester exits immediately.
"""

import asyncio
import logging
import signal
from dataclasses import dataclass

from aiohttp import web

from api.tasks import Background

from .spi_auth import SpiAuth

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Listener:
    """One server. `cancel_on_disconnect` cancels a handler whose client went away (the proxy's, so that
    an abandoned request stops occupying the model server too)."""

    app: web.Application
    port: int
    cancel_on_disconnect: bool = False


async def start_listeners(listeners: dict[str, Listener], host: str, shutdown_timeout: float) -> list[web.AppRunner]:
    """Bind and start each named server; raises OSError when a port cannot be bound (having stopped the rest)."""
    runners: list[web.AppRunner] = []
    try:
        for name, listener in listeners.items():
            runner = web.AppRunner(
                listener.app,
                access_log=None,
                shutdown_timeout=shutdown_timeout,
                handler_cancellation=listener.cancel_on_disconnect,
            )
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, host, listener.port).start()
            log.info("serving", extra={"server": name, "host": host, "port": listener.port})
    except BaseException:
        await stop_listeners(runners)
        raise
    return runners


async def stop_listeners(runners: list[web.AppRunner]) -> None:
    await asyncio.gather(*(runner.cleanup() for runner in runners))


async def serve(listeners: dict[str, Listener], host: str, shutdown_timeout: float, auth: SpiAuth) -> None:
    """Serve until SIGTERM or SIGINT; raises OSError when a port cannot be bound. `auth` is warmed once
    serving, and closed at the end."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runners: list[web.AppRunner] = []
    warming = Background()
    try:
        runners = await start_listeners(listeners, host, shutdown_timeout)
        warming.start(auth.warm(), name="warm the SPI auth")
        await stop.wait()
        log.info("shutting down", extra={"timeout_seconds": shutdown_timeout})
    finally:
        await warming.stop()
        await stop_listeners(runners)
        await auth.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
