"""`python -m controller dual-pods|populator --namespace NS ...`: run one of the two controllers.

Both serve Prometheus metrics on --metrics-port and, with --leader-elect, hold a Lease so that several
replicas can run with one active (E11). A replica that loses the Lease exits, and Kubernetes restarts
it as a follower.
"""

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from api import keys, log_format, version
from api.token_file import TokenFile
from controller.dualpods.drains import DEFAULT_TIMEOUT_S
from controller.dualpods.phases import LAUNCHER_START_BUDGET
from controller.endpoint import serve_metrics
from controller.launcher_token import ensure_launcher_token
from kube.client import DEFAULT_BURST, DEFAULT_QPS, ApiLimits, api_client
from kube.gc_thresholds import tune_for_caches
from kube.leader import LeaderElection, LostLeadership

if TYPE_CHECKING:
    from controller.dualpods.requester_tokens import RequesterTokens

log = logging.getLogger("controller")
# Reconciles at once: they mostly wait on the API server and on launchers (docs/benchmarks.md, Scale).
DEFAULT_WORKERS = 16
Run = Callable[[], Awaitable[None]]


async def launcher_token(api: client.ApiClient, args: argparse.Namespace) -> TokenFile | None:
    """The launchers' bearer token as this controller sends it: the mounted Secret's file, followed as the
    kubelet updates it; with --create-launcher-token-secret the Secret is made first when it does not exist,
    and its token serves until the kubelet has filled the (optional) volume."""
    made = ""
    if args.create_launcher_token_secret and args.launcher_token_secret:
        try:
            made = await ensure_launcher_token(api, args.namespace, args.launcher_token_secret)
        except ApiException as error:
            sys.exit(
                f"cannot read or create the launcher token Secret {args.namespace}/{args.launcher_token_secret}: "
                f"{error.status} {error.reason} (the controller needs `get` on it and `create` on secrets)"
            )
    if not args.launcher_token_file:
        return None
    token = TokenFile(Path(args.launcher_token_file), fallback=made)
    if not token.current():
        log.error("no launcher token in %s: launchers will refuse every call until it appears", token.path)
    return token


def build_dual_pods(
    api: client.ApiClient, args: argparse.Namespace, registry: CollectorRegistry, token: TokenFile | None
) -> Callable[[], Awaitable[None]]:
    from controller.dualpods.controller import DualPodsOptions, run_dual_pods
    from controller.dualpods.placement.webhook import Endpoint

    if args.placement_webhook and args.metrics_host in ("0.0.0.0", "::", ""):
        sys.exit("--placement-webhook needs this replica's own address (POD_IP, or --metrics-host): the API server "
                 "calls the webhook there")  # fmt: skip
    options = DualPodsOptions(
        workers=args.num_workers,
        launcher_token=token,
        launcher_token_secret=args.launcher_token_secret,
        launcher_runtime_class=args.launcher_runtime_class,
        sleeper_limit=args.sleeper_limit,
        requester_tokens=requester_tokens(api, args),
        drain_rewarm_timeout_s=args.drain_rewarm_timeout,
        launcher_start_budget_s=args.launcher_start_budget,
        placement=Endpoint(args.metrics_host, args.placement_port, args.placement_webhook)
        if args.placement_webhook
        else None,
        placement_default_on=args.placement_default == keys.PLACEMENT_PREFER_SLEEPER,
    )
    return functools.partial(run_dual_pods, api, args.namespace, options, registry)


def requester_tokens(api: client.ApiClient, args: argparse.Namespace) -> "RequesterTokens | None":
    """E15: the controller's credential towards requesters, tokens of --requester-token-service-account
    (bound to this replica's Pod when POD_NAME and POD_UID say which it is)."""
    from controller.dualpods.requester_tokens import BoundPod, RequesterTokens

    if not args.requester_token_service_account:
        log.warning("--requester-token-service-account is not set: calls that change requesters carry no "
                    "credential, and requesters that authenticate them (the default) will refuse them")  # fmt: skip
        return None
    pod_name, pod_uid = os.environ.get("POD_NAME"), os.environ.get("POD_UID")
    bound = BoundPod(pod_name, pod_uid) if pod_name and pod_uid else None
    return RequesterTokens(api, args.namespace, args.requester_token_service_account, bound)


