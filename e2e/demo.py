"""`make demo`: a real model swap on the loopback cluster, with vLLM on the CPU.

The cluster is up (`make cluster-up`); this installs the Helm chart into a fresh namespace, creates a
LauncherConfig, two InferenceServerConfigs for two tiny models and a requester ReplicaSet per model
(neither pinned to a Node or a GPU: both models opt in to sleeper-aware placement, which steers each new
requester to the GPU holding its model's sleeper), then swaps A -> B -> A -> B by scaling the sets, printing
each step, where the requester was placed and why, how long it took and what the served model answered. The
cluster is left up to look around. With
`--images` (`make demo IMAGES=1`) the components run from the images `make images` builds, as real
containers, instead of from this checkout as local processes. With `--dra` (`make demo DRA=1`, on a cluster
whose Nodes NVIDIA's DRA driver serves: no `nvidia.com/gpu`, a ResourceSlice each) the requesters get their
GPU from a ResourceClaim for one device, the launchers see the Node's GPUs through an admin-access claim, and
the population policy selects the Node by the devices the driver publishes.
"""

import argparse
import asyncio
import json
import time
from pathlib import Path

import openai
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from controller import pods
from controller.dualpods.placement.choice import Result, decided
from e2e.actuation import Actuation, actuate, release
from e2e.cluster.cluster import LoopbackCluster
from e2e.crds import kubectl
from e2e.dra import DRA_NODES, allow_admin_access, create_claim_template
from e2e.dualpods_env import ENFORCE, PROCESSES, RESTRICTED_NAMESPACE, WARN, DualPodsEnv, Images, Obj, built_images
from e2e.kubelet import oci
from e2e.kubelet.dra import DRIVER
from e2e.tiny_model import ensure_tiny_model
from e2e.waiting import wait_for, wait_service_account

MODELS = {"model-a": (1, 8005), "model-b": (2, 8006)}
PLACED = {keys.PLACEMENT_ANNOTATION: keys.PLACEMENT_PREFER_SLEEPER}  # sleeper-aware placement, for both models
PROMPT = "Say hello"


def say(text: str) -> None:
    print(text, flush=True)


def pod_security(images: Images) -> dict[str, str]:
    """The Pod Security level the demo's namespace enforces: "restricted", which the controllers, launchers and
    requesters all meet; from the images the launchers mount the host's model cache (a hostPath, which every level
    but "privileged" forbids: on a real cluster the weights come from a volume of another kind), so that level is
    enforced there and "restricted" only warned about."""
    if images is PROCESSES:
        return RESTRICTED_NAMESPACE
    return {ENFORCE: "privileged", WARN: "restricted"}


async def fresh_namespace(
    cluster: LoopbackCluster, api: client.ApiClient, name: str, work_dir: Path, labels: dict[str, str]
) -> None:
    """The demo's namespace, emptied if an earlier run left one (its requesters unbound first, then the
    controllers uninstalled, so no finalizer is left to hold the namespace's deletion)."""
    core = client.CoreV1Api(api)
    try:
        await core.read_namespace(name)
        await DualPodsEnv(cluster, api, name, work_dir).teardown()
    except ApiException as err:
        if err.status != 404:
            raise
    try:
        await core.delete_namespace(name)
        say(f"  removing the namespace {name} of an earlier run")
    except ApiException as err:
        if err.status != 404:
            raise

    async def created() -> bool:
        try:
            await core.create_namespace({"metadata": {"name": name, "labels": labels}})
        except ApiException as err:
            if err.status == 409:  # still terminating
                return False
            raise
        return True

    await wait_for(created, what=f"namespace {name} created", within=180, interval=1)
    await wait_service_account(core, name)


async def chat(env: DualPodsEnv, replica_set: str, port: int) -> str:
    """An OpenAI chat request to the model the requester's launcher serves."""
    (requester,) = await env.requesters(replica_set)
    launcher = await env.launcher_of(requester)
    url = f"http://{launcher['status']['podIP']}:{port}/v1"
    model = openai.AsyncOpenAI(base_url=url, api_key="unused")
    reply = await model.chat.completions.create(
        model=replica_set, messages=[{"role": "user", "content": PROMPT}], max_tokens=12, temperature=0
    )
    return reply.choices[0].message.content or ""


