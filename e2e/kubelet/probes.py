"""startupProbe / readinessProbe / livenessProbe: httpGet, tcpSocket and exec, against the Pod's address.

httpGet goes through `http_probe.py` (a lean HTTP/1.1 GET: one process probes every Pod of every Node).
"""

import asyncio
import contextlib
import datetime
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

from kubernetes_asyncio import client

from e2e.kubelet.addresses import require_loopback
from e2e.kubelet.http_probe import HttpProbe, ProbeHttpError
from e2e.kubelet.status import now

# Runs a command inside the container: (argv, timeout) -> (exit code, output).
Exec = Callable[[list[str], float], Awaitable[tuple[int, str]]]


@dataclass(frozen=True)
class ProbeTarget:
    pod_ip: str
    ports: dict[str, int]  # the container's named ports
    exec: Exec
    # Keep an httpGet probe's connection for its next period (simulated containers, see http_probe.py).
    keep_alive: bool = False


def _host(given: str | None, target: ProbeTarget) -> str:
    """The Pod's address unless the probe names a host, which must be loopback too (the network rule)."""
    if not given:
        return target.pod_ip
    return "127.0.0.1" if given == "localhost" else str(require_loopback(given))


def _port(value: int | str, target: ProbeTarget) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    if value not in target.ports:
        raise ValueError(f"named port {value!r} is not declared by the container")
    return target.ports[value]


async def check(probe: client.V1Probe, target: ProbeTarget, http: HttpProbe) -> tuple[bool, str]:
    """One attempt; (success, why) where `why` explains a failure. `http` makes its httpGet requests."""
    timeout = float(probe.timeout_seconds or 1)
    try:
        if probe.http_get is not None:
            get = probe.http_get
            scheme = (get.scheme or "HTTP").lower()
            headers = {h.name: h.value for h in get.http_headers or []}
            status = await http.get(
                scheme, _host(get.host, target), _port(get.port, target), get.path or "/", headers, timeout
            )
            return 200 <= status < 400, f"HTTP probe failed with statuscode: {status}"
        if probe.tcp_socket is not None:
            host = _host(probe.tcp_socket.host, target)
            async with asyncio.timeout(timeout):  # not wait_for: see HttpProbe.get
                _, writer = await asyncio.open_connection(host, _port(probe.tcp_socket.port, target))
            writer.close()
            return True, ""
        if probe._exec is not None:
            code, output = await target.exec(list(probe._exec.command or []), timeout)
            return code == 0, f"exec probe exited with {code}: {output.strip()[-200:]}"
    except (OSError, TimeoutError, ProbeHttpError, ValueError) as error:
        return False, f"probe failed: {error!r}"
    return False, "probe has no handler (httpGet, tcpSocket or exec)"


async def results(
    probe: client.V1Probe,
    target: ProbeTarget,
    container_started: datetime.datetime,
    due: asyncio.Event | None = None,
) -> AsyncGenerator[tuple[bool, str], None]:
    """Yield (healthy, why) each time the probe's outcome crosses its success or failure threshold.

    As the kubelet's probe worker: no attempt before `initialDelaySeconds` after the container started (from
    its start, not from this call: a readiness probe that begins after a startup probe has already waited),
    a ticker of the probe's period from the first attempt, and `due`, when set, runs an attempt at once
    without moving the ticker (the kubelet's manual trigger, see `ContainerSupervisor.sync`)."""
    period = float(probe.period_seconds or 10)
    success_threshold = probe.success_threshold or 1
    failure_threshold = probe.failure_threshold or 3
    delay = float(probe.initial_delay_seconds or 0) - (now() - container_started).total_seconds()
    await asyncio.sleep(max(delay, 0.0))
    due = due or asyncio.Event()
    state: bool | None = None
    successes = failures = 0
    http = HttpProbe(keep_alive=target.keep_alive)
    loop = asyncio.get_running_loop()
    tick = loop.time()
    try:
        while True:
            due.clear()
            ok, why = await check(probe, target, http)
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if ok and successes >= success_threshold and state is not True:
                state = True
                yield True, ""
            elif not ok and failures >= failure_threshold and state is not False:
                state = False
                yield False, why
            while tick <= loop.time():  # a tick missed while probing is dropped, as a Go ticker drops it
                tick += period
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(tick):
                    await due.wait()
    finally:
        http.close()
