"""The `gpu-map` ConfigMap FMA's direct mode reads: data key = Node name, value = JSON {"<UUID>": index}."""

import json
import logging

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api.keys import GPU_MAP_CONFIGMAP

log = logging.getLogger(__name__)


def gpu_map_data(nodes: dict[str, dict[str, int]]) -> dict[str, str]:
    return {node: json.dumps(mapping, sort_keys=True) for node, mapping in sorted(nodes.items())}


async def publish_gpu_map(core: client.CoreV1Api, namespace: str, nodes: dict[str, dict[str, int]]) -> None:
    """Create or replace `gpu-map` in `namespace` so that it lists exactly `nodes`."""
    body = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=GPU_MAP_CONFIGMAP, namespace=namespace), data=gpu_map_data(nodes)
    )
    try:
        await core.replace_namespaced_config_map(GPU_MAP_CONFIGMAP, namespace, body)
    except ApiException as error:
        if error.status != 404:
            raise
        await core.create_namespaced_config_map(namespace, body)
    log.info("published %s in %s for nodes %s", GPU_MAP_CONFIGMAP, namespace, sorted(nodes))
