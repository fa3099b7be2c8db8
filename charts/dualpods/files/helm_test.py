"""`helm test RELEASE`: check an installed release from inside the cluster, with Python's standard library only.

The chart runs this file in a Pod (templates/tests/controllers.yaml) with its own ServiceAccount, which may list
Pods and read the controllers' leader Leases in the release's namespace, nothing else. It checks what a platform
engineer would look at first: the CRDs are served; every enabled controller has Ready replicas, each answering
`/healthz` and `/metrics` on its Pod address; with several replicas, the leader Lease is held by one of them.
Configuration comes from the environment the template sets (CHECK_COMPONENTS: `name:replicas:port:lease,...`).
"""

import json
import os
import ssl
import sys
import time
import urllib.parse
import urllib.request
from typing import Any

ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
GROUP_VERSION = "fma.llm-d.ai/v1alpha1"
PLURALS = {"inferenceserverconfigs", "launcherconfigs", "launcherpopulationpolicies"}
WAIT_SECONDS = 120.0


class Api:
    """GETs against the API server with the Pod's ServiceAccount."""

    def __init__(self) -> None:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        self.base = f"https://{host}:{port}"
        with open(f"{ACCOUNT}/token") as token:
            self.headers = {"Authorization": f"Bearer {token.read().strip()}"}
        self.tls = ssl.create_default_context(cafile=f"{ACCOUNT}/ca.crt")

    def get(self, path: str) -> Any:
        request = urllib.request.Request(self.base + path, headers=self.headers)
        with urllib.request.urlopen(request, context=self.tls, timeout=10) as response:
            return json.load(response)


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode(errors="replace")
    except OSError as error:
        return 0, str(error)


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def check_crds(api: Api) -> list[str]:
    served = {resource["name"] for resource in api.get(f"/apis/{GROUP_VERSION}")["resources"]}
    missing = sorted(PLURALS - served)
    return [f"{GROUP_VERSION} does not serve {', '.join(missing)}: are the CRDs installed?"] if missing else []


def check_component(api: Api, namespace: str, release: str, spec: str) -> list[str]:
    """Problems of one controller (`name:replicas:port:lease`); waits for its replicas to be Ready first."""
    name, replicas, port, lease = spec.split(":")
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component={name}"
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        listed = api.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={urllib.parse.quote(selector)}")
        pods = [p for p in listed["items"] if ready(p) and not p["metadata"].get("deletionTimestamp")]
        if len(pods) >= int(replicas) or time.monotonic() > deadline:
            break
        time.sleep(2)
    problems = [] if len(pods) >= int(replicas) else [f"{name}: {len(pods)} of {replicas} replicas Ready"]
    for pod in pods:
        address = f"http://{pod['status']['podIP']}:{port}"
        status, _ = http_get(f"{address}/healthz")
        if status != 200:
            problems.append(f"{name} {pod['metadata']['name']}: GET /healthz answered {status or 'nothing'}")
        status, text = http_get(f"{address}/metrics")
        if status != 200 or "# HELP" not in text:
            problems.append(f"{name} {pod['metadata']['name']}: GET /metrics answered {status or text}")
    if int(replicas) > 1:
        holder = api.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}")["spec"]
        if holder.get("holderIdentity") not in {p["metadata"]["name"] for p in pods}:
            problems.append(f"{name}: the Lease {lease} is held by {holder.get('holderIdentity')!r}, no Ready replica")
    print(f"{name}: {len(pods)} Ready replica(s) checked")
    return problems


def main() -> int:
    api = Api()
    namespace, release = os.environ["NAMESPACE"], os.environ["RELEASE"]
    problems = check_crds(api)
    print(f"CRDs: {'served' if not problems else 'missing'}")
    for spec in filter(None, os.environ.get("CHECK_COMPONENTS", "").split(",")):
        problems += check_component(api, namespace, release, spec)
    for problem in problems:
        print(f"FAILED: {problem}")
    print("all checks passed" if not problems else f"{len(problems)} check(s) failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
