"""Mixed deployments with FMA's real components (issue 46 item 1), each swapping real vLLM models on the CPU.

FMA's released binaries run from `../shared/fma/` (checked against its SHA256SUMS first: a missing or altered
release fails these tests, it does not skip them), as FMA's chart runs them (e2e/fma_controllers.py), in the test's
namespace, where no controller of ours runs. Each deployment serves one requester set pinned to one GPU through the
same three swaps a user sees: cold (model A: a new instance), warm (model B: a new instance on the launcher that
already runs), hot (back to A: its sleeping instance woken, not made again). Each Ready requester's model answers a
chat (e2e/swaps.py says how each is checked).

- FMA's controllers + our launcher + our requester (its SPI open, as docs/fma-compatibility.md says);
- FMA's controllers + our launcher + FMA's requester;
- our controllers + our launcher + FMA's requester;
- our controllers + FMA's own launcher (its `launcher.py` in an environment of its own dependencies,
  e2e/fma_launcher_env.py) + our requester, whose proxy then answers too.
"""

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from controller import pods
from e2e.cluster.cluster import LoopbackCluster
from e2e.dualpods_env import DualPodsEnv, Obj, installed, proxy_chat
from e2e.fma_controllers import OPEN_SPI, fma_requester_images, under_fma
from e2e.fma_launcher_env import ensure_venv
from e2e.fma_release import launcher_dir
from e2e.requester_process import distinct_free_ports
from e2e.swaps import Swaps, create_models, is_sleeping, open_listing, process_start

RS = "mixed"
NODE = "gpu-node-1"
PORTS = {"model-a": 8005, "model-b": 8006}


async def test_fmas_controllers_with_our_launcher_and_our_requester(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    async with under_fma(cluster, api, namespace, tmp_path, OPEN_SPI) as (env, fma):
        await cold_warm_hot(env, fma.log_tail, open_listing)


async def test_fmas_controllers_with_our_launcher_and_fmas_requester(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    async with under_fma(cluster, api, namespace, tmp_path, fma_requester_images()) as (env, fma):
        await cold_warm_hot(env, fma.log_tail, open_listing)


async def test_our_controllers_with_our_launcher_and_fmas_requester(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    async with installed(cluster, api, namespace, tmp_path, images=fma_requester_images()) as env:
        await cold_warm_hot(env, lambda: "", env.instances)  # with the launcher token our chart makes


async def test_our_controllers_with_fmas_launcher_and_our_requester(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    launcher_dir()
    await asyncio.to_thread(ensure_venv)  # once per machine: FMA's dependencies and vLLM 0.26
    ports = dict(zip(PORTS, distinct_free_ports(len(PORTS), host="0.0.0.0"), strict=True))
    async with installed(cluster, api, namespace, tmp_path) as env:
        await cold_warm_hot(env, lambda: "", env.instances, ports=ports, fma_launcher=True)
        assert await proxy_chat(await env.ready_requester(RS), "model-a")


Listing = Callable[[Obj], Awaitable[dict[str, Any]]]


async def cold_warm_hot(
    env: DualPodsEnv,
    controller_log: Callable[[], str],
    listing: Listing,
    ports: dict[str, int] = PORTS,
    fma_launcher: bool = False,
) -> None:
    """Model A cold, B warm on the same launcher, A hot: its sleeping server woken, not made again."""
    await create_models(env, ports, NODE, max_instances=2, fma_launcher=fma_launcher)
    gpu = sorted(next(n for n in await env.cluster.kubelet.nodes() if n.name == NODE).gpus)[0]
    await env.create_requesters(RS, "model-a", replicas=0, node=NODE, gpu=gpu)
    swaps = Swaps(env, RS, ports, controller_log)

    launcher = await swaps.serve("model-a")  # cold
    [first] = (await listing(launcher))["instances"]
    started = await process_start(launcher, ports["model-a"])
    await swaps.release(launcher, "model-a")

    assert pods.name(await swaps.serve("model-b")) == pods.name(launcher)  # warm
    await swaps.release(launcher, "model-b")

    assert pods.name(await swaps.serve("model-a")) == pods.name(launcher)  # hot
    ids = {i["instance_id"] for i in (await listing(launcher))["instances"]}
    assert first["instance_id"] in ids, ids
    assert len(ids) == 2, ids
    assert await process_start(launcher, ports["model-a"]) == started, "model A's server was made again, not woken"
    assert await is_sleeping(launcher, ports["model-b"])


pytestmark = pytest.mark.timeout(1800)
