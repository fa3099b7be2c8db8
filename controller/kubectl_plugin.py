"""`kubectl dualpods status`: what is hot where, per node and GPU and per model, from the launcher Pods'
instance summaries (controller/fleet_view.py), and the models' warm pools. kubectl runs `kubectl-dualpods` from
PATH as its `dualpods` plugin; the wheel installs it with the `controller` extra. It reads Pods, the gpu-map
ConfigMap and InferenceServerConfigs (`list` in the namespace, or cluster-wide with -A; without the right to list
InferenceServerConfigs, or without their CRD, it shows no pools) and calls no launcher, so it works from anywhere
kubectl does.
"""

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client, config

from api import keys, version
from api.crds import GROUP, VERSION, InferenceServerConfig
from controller import pods
from controller.fleet_view import as_json, as_table, fleet_status
from kube.informer import Obj


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


async def _objects(api: client.ApiClient, namespace: str | None) -> tuple[list[Obj], list[Obj], list[Obj], list[Obj]]:
    """The launcher Pods, the gpu-map ConfigMaps, the requester Pods and the InferenceServerConfigs, as plain
    objects."""
    core = client.CoreV1Api(api)
    gpu_map = {"field_selector": f"metadata.name={keys.GPU_MAP_CONFIGMAP}"}
    calls: list[Any]
    if namespace is None:
        calls = [core.list_pod_for_all_namespaces(), core.list_config_map_for_all_namespaces(**gpu_map)]
    else:
        calls = [core.list_namespaced_pod(namespace), core.list_namespaced_config_map(namespace, **gpu_map)]
    listed, configmaps, iscs = await asyncio.gather(*calls, _iscs(api, namespace))
    found = [api.sanitize_for_serialization(p) for p in listed.items]
    launchers = [p for p in found if pods.is_launcher(p)]
    requesters = [p for p in found if pods.is_requester(p)]
    return launchers, [api.sanitize_for_serialization(c) for c in configmaps.items], requesters, iscs


async def _iscs(api: client.ApiClient, namespace: str | None) -> list[Obj]:
    """The InferenceServerConfigs (their warm pools); none where the user may not list them or the CRD is absent:
    the rest of the status does not need them."""
    objects = client.CustomObjectsApi(api)
    plural = InferenceServerConfig.RESOURCE.plural
    try:
        if namespace is None:
            listed = await objects.list_cluster_custom_object(GROUP, VERSION, plural)
        else:
            listed = await objects.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
    except client.ApiException as err:
        if err.status in (403, 404):
            return []
        raise
    return list(listed.get("items") or [])


async def _status(args: argparse.Namespace) -> str:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=args.kubeconfig, context=args.context, client_configuration=configuration)
    namespace = None if args.all_namespaces else args.namespace or _context_namespace(args.kubeconfig, args.context)
    async with client.ApiClient(configuration) as api:
        launchers, gpu_maps, requesters, iscs = await _objects(api, namespace)
    fleet = fleet_status(launchers, gpu_maps, requesters, iscs)
    return as_json(fleet) if args.output == "json" else as_table(fleet, datetime.now(UTC))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        print(asyncio.run(_status(args)))
    except (client.ApiException, config.ConfigException, OSError) as err:
        sys.exit(f"kubectl dualpods: {err}")


if __name__ == "__main__":
    main()
