"""`python -m launcher`: preload the model-server runtime, then serve the launcher API."""

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from aiohttp import web

from api import log_format, version
from api.keys import LAUNCHER_PORT, SIMULATED_NVML_ENV
from api.token_file import DEFAULT_GRACE_SECONDS, TokenFile

from . import gpus, output_relay, process_control
from .app import build_app
from .dialect import Dialect
from .engine_defaults import DEFAULT_CPU_KV_CACHE_BYTES
from .events import HISTORY_SIZE, EventLog
from .fork import freeze_heap
from .instance import DEFAULT_RUNTIME
from .instances import InstanceManager, ManagerSettings
from .liveness import LivenessPolicy
from .metrics import LauncherMetrics
from .runtimes import Runtime, StandInRuntime, TransformersRuntime, VllmRuntime

log = logging.getLogger("launcher")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
DEFAULT_LIVENESS = LivenessPolicy()


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        value = kind(raw)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {raw}")
        return value

    parse.__name__ = kind.__name__  # what argparse names in its "invalid ... value" message
    return parse


def parse_args(
    argv: list[str] | None = None, environ: Mapping[str, str] = os.environ, prog: str = "python -m launcher"
) -> argparse.Namespace:
    """The flags, each variable they default to read from `environ` (a container's, in a simulation)."""
    env = environ.get

    def env_flag(name: str) -> bool:
        """A flag's default from the environment (for commands that cannot add flags: FMA's `python3 launcher.py`)."""
        return env(name, "").lower() in ("1", "true", "yes")

    parser = argparse.ArgumentParser(
        prog=prog, description="Preloads vLLM and forks model-server instances on request."
    )
    version.add_argument(parser)
    parser.add_argument("--host", default=env("LAUNCHER_HOST", "0.0.0.0"), help="address to serve on (default: all)")
    parser.add_argument(
        "--port",
        type=int,
        default=int(env("LAUNCHER_PORT", LAUNCHER_PORT)),
        help=f"the API's port (default {LAUNCHER_PORT}, FMA's contract; env LAUNCHER_PORT)",
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=env("LAUNCHER_LOG_LEVEL", "info"),
        help="the launcher's own log level (default info; env LAUNCHER_LOG_LEVEL)",
    )
    log_format.add_argument(parser, env="LAUNCHER_LOG_FORMAT")
    parser.add_argument(
        "--auth-token-file",
        default=env("LAUNCHER_AUTH_TOKEN_FILE"),
        help="file holding the bearer token every route but /health requires; re-read when it changes",
    )
    parser.add_argument(
        "--auth-token-grace-seconds",
        type=float,
        default=DEFAULT_GRACE_SECONDS,
        help="how long a replaced token stays valid after the file changed (callers see a rotation later)",
    )
    parser.add_argument(
        "--mock-gpus",
        nargs="?",
        type=int,
        const=-1,
        default=None,
        metavar="N",
        help="no NVML: take GPUs from the gpu-map ConfigMap when NODE_NAME and NAMESPACE are set, "
        "else GPU-0..GPU-(N-1)",
    )
    parser.add_argument("--mock-gpu-count", type=int, default=8, help="N for a bare --mock-gpus (FMA's flag)")
    parser.add_argument(
        "--stand-in",
        action="store_true",
        default=env_flag("LAUNCHER_STAND_IN"),
        help="fork the stand-in server (the simulation runtime, no model) instead of vLLM (env LAUNCHER_STAND_IN=true)",
    )
    parser.add_argument(
        "--fma-only",
        action="store_true",
        default=env_flag("LAUNCHER_FMA_ONLY"),
        help="serve FMA 0.6.4's launcher API alone, every dualpods addition off (env LAUNCHER_FMA_ONLY=true)",
    )
    parser.add_argument(
        "--verify-wakes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="check every wake of an instance against a probe recorded at its first ready, before it is reported "
        "awake; an instance's own verify_wakes wins (off with --fma-only)",
    )
    parser.add_argument(
        "--zygote",
        action=argparse.BooleanOptionalAction,
        default=env("LAUNCHER_ZYGOTE", "true").lower() not in ("0", "false", "no"),
        help="fork instances from a pre-initialised child per runtime (faster starts); --no-zygote forks them "
        "from the launcher itself (env LAUNCHER_ZYGOTE=false)",
    )
    parser.add_argument(
        "--stop-grace-seconds",
        type=float,
        default=10.0,
        help="how long a stopped instance gets between SIGTERM and SIGKILL (default 10)",
    )
    parser.add_argument(
        "--watch-history",
        type=_positive(int),
        default=HISTORY_SIZE,
        help="events kept for watchers resuming with ?since=",
    )
    liveness = parser.add_argument_group(
        "liveness", "after its first ready, an instance whose /health fails this many times in a row is killed"
    )
    liveness.add_argument(
        "--health-interval-seconds",
        type=_positive(float),
        default=DEFAULT_LIVENESS.health_interval_s,
        help=f"seconds between two probes of an instance's /health (default {DEFAULT_LIVENESS.health_interval_s:g})",
    )
    liveness.add_argument(
        "--health-timeout-seconds",
        type=_positive(float),
        default=DEFAULT_LIVENESS.health_timeout_s,
        help=f"how long one probe waits for an answer (default {DEFAULT_LIVENESS.health_timeout_s:g})",
    )
    liveness.add_argument(
        "--health-failure-threshold",
        type=_positive(int),
        default=DEFAULT_LIVENESS.failure_threshold,
        help=f"failed probes in a row that kill the instance (default {DEFAULT_LIVENESS.failure_threshold})",
    )
    parser.add_argument(
        "--backend-timeout-seconds",
        type=_positive(float),
        default=ManagerSettings.backend_timeout_seconds,
        help="the most a sleep or wake forwarded to an instance may take (one that hangs fails sooner)",
    )
    parser.add_argument(
        "--cpu-kv-cache-bytes",
        type=int,
        default=DEFAULT_CPU_KV_CACHE_BYTES,
        help="KV cache of an instance on a CPU when its options do not size it",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="instance logs and temp files (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    if args.mock_gpus == -1:
        args.mock_gpus = args.mock_gpu_count
    return args


def read_token(path: str | None, grace_seconds: float) -> TokenFile | None:
    """The token every route but /health requires, followed as its file changes (a rotated Secret)."""
    if path is None:
        return None
    token = TokenFile(Path(path), grace_seconds=grace_seconds)
    if not token.current():
        sys.exit(f"launcher: the auth token file {path} is missing or empty")
    return token


def make_runtimes(args: argparse.Namespace) -> dict[str, Runtime]:
    """The runtimes instances may ask for (E4): those installed here; the stand-in simulates all of them.

    vLLM is the launcher's reason to exist, so without it the launcher does not start; without the
    transformers runtime it serves vLLM alone, and an instance asking for that runtime gets a 400."""
    if args.stand_in:
        standin = StandInRuntime()
        return {"vllm": standin, "transformers": standin}
    runtimes: dict[str, Runtime] = {}
    for runtime in (VllmRuntime(), TransformersRuntime()):
        missing = runtime.missing_modules()
        if not missing:
            runtimes[runtime.name] = runtime
            continue
        problem = f"the {runtime.name} runtime needs {', '.join(missing)}, which is not installed"
        if runtime.name == DEFAULT_RUNTIME:
            sys.exit(f"launcher: {problem}; {runtime.install_hint}")
        log.warning("%s: instances asking for it are refused; %s", problem, runtime.install_hint)
    return runtimes


def main(argv: list[str] | None = None, prog: str = "python -m launcher") -> None:
    """Also FMA's `python3 launcher.py` (`fma_compat`), which takes the same arguments."""
    args = parse_args(argv, prog=prog)
    log_format.configure("launcher", args.log_level, args.log_format)
    output_relay.configure(args.log_format)
    token = read_token(args.auth_token_file, args.auth_token_grace_seconds)
    process_control.become_subreaper()
    runtimes = make_runtimes(args)
    metrics = LauncherMetrics()
    started = time.monotonic()
    for runtime in {id(r): r for r in runtimes.values()}.values():
        log.info("preloading the %s runtime", runtime.name)
        runtime.preload()
    freeze_heap()  # what every fork inherits, left out of its garbage collections
    preload_seconds = time.monotonic() - started
    metrics.preload_seconds.set(preload_seconds)
    log.info("preloaded %s in %.1f s", ", ".join(sorted(runtimes)), preload_seconds)

    own_state_dir = args.state_dir is None
    state_dir: Path = Path(tempfile.mkdtemp(prefix="dualpods-launcher-")) if own_state_dir else args.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    dialect = Dialect(fma_only=args.fma_only)
    if dialect.fma_only:
        log.info("serving FMA's launcher API alone (--fma-only): no sleep/wake routes, events or fields of dualpods")
    inventory = gpus.inventory(
        args.mock_gpus, os.environ.get("NODE_NAME"), os.environ.get("NAMESPACE"), os.environ.get(SIMULATED_NVML_ENV)
    )
    log.info("GPUs come from %s", inventory.source)
    settings = ManagerSettings(
        host=args.host,
        port=args.port,
        state_dir=state_dir,
        stop_grace_seconds=args.stop_grace_seconds,
        cpu_kv_cache_bytes=args.cpu_kv_cache_bytes,
        liveness=LivenessPolicy(
            args.health_interval_seconds, args.health_timeout_seconds, args.health_failure_threshold
        ),
        backend_timeout_seconds=args.backend_timeout_seconds,
        dialect=dialect,
        verify_wakes=args.verify_wakes and not dialect.fma_only,
        zygote=args.zygote,
    )
    manager = InstanceManager(runtimes, inventory, metrics, EventLog(args.watch_history), settings)
    app = build_app(manager, token, dialect)

    async def on_start(app: web.Application) -> None:
        manager.start_forker()
        inventory.read_early()

    app.on_startup.append(on_start)
    try:
        web.run_app(app, host=args.host, port=args.port, print=None, access_log=None, shutdown_timeout=15)
    finally:
        if own_state_dir:
            shutil.rmtree(state_dir, ignore_errors=True)
        log.info("launcher stopped")


if __name__ == "__main__":
    main()
