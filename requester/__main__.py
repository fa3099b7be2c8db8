"""`python -m requester`: discover this container's GPUs, then serve the SPI, the probes and the proxy until SIGTERM.

Configured like FMA's requester through the environment (`SPI_PORT`, `PROBES_PORT`, and FMA 0.7's
`PROXY_PORT`); every setting also has a flag, and a flag wins over its variable. An empty variable
counts as unset. Unlike FMA's, the SPI's state-changing routes need the controller's token (E15,
`spi_auth`); `--spi-auth none` opens them as in FMA.
"""

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from types import FrameType

from api import log_format, version
from api.requester import DEFAULT_TRUSTED_CONTROLLERS, requester_audience
from api.tasks import Background

from . import probes, proxy, spi
from .backend_limits import BackendLimits
from .gpus import GpuDiscoveryError, GpuSource, SourceChoice, discover
from .log_relay import LogRelay
from .metrics import RequesterMetrics
from .process_start import process_start
from .proxy_target import ProxyTarget
from .readiness import Readiness
from .server import Listener, serve
from .spi_auth import OpenSpi, SpiAuth, TokenReviewAuth, TrustedControllers, own_namespace, review_api
from .upstream import Upstream
from .visible_devices import ENV_NAME, SIMULATED_NVML_ENV, parse

log = logging.getLogger("requester")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
SPI_AUTH_MODES = ("tokenreview", "none")


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def _one_of(allowed: tuple[str, ...]) -> Callable[[str], str]:
    """Like `choices=`, but also checks defaults taken from the environment."""

    def check(text: str) -> str:
        if text.lower() not in allowed:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(allowed)}")
        return text.lower()

    return check