def placement(requester: Obj) -> str:
    """Where the requester went and why: the placement webhook's decision, and the Node and GPU it landed on."""
    gpus = pods.annotations(requester).get(keys.ACCELERATORS_ANNOTATION)
    landed = f"on Node {requester['spec']['nodeName']}, GPU {gpus}"
    decision = decided(requester)
    if decision is None:
        return f"placed by the scheduler alone {landed}"
    if decision.result is Result.PLACED_ON_SLEEPER:
        return f"{landed}: {decision.result.value}, {decision.why}"
    return f"{landed}, by the scheduler: {decision.result.value}, {decision.why}"


async def step(env: DualPodsEnv, what: str, replica_set: str, timings: list[tuple[str, Actuation]]) -> None:
    say(f"\n{what}")
    actuation = await actuate(env, replica_set, within=600)
    timings.append((what, actuation))
    requester = (await env.requesters(replica_set))[0]
    launcher = await env.launcher_of(requester)
    say(f"  requester {actuation.requester} {placement(requester)}")
    say(f"  bound to {launcher['metadata']['name']}")
    say(f"  container start -> told ready: {actuation.total:6.2f} s   -> Pod Ready: {actuation.pod_ready:6.2f} s")
    answer = await chat(env, replica_set, MODELS[replica_set][1])
    say(f"  {replica_set} answered {answer!r} (random weights: gibberish is expected)")


async def swap(env: DualPodsEnv, from_: str, to: str, what: str, timings: list[tuple[str, Actuation]]) -> None:
    started = time.monotonic()
    await release(env, from_)
    say(f"\n{from_} scaled to 0: its instance is asleep and its launcher unbound ({time.monotonic() - started:.2f} s)")
    await step(env, what, to, timings)


async def hot_where(cluster: LoopbackCluster, namespace: str) -> str:
    """The plugin's table once it shows the last swap (the controller writes the summaries as instances change)."""
    status = ("dualpods", "status", "-n", namespace)

    async def shown() -> bool:
        fleet = json.loads(await kubectl(cluster, *status, "-o", "json"))
        state = {model["model"]: (bool(model["serving"]), bool(model["asleep"])) for model in fleet["models"]}
        return state == {"model-a": (False, True), "model-b": (True, False)}

    await wait_for(shown, what="kubectl dualpods status to show model-b serving and model-a asleep", within=30)
    return await kubectl(cluster, *status)


async def claim_gpus(env: DualPodsEnv) -> str:
    """DRA: the ResourceClaimTemplate of the requesters (one GPU) after the admin-access one of the launchers (every
    GPU of the Node); the name of the latter."""
    await allow_admin_access(env.api, env.namespace)
    await create_claim_template(env.api, env.namespace, "all-gpus", None)
    await create_claim_template(env.api, env.namespace, "one-gpu", 1)
    say("created ResourceClaimTemplates one-gpu (requesters: one device) and all-gpus (launchers: every GPU")
    say(f"of the Node, with admin access; namespace labelled for it). The Node's devices:\n"
        f"{await kubectl(env.cluster, 'get', 'resourceslices', '-o', 'wide')}")  # fmt: skip
    return "all-gpus"


