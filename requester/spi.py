"""The SPI server (FMA's `coordination` package): what the dual-pods controller calls on the requester.

A thin layer over the GPU source, the readiness bit, the log relay and the proxy's target, plus `/metrics`.
"""

import asyncio
import json
import logging
import re
from dataclasses import asdict

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.keys import DEFAULT_ADMIN_PORT

from .backend_limits import BackendLimits
from .gpus import GpuSource
from .log_relay import LogRelay, StartPositionError
from .metrics import RequesterMetrics
from .middleware import count_and_contain, text
from .proxy_target import ProxyTarget, TargetConflict, parse_target
from .readiness import Readiness

log = logging.getLogger(__name__)

ACCELERATORS_PATH = "/v1/dual-pods/accelerators"
MEMORY_USAGE_PATH = "/v1/dual-pods/accelerator-memory-usage"
BECOME_READY_PATH = "/v1/become-ready"
BECOME_UNREADY_PATH = "/v1/become-unready"
SET_LOG_PATH = "/v1/set-log"
PROXY_CONFIG_PATH = "/v1/proxy/config"
LOG_START_PARAM = "startPos"
METRICS_PATH = "/metrics"
DEFAULT_PORT = DEFAULT_ADMIN_PORT
NO_GPUS = "no GPUs found"
_INTEGER = re.compile(r"-?[0-9]+")

GPUS = web.AppKey("gpus", GpuSource)
READINESS = web.AppKey("readiness", Readiness)
LOG_RELAY = web.AppKey("log_relay", LogRelay)
METRICS = web.AppKey("metrics", RequesterMetrics)
PROXY_TARGET = web.AppKey("proxy_target", ProxyTarget)
BACKEND_LIMITS = web.AppKey("backend_limits", BackendLimits)


def _json(value: object) -> web.Response:
    return web.Response(text=json.dumps(value) + "\n", content_type="application/json")


async def accelerators(request: web.Request) -> web.Response:
    uuids = request.app[GPUS].uuids
    return _json(list(uuids)) if uuids else text(NO_GPUS, 500)


async def memory_usage(request: web.Request) -> web.Response:
    gpus = request.app[GPUS]
    if not gpus.uuids:
        return text(NO_GPUS, 500)
    usage = await asyncio.to_thread(gpus.memory_usage)
    return text("\n".join(usage.errors), 500) if usage.errors else _json(usage.mib)


async def become_ready(request: web.Request) -> web.Response:
    request.app[READINESS].set(True)
    return text("OK")


async def become_unready(request: web.Request) -> web.Response:
    request.app[READINESS].set(False)
    return text("OK")


async def set_log(request: web.Request) -> web.Response:
    raw = request.query.get(LOG_START_PARAM)
    if not raw:
        return text(f"Missing {LOG_START_PARAM} parameter", 400)
    if not _INTEGER.fullmatch(raw):
        return text(f"Failed to parse {LOG_START_PARAM}={raw!r} as an integer", 400)
    start = int(raw)
    chunk = await request.read()
    try:
        return text(await request.app[LOG_RELAY].add(start, chunk))
    except StartPositionError as err:
        return text(str(err), 400)
    except OSError as err:
        return text(f"Failed to write log chunk: {err}", 500)


async def put_proxy_config(request: web.Request) -> web.Response:
    """FMA 0.7's set-once target; the same body again is a harmless retry (200), another one a 409."""
    try:
        target = parse_target(json.loads(await request.read()))
    except ValueError as err:  # bad JSON, bad UTF-8 or a TargetError
        return text(f"invalid proxy config: {err}", 400)
    try:
        if request.app[PROXY_TARGET].set(target):
            log.info("proxy configured", extra={"target": target.as_json()})
    except TargetConflict as err:
        return text(str(err), 409)
    return text(f"configured proxy to: {target.host_port}")


async def get_proxy_config(request: web.Request) -> web.Response:
    """The target as it was put, plus `limits`: what the proxy knows now of the server's limits."""
    target = request.app[PROXY_TARGET].target
    if target is None:
        return text("proxy not configured", 404)
    limits = request.app[BACKEND_LIMITS]
    known = {**asdict(limits.current()), "max_num_seqs": limits.max_num_seqs()}
    return _json({**target.as_json(), "limits": known})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_spi_app(
    gpus: GpuSource,
    readiness: Readiness,
    log_relay: LogRelay,
    requester_metrics: RequesterMetrics,
    proxy_target: ProxyTarget,
    backend_limits: BackendLimits,
) -> web.Application:
    app = web.Application(middlewares=[count_and_contain(requester_metrics, "spi")])
    app[GPUS], app[READINESS], app[LOG_RELAY], app[METRICS] = gpus, readiness, log_relay, requester_metrics
    app[PROXY_TARGET], app[BACKEND_LIMITS] = proxy_target, backend_limits
    app.router.add_get(ACCELERATORS_PATH, accelerators)
    app.router.add_get(MEMORY_USAGE_PATH, memory_usage)
    app.router.add_post(BECOME_READY_PATH, become_ready)
    app.router.add_post(BECOME_UNREADY_PATH, become_unready)
    app.router.add_post(SET_LOG_PATH, set_log)
    app.router.add_put(PROXY_CONFIG_PATH, put_proxy_config)
    app.router.add_get(PROXY_CONFIG_PATH, get_proxy_config)
    app.router.add_get(METRICS_PATH, metrics)
    return app
