"""Connecting to the API server: in-cluster credentials in a Pod, else a kubeconfig."""

import functools
from typing import Any

from kubernetes_asyncio import client, config

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
