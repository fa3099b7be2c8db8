"""Connecting to the API server: in-cluster credentials in a Pod, else a kubeconfig."""

import functools
import json
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from api.crds import GROUP, VERSION, CustomResource
from controller.informer import ListWatchFunction


async def api_client(kubeconfig: str | None) -> client.ApiClient:
    if kubeconfig is None:
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except config.ConfigException:
            pass
    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return client.ApiClient(configuration)


def custom_objects(api: client.ApiClient, namespace: str, kind: type[CustomResource]) -> ListWatchFunction:
    """List/watch one of our custom resources in a namespace, for an Informer."""
    objects = client.CustomObjectsApi(api)
    bound: Any = functools.partial(
        objects.list_namespaced_custom_object, GROUP, VERSION, namespace, kind.RESOURCE.plural
    )
    return bound  # type: ignore[no-any-return]


def refusal(err: ApiException) -> tuple[str, str]:
    """The API server's Status answer of a refused call: its machine-readable `reason` (e.g. Invalid,
    Forbidden, Conflict) and its message. PodWriter puts an answer it read itself in `reason`."""
    text = err.body or err.reason or ""
    try:
        status = json.loads(text)
        return str(status.get("reason") or ""), str(status.get("message") or text)
    except (ValueError, TypeError, AttributeError):
        return "", str(text)