def parse_args(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> argparse.Namespace:
    """The flags, each variable they default to read from `environ` (a container's, in a simulation)."""

    def env(name: str, default: str) -> str:
        return environ.get(name) or default

    parser = argparse.ArgumentParser(
        prog="python -m requester",
        description="The process in a server-requesting Pod: reports its GPUs, serves the readiness "
        "that the dual-pods controller sets, and proxies the OpenAI API to the bound model server.",
    )
    version.add_argument(parser)
    parser.add_argument(
        "--host", default=env("POD_IP", "0.0.0.0"), help="address the servers bind (env POD_IP; default: all)"
    )
    parser.add_argument(
        "--spi-port",
        type=_port,
        default=env("SPI_PORT", str(spi.DEFAULT_PORT)),
        help=f"SPI and /metrics port (env SPI_PORT; default {spi.DEFAULT_PORT})",
    )
    parser.add_argument(
        "--probes-port",
        type=_port,
        default=env("PROBES_PORT", str(probes.DEFAULT_PORT)),
        help=f"/ready port (env PROBES_PORT; default {probes.DEFAULT_PORT})",
    )
    parser.add_argument(
        "--proxy-port",
        type=_port,
        default=env("PROXY_PORT", str(proxy.DEFAULT_PORT)),
        help=f"the OpenAI API proxy's port (env PROXY_PORT; default {proxy.DEFAULT_PORT}, as FMA 0.7)",
    )
    parser.add_argument(
        "--hold-timeout",
        type=_seconds,
        default=env("REQUESTER_HOLD_TIMEOUT", "60"),
        help="seconds the proxy holds a request while not ready before answering 503 "
        "(env REQUESTER_HOLD_TIMEOUT; default 60)",
    )
    parser.add_argument(
        "--proxy-dial-timeout",
        type=_seconds,
        default=env("REQUESTER_PROXY_DIAL_TIMEOUT", "10"),
        help="seconds the proxy tries to connect to the model server before answering 502 "
        "(env REQUESTER_PROXY_DIAL_TIMEOUT; default 10, as FMA 0.7)",
    )
    parser.add_argument(
        "--gpu-source",
        type=_one_of(tuple(SourceChoice)),
        default=env("REQUESTER_GPU_SOURCE", SourceChoice.AUTO),
        help=f"nvml, env (fake: the UUIDs in {ENV_NAME}, for machines without GPUs), or auto: NVML when it "
        "initializes, else env (env REQUESTER_GPU_SOURCE; default auto)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=env("REQUESTER_SHUTDOWN_TIMEOUT", "60"),
        help="seconds requests in flight get after SIGTERM (env REQUESTER_SHUTDOWN_TIMEOUT; default 60, as FMA)",
    )
    parser.add_argument(
        "--log-level",
        type=_one_of(LOG_LEVELS),
        default=env("REQUESTER_LOG_LEVEL", "info"),
        help="(env REQUESTER_LOG_LEVEL; default info)",
    )
    log_format.add_argument(parser, default="json", env="REQUESTER_LOG_FORMAT")
    parser.add_argument(
        "--pod-name",
        default=env("POD_NAME", socket.gethostname()),
        help="name every log line carries (env POD_NAME; default: the host name, which is the Pod's name)",
    )
    parser.add_argument(
        "--spi-auth",
        type=_one_of(SPI_AUTH_MODES),
        default=env("REQUESTER_SPI_AUTH", "tokenreview"),
        help="tokenreview: the SPI's state-changing routes need the controller's ServiceAccount token, checked "
        "with a TokenReview; none: open, as FMA's (env REQUESTER_SPI_AUTH; default tokenreview)",
    )
    parser.add_argument(
        "--trusted-controllers",
        default=env("REQUESTER_TRUSTED_CONTROLLERS", DEFAULT_TRUSTED_CONTROLLERS),
        help="comma-separated ServiceAccounts whose tokens may change this requester: NAME (in the Pod's "
        "namespace) or NAMESPACE/NAME, `*` matching any characters (env REQUESTER_TRUSTED_CONTROLLERS; "
        f"default {DEFAULT_TRUSTED_CONTROLLERS}: the chart's controller ServiceAccount of any release)",
    )
    parser.add_argument(
        "--namespace",
        default=env("POD_NAMESPACE", ""),
        help="the Pod's namespace, part of the token audience (env POD_NAMESPACE; default: the namespace of "
        "the Pod's ServiceAccount)",
    )
    parser.add_argument(
        "--kubeconfig",
        default=env("KUBECONFIG", "") or None,
        help="the API server to review tokens with, outside a Pod (env KUBECONFIG; default: the Pod's "
        "ServiceAccount credentials)",
    )
    args = parser.parse_args(argv)
    if args.spi_auth == "tokenreview":
        args.namespace = own_namespace(args.namespace)
        if args.namespace is None:
            parser.error("--spi-auth tokenreview needs the Pod's namespace: set POD_NAMESPACE or --namespace")
        try:
            args.trusted = TrustedControllers(args.trusted_controllers, args.namespace)
        except ValueError as err:
            parser.error(f"--trusted-controllers: {err}")
    ports = {"SPI": args.spi_port, "probes": args.probes_port, "proxy": args.proxy_port}
    if len(set(ports.values())) < len(ports):
        parser.error(f"the SPI, probes and proxy ports must differ ({', '.join(f'{k} {v}' for k, v in ports.items())})")
    return args


def _exit_before_serving(signum: int, frame: FrameType | None) -> None:
    """SIGTERM during start-up: nothing to drain. As PID 1 of a container, an unhandled one would be ignored."""
    sys.exit(0)


def spi_auth(args: argparse.Namespace) -> SpiAuth:
    if args.spi_auth == "none":
        log.warning("the SPI is open: anyone who reaches it can change this requester (--spi-auth none)")
        return OpenSpi()
    audience = requester_audience(args.namespace, args.pod_name)
    log.info("the SPI's state-changing routes need a controller token",
             extra={"audience": audience, "trusted": list(args.trusted.patterns)})  # fmt: skip
    return TokenReviewAuth(audience, args.trusted, review_api(args.kubeconfig))


def build_listeners(
    args: argparse.Namespace,
    gpus: GpuSource,
    metrics: RequesterMetrics,
    readiness: Readiness,
    relay: LogRelay,
    auth: SpiAuth,
) -> dict[str, Listener]:
    """The three servers; the SPI sets the readiness bit and the proxy's target, the other two read them."""
    target = ProxyTarget()
    upstream = Upstream(target, args.proxy_dial_timeout)
    background = Background()  # the proxy's own calls to the model server
    limits = BackendLimits(target, upstream, background)
    return {
        "spi": Listener(spi.build_spi_app(gpus, readiness, relay, metrics, target, limits, auth), args.spi_port),
        "probes": Listener(probes.build_probes_app(readiness, metrics), args.probes_port),
        "proxy": Listener(
            proxy.build_proxy_app(target, upstream, limits, readiness, metrics, args.hold_timeout, background),
            args.proxy_port,
            cancel_on_disconnect=True,
        ),
    }


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, _exit_before_serving)
    args = parse_args(argv)
    log_format.configure("requester", args.log_level, args.log_format, requester=args.pod_name)
    process_started = process_start()
    try:
        gpus = discover(
            SourceChoice(args.gpu_source),
            parse(os.environ.get(ENV_NAME)),
            simulated_nvml=os.environ.get(SIMULATED_NVML_ENV),
        )
    except GpuDiscoveryError as err:
        log.error("no usable GPU source", extra={"error": str(err)})
        sys.exit(2)
    if gpus.uuids:
        log.info("got GPU UUIDs", extra={"source": gpus.name, "uuids": list(gpus.uuids)})
    else:
        log.error("no GPUs found; the accelerator queries will answer 500", extra={"source": gpus.name})
    metrics = RequesterMetrics()
    metrics.gpus.set(len(gpus.uuids))
    readiness = Readiness(metrics, process_started)
    auth = spi_auth(args)
    listeners = build_listeners(args, gpus, metrics, readiness, LogRelay(sys.stdout.buffer), auth)
    try:
        asyncio.run(serve(listeners, args.host, args.shutdown_timeout, auth))
    except OSError as err:
        log.error("cannot serve", extra={"host": args.host, "error": str(err)})
        sys.exit(1)
    finally:
        gpus.close()
    log.info("stopped")


if __name__ == "__main__":
    main()
