"""Runs the requester's HTTP servers on one address until SIGTERM or SIGINT, then stops them gracefully.

Graceful means: stop accepting, close idle keep-alive connections at once, and give requests in
flight up to `shutdown_timeout` seconds (FMA waits 60 s), so an idle requester exits immediately.
"""

import asyncio
import logging
import signal

from aiohttp import web

log = logging.getLogger(__name__)


async def serve(listeners: dict[str, tuple[web.Application, int]], host: str, shutdown_timeout: float) -> None:
    """Serve each named application on its port; raises OSError when a port cannot be bound."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runners: list[web.AppRunner] = []
    try:
        for name, (app, port) in listeners.items():
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, host, port).start()
            log.info("serving", extra={"server": name, "host": host, "port": port})
        await stop.wait()
        log.info("shutting down", extra={"timeout_seconds": shutdown_timeout})
    finally:
        await asyncio.gather(*(runner.cleanup() for runner in runners))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