async def run(state_dir: Path, namespace: str, images: Images, dra: bool) -> None:
    cluster = LoopbackCluster(state_dir)
    if not cluster.is_up():
        raise SystemExit(f"no loopback cluster in {state_dir}: run `make cluster-up` first")
    if images is not PROCESSES and not oci.enabled_in(cluster.state_dir / "logs" / "kubelet.log"):
        raise SystemExit("the cluster's kubelet started before podman was installed: `make cluster-down`, then retry")
    say("dualpods demo: fast model swapping on Kubernetes (the loopback cluster), vLLM on the CPU\n")
    say("building two tiny random-weight models offline")
    models = {name: ensure_tiny_model(seed) for name, (seed, _) in MODELS.items()}
    async with await cluster.api_client() as api:
        version = (await client.VersionApi(api).get_code()).git_version
        say(f"the loopback cluster's API server: Kubernetes {version}")
        slices = await client.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.driver={DRIVER}")
        if bool(slices.items) != dra:
            kind, demo = ("device-plugin", "make demo DRA=1") if dra else ("DRA", "make demo")
            raise SystemExit(f"the cluster's Nodes are {kind} Nodes: `make cluster-down`, then `{demo}`")
        labels = pod_security(images)
        await fresh_namespace(cluster, api, namespace, state_dir / "demo", labels)
        env = DualPodsEnv(cluster, api, namespace, state_dir / "demo", images)
        await env.setup()
        say(
            f"installing the Helm chart into namespace {namespace} (controllers run as Pods; Pod Security "
            f"{labels[ENFORCE]!r} enforced)"
        )
        if images is not PROCESSES:
            say(f"  from the images of `make images`: {images.controller}, {images.launcher}, {images.requester}")
        await env.controllers.install(*images.chart_values())
        nodes = await cluster.kubelet.nodes()
        launchers_claim = await claim_gpus(env) if dra else None
        await env.create_launcher_config(
            "demo-launchers", max_instances=2, launcher_args=[], claim_template=launchers_claim
        )
        for name, (_, port) in MODELS.items():
            options = f"--model {images.model(models[name])} --served-model-name {name} --max-model-len 256"
            await env.create_isc(name, "demo-launchers", port=port, options=options, isc_annotations=PLACED)
            await env.create_requesters(name, name, replicas=0, claim_template="one-gpu" if dra else None)
        say(f"created LauncherConfig demo-launchers, InferenceServerConfigs and ReplicaSets {', '.join(MODELS)}")
        gpus = sum(len(node.gpus) for node in nodes)
        say(f"(replicas 0; neither set pinned: {len(nodes)} Nodes, {gpus} GPUs; both ISCs annotated "
            f"{keys.PLACEMENT_ANNOTATION}: {keys.PLACEMENT_PREFER_SLEEPER})")  # fmt: skip

        timings: list[tuple[str, Actuation]] = []
        await step(env, "cold: model-a scaled to 1 — no launcher yet: a launcher Pod is created, it preloads "
                        "vLLM, then forks model-a", "model-a", timings)  # fmt: skip
        await env.create_population_policy(
            "keep-a-launcher", "demo-launchers", count=1, selector=DRA_NODES if dra else None
        )
        say("\ncreated LauncherPopulationPolicy keep-a-launcher: one launcher per GPU node, kept when unbound")
        started = time.monotonic()
        await env.wait_launchers_ready(len(nodes))
        say(f"  its launchers are Ready, vLLM preloaded ({time.monotonic() - started:.1f} s; the swaps wait for it)")
        await swap(env, "model-a", "model-b", "warm: model-b scaled to 1 — a running launcher, new instance", timings)
        await swap(env, "model-b", "model-a", "hot: model-a scaled to 1 — its sleeping instance is woken", timings)
        await swap(env, "model-a", "model-b", "hot: model-b scaled to 1 — its sleeping instance is woken", timings)
        say(f"\nwhat is hot where (kubectl dualpods status):\n{await hot_where(cluster, namespace)}")

    say("\nsummary (requester container start -> told ready / -> Pod Ready, at the readiness probe that follows)")
    for what, actuation in timings:
        label = what.split(" — ")[0]
        say(f"  {label:<30} {actuation.total:6.2f} s / {actuation.pod_ready:6.2f} s")
    kubectl = f".venv/bin/kubectl --kubeconfig {cluster.kubeconfig} -n {namespace}"
    say(f"""
the cluster is still up. Look around:
  {kubectl} get pods -L {keys.DUAL_LABEL},{keys.SLEEPING_LABEL}
  {kubectl} get isc,lcfg,lpp
  PATH=.venv/bin:$PATH KUBECONFIG={cluster.kubeconfig} kubectl dualpods status -n {namespace}   # what is hot where
  {kubectl} scale rs model-a --replicas=1      # and watch it become Ready
tear it down with: make cluster-down""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-dir", type=Path, default=Path(".cluster"))
    parser.add_argument("--namespace", default="dualpods-demo")
    parser.add_argument(
        "--images", action="store_true", help="run the components from the images of `make images` (real containers)"
    )
    parser.add_argument(
        "--dra", action="store_true", help="GPUs through ResourceClaims, on a cluster up with --gpu-mode dra"
    )
    args = parser.parse_args()
    asyncio.run(run(args.state_dir, args.namespace, built_images() if args.images else PROCESSES, args.dra))


if __name__ == "__main__":
    main()