def build_populator(
    api: client.ApiClient, args: argparse.Namespace, registry: CollectorRegistry, token: TokenFile | None
) -> Callable[[], Awaitable[None]]:
    from controller.populator import PopulatorOptions, run_populator

    options = PopulatorOptions(
        workers=args.num_workers,
        expectation_timeout=args.expectation_timeout,
        stuck_scheduling_threshold=args.stuck_scheduling_threshold,
        stuck_starting_threshold=args.stuck_starting_threshold,
        launcher_token_secret=args.launcher_token_secret,
        launcher_runtime_class=args.launcher_runtime_class,
        launcher_token=token,
    )
    return functools.partial(run_populator, api, args.namespace, options, registry)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m controller", description=__doc__)
    version.add_argument(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    dual_pods = commands.add_parser("dual-pods", help="bind server-requesting Pods to server-providing Pods")
    populator = commands.add_parser("populator", help="keep launcher Pods populated per LauncherPopulationPolicy")
    for command, default_workers in ((dual_pods, DEFAULT_WORKERS), (populator, DEFAULT_WORKERS)):
        command.add_argument("-n", "--namespace", required=True, help="the namespace the controller works in")
        command.add_argument("--kubeconfig", help="default: in-cluster credentials, else ~/.kube/config")
        command.add_argument("--leader-elect", action="store_true", help="hold a Lease; run several replicas")
        command.add_argument("--leader-election-id", help="the Lease's name (default: dualpods-<command>)")
        command.add_argument(
            "--metrics-host",
            default=os.environ.get("POD_IP", "0.0.0.0"),
            help="address /metrics is served on (default: the Pod's address from POD_IP, else all)",
        )
        command.add_argument("--metrics-port", type=int, default=8002, help="port of /metrics (default 8002, FMA's)")
        command.add_argument("--num-workers", type=int, default=default_workers, help="reconciles run at once")
        command.add_argument(
            "--kube-api-qps",
            type=float,
            default=DEFAULT_QPS,
            help=f"requests per second to the API server, at most, on average (0: no limit; default {DEFAULT_QPS:g})",
        )
        command.add_argument(
            "--kube-api-burst",
            type=int,
            default=DEFAULT_BURST,
            help=f"requests to the API server at once beyond --kube-api-qps (default {DEFAULT_BURST})",
        )
        command.add_argument(
            "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default info"
        )
        log_format.add_argument(command)
        command.add_argument("--launcher-token-secret", help="Secret with the launchers' bearer token (key `token`)")
        command.add_argument(
            "--create-launcher-token-secret",
            action="store_true",
            help="create --launcher-token-secret with a random token at start-up when it does not exist",
        )
        command.add_argument(
            "--launcher-runtime-class",
            help="RuntimeClass of the launcher Pods this controller creates whose LauncherConfig names none, "
            "e.g. nvidia or nvidia-legacy where the GPU Operator injects GPUs through CDI (default: none)",
        )
        command.add_argument(
            "--launcher-token-file", help="file holding the launchers' bearer token (re-read when it changes)"
        )
    dual_pods.add_argument(
        "--requester-token-service-account",
        help="E15: the ServiceAccount (in --namespace; the controller's own) whose short-lived tokens, one per "
        "requester audience, authenticate the calls that change requesters; the controller needs `create` on "
        "its serviceaccounts/token (default: none, and such calls carry no credential)",
    )
    dual_pods.add_argument(
        "--sleeper-limit", type=int, default=1, help="direct providers that may sleep on one GPU (FMA's default: 1)"
    )
    dual_pods.add_argument(
        "--launcher-start-budget",
        type=float,
        default=LAUNCHER_START_BUDGET.seconds,
        help="seconds a requester's bound launcher may not answer (its image pulled, vLLM imported) before the "
        "requester's status and an Event say so (default %(default)g)",
    )
    dual_pods.add_argument(
        "--drain-rewarm-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a launcher on a cordoned node is kept from eviction (by the warm label its "
        "PodDisruptionBudget selects) while its sleepers are copied to other nodes (default %(default)g)",
    )
    dual_pods.add_argument(
        "--placement-webhook",
        metavar="CONFIGURATION",
        help="E22: serve sleeper-aware placement as the MutatingWebhookConfiguration of this name (its entry "
        "placement.dual-pods.llm-d.ai), which the leader points at itself (default: not served)",
    )
    dual_pods.add_argument(
        "--placement-port", type=int, default=9443, help="port of the placement webhook (default %(default)s)"
    )
    dual_pods.add_argument(
        "--placement-default",
        choices=[keys.PLACEMENT_OFF, keys.PLACEMENT_PREFER_SLEEPER],
        default=keys.PLACEMENT_OFF,
        help="placement of the requesters that do not say (nor their InferenceServerConfig) (default %(default)s)",
    )
    populator.add_argument(
        "--expectation-timeout",
        type=float,
        default=5.0,
        help="seconds to wait for the cache to show a create or delete before listing from the API server "
        "(default 5, FMA's)",
    )
    populator.add_argument(
        "--stuck-scheduling-threshold",
        type=float,
        default=120.0,
        help="seconds an unscheduled launcher may wait before it is labelled stuck (default 120, FMA's)",
    )
    populator.add_argument(
        "--stuck-starting-threshold",
        type=float,
        default=450.0,
        help="seconds a scheduled launcher may take to become Ready before it is labelled stuck (default 450, FMA's)",
    )
    args = parser.parse_args(argv)
    args.build = build_dual_pods if args.command == "dual-pods" else build_populator
    return args


async def run(args: argparse.Namespace) -> None:
    registry = CollectorRegistry()
    api = await api_client(args.kubeconfig, ApiLimits(args.kube_api_qps, args.kube_api_burst), registry)
    try:
        async with serve_metrics(registry, args.metrics_host, args.metrics_port):
            controller = args.build(api, args, registry, await launcher_token(api, args))
            if args.leader_elect:
                identity = os.environ.get("POD_NAME") or socket.gethostname()
                lease = args.leader_election_id or f"dualpods-{args.command}"
                await LeaderElection(api, args.namespace, lease, identity).run(controller)
            else:
                await controller()
    finally:
        await api.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    log_format.configure("controller", args.log_level, args.log_format)
    tune_for_caches()
    loop = asyncio.new_event_loop()
    task = loop.create_task(run(args))
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    try:
        loop.run_until_complete(task)
    except asyncio.CancelledError:
        log.info("%s controller stopped", args.command)
    except LostLeadership as lost:
        log.error("%s; exiting so that Kubernetes restarts this replica", lost)
        sys.exit(1)
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


if __name__ == "__main__":
    main()
