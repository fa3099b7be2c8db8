"""Reports what the Pod's own ServiceAccount may do (image `dualpods/test-whoami`): lists Pods in its
namespace with kubernetes-asyncio's unchanged in-cluster config and prints one JSON line."""

import asyncio
import json
import os

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException


async def main() -> None:
    config.load_incluster_config()
    async with client.ApiClient() as api:
        namespace = os.environ["POD_NAMESPACE"]
        try:
            pods = await client.CoreV1Api(api).list_namespaced_pod(namespace)
            report = {"status": 200, "pods": sorted(p.metadata.name for p in pods.items)}
        except ApiException as error:
            report = {"status": error.status, "reason": error.reason}
        report["host"] = api.configuration.host
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
