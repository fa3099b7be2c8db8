"""Waiting for a freshly started server to answer, failing fast (with its log) when it dies instead."""

import asyncio
import ssl
import subprocess
import time
from pathlib import Path

import aiohttp


class StartupError(RuntimeError):
    """A cluster process exited or did not become ready in time."""


def log_tail(log: Path, lines: int = 25) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


async def wait_http_ok(
    name: str,
    url: str,
    process: "subprocess.Popen[bytes]",
    log: Path,
    *,
    ssl_context: ssl.SSLContext | bool = True,
    limit: float = 60.0,
) -> float:
    """Poll `url` until it answers 200; returns the seconds it took."""
    start = time.monotonic()
    last = "no answer yet"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while time.monotonic() - start < limit:
            if process.poll() is not None:
                raise StartupError(
                    f"{name} exited with code {process.returncode} during startup; log {log}:\n{log_tail(log)}"
                )
            try:
                async with session.get(url, ssl=ssl_context) as response:
                    if response.status == 200:
                        return time.monotonic() - start
                    last = f"HTTP {response.status}: {(await response.text())[:300]}"
            except (aiohttp.ClientError, TimeoutError) as error:
                last = repr(error)
            await asyncio.sleep(0.2)
    raise StartupError(f"{name} not ready at {url} after {limit:.0f} s ({last}); log {log}:\n{log_tail(log)}")
