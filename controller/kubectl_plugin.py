"""`kubectl dualpods status`: what is hot where, per node and GPU and per model, from the launcher Pods'
instance summaries (controller/fleet_view.py). kubectl runs `kubectl-dualpods` from PATH as its
`dualpods` plugin; the wheel installs it with the `controller` extra. It reads Pods and the gpu-map
ConfigMap (`get`/`list` in the namespace, or cluster-wide with -A) and calls no launcher, so it works from
anywhere kubectl does.
"""

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client, config

from api import keys, version
from controller import pods
from controller.fleet_view import as_json, as_table, fleet_status
from controller.informer import Obj


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kubectl dualpods", description=__doc__.split("\n\n")[0])
    version.add_argument(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status", help="per node and GPU what is serving, asleep, loading or free")
    status.add_argument("-n", "--namespace", help="the namespace (default: the kubeconfig context's)")
    status.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    status.add_argument("-o", "--output", choices=("table", "json"), default="table", help="the output format")
    status.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    status.add_argument("--context", help="the kubeconfig context to use")
    return parser.parse_args(argv)


def _context_namespace(kubeconfig: str | None, context: str | None) -> str:
    contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = next((c for c in contexts if c["name"] == context), active) if context else active
    return str((chosen or {}).get("context", {}).get("namespace") or "default")


async def _objects(api: client.ApiClient, namespace: str | None) -> tuple[list[Obj], list[Obj], list[Obj]]:
    """The launcher Pods, the gpu-map ConfigMaps and the requester Pods, as plain objects."""
    core = client.CoreV1Api(api)
    gpu_map = {"field_selector": f"metadata.name={keys.GPU_MAP_CONFIGMAP}"}
    calls: list[Any]
    if namespace is None:
        calls = [core.list_pod_for_all_namespaces(), core.list_config_map_for_all_namespaces(**gpu_map)]
    else:
        calls = [core.list_namespaced_pod(namespace), core.list_namespaced_config_map(namespace, **gpu_map)]
    listed, configmaps = await asyncio.gather(*calls)
    found = [api.sanitize_for_serialization(p) for p in listed.items]
    launchers = [p for p in found if pods.is_launcher(p)]
    requesters = [p for p in found if pods.is_requester(p)]
    return launchers, [api.sanitize_for_serialization(c) for c in configmaps.items], requesters


async def _status(args: argparse.Namespace) -> str:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=args.kubeconfig, context=args.context, client_configuration=configuration)
    namespace = None if args.all_namespaces else args.namespace or _context_namespace(args.kubeconfig, args.context)
    async with client.ApiClient(configuration) as api:
        launchers, gpu_maps, requesters = await _objects(api, namespace)
    fleet = fleet_status(launchers, gpu_maps, requesters)
    return as_json(fleet) if args.output == "json" else as_table(fleet, datetime.now(UTC))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        print(asyncio.run(_status(args)))
    except (client.ApiException, config.ConfigException, OSError) as err:
        sys.exit(f"kubectl dualpods: {err}")


if __name__ == "__main__":
    main()
