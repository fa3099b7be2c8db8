"""E15 end to end: the hijack of issue 11 fails in the chart's setup, and the controller's own calls work.

A requester whose ISC does not exist yet stays unbound; an outsider (this test, on the loopback network)
points its proxy at 127.0.250.1:9999 and says become-ready, as in the issue: both are refused and change
nothing. Then the ISC appears, the controller binds the requester, and the proxy serves the real
instance; an outsider's become-unready on the bound requester is refused too and the Pod stays Ready.
The requester Pods run as the namespace's `default` ServiceAccount, as FMA's manifests do; the chart
lets it review tokens. The stand-in answers for the model server (exact timings are not the point here).
"""

import json
from typing import Any

import aiohttp

from api import keys
from api.requester import BECOME_READY_PATH, BECOME_UNREADY_PATH, PROXY_CONFIG_PATH
from controller import pods
from e2e.dualpods_env import DualPodsEnv, Obj
from e2e.waiting import wait_for

RS = "victim"
ISC = "isc-real"
SPI_PORT, PROBES_PORT, PROXY_PORT = 8081, 8080, 8082
HIJACK = {"address": "127.0.250.1", "port": 9999}


async def call(method: str, url: str, body: object = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.request(method, url, json=body) as response:
        text = await response.text()
        return response.status, (await response.json()) if response.content_type == "application/json" else text


def spi(requester: Obj, path: str) -> str:
    return f"http://{requester['status']['podIP']}:{SPI_PORT}{path}"


async def test_an_outsider_cannot_hijack_or_deny_a_requester(env: DualPodsEnv) -> None:
    await env.create_launcher_config("lc", max_instances=1, launcher_args=["--stand-in"])
    await env.create_population_policy("keep-one", "lc", count=1)
    await env.create_requesters(RS, ISC)  # its ISC does not exist yet: it stays unbound

    async def serving_unbound() -> Obj:
        found = await env.requesters(RS)
        return found[0] if found and pods.pod_ip(found[0]) and keys.DUAL_LABEL not in pods.labels(found[0]) else {}

    victim = await wait_for(serving_unbound, what="an unbound requester with an IP", within=60)

    async def answering() -> bool:
        try:
            return (await call("GET", spi(victim, "/v1/dual-pods/accelerators")))[0] == 200
        except aiohttp.ClientError:
            return False

    await wait_for(answering, what="the requester's SPI", within=60)
    for method, path, body in [("PUT", PROXY_CONFIG_PATH, HIJACK), ("POST", BECOME_READY_PATH, None)]:
        status, answer = await call(method, spi(victim, path), body)
        assert status == 401, (method, path, answer)
        assert answer["reason"] == "Unauthenticated", answer
    assert (await call("GET", spi(victim, PROXY_CONFIG_PATH)))[0] == 404, "the proxy has no target"
    ready_url = f"http://{victim['status']['podIP']}:{PROBES_PORT}/ready"
    assert (await call("GET", ready_url))[0] == 503
    assert not pods.is_ready(await env.pod(victim["metadata"]["name"]))

    # The real bind: the controller's calls carry its token and are accepted.
    await env.create_isc(ISC, "lc", port=8005, options="--model real")
    bound = await env.ready_requester(RS)
    assert bound["metadata"]["name"] == victim["metadata"]["name"]
    status, config = await call("GET", spi(bound, PROXY_CONFIG_PATH))
    launcher = await env.launcher_of(bound)
    assert (status, config["address"], config["port"]) == (200, launcher["status"]["podIP"], 8005), config
    completion = {"model": "real", "prompt": "hello", "max_tokens": 3}
    status, answer = await call("POST", f"http://{bound['status']['podIP']}:{PROXY_PORT}/v1/completions", completion)
    assert status == 200, answer
    assert answer["model"] == "real", "the real instance answered"

    pod = await env.core.read_namespaced_pod(bound["metadata"]["name"], env.namespace)
    log = env.cluster.container_log(pod, keys.INFERENCE_SERVER_CONTAINER).splitlines()
    reviewed = [json.loads(line) for line in log if '"controller authenticated"' in line]
    controller = f"system:serviceaccount:{env.namespace}:{env.controllers.release}-fma-controllers"
    assert reviewed, "the controller's calls were reviewed"
    assert {line["user"] for line in reviewed} == {controller}

    # Denial on the bound requester: refused, and it stays Ready.
    status, answer = await call("POST", spi(bound, BECOME_UNREADY_PATH))
    assert (status, answer["reason"]) == (401, "Unauthenticated"), answer
    assert (await call("GET", ready_url))[0] == 200
    assert pods.is_ready(await env.pod(bound["metadata"]["name"]))
