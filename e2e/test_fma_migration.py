"""Moving a namespace from FMA's controllers to ours and back, with FMA's real controllers (issue 46 item 2).

A user runs FMA's released controllers (e2e/fma_controllers.py) with our launcher and serves two models on one GPU,
so FMA's controllers leave a launcher with two sleeping vLLM servers. The user stops FMA's controllers and installs
our chart: ours take the launcher over (not replaced) and wake both sleepers hot (the same server processes), and
serve a third model on the other GPU (a new instance of our making); our populator makes a launcher on a second
Node. Then back: our chart uninstalled, FMA's controllers started again, and they take over what ours left: all
three sleepers woken hot by FMA's controller, and the launcher ours made bound by FMA's controller (found by FMA's
launcher-config hash, kept by FMA's populator by its template hash) instead of one of FMA's making. No sleeper is
lost either way: every server process lives from its first start to the end.
"""

from pathlib import Path

import pytest
from kubernetes_asyncio import client

from controller import pods
from e2e.cluster.cluster import LoopbackCluster
from e2e.dualpods_env import NO_ADMISSION_POLICIES, Obj
from e2e.fma_controllers import OPEN_SPI, under_fma
from e2e.swaps import Swaps, create_models, open_listing, process_start

RS = "migrating"
NODE, OTHER_NODE = "gpu-node-1", "gpu-node-2"
PORTS = {"model-a": 8005, "model-b": 8006, "model-c": 8007}


async def test_fmas_sleepers_move_to_our_controllers_and_back_without_one_lost(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    async with under_fma(cluster, api, namespace, tmp_path, OPEN_SPI) as (env, fma):  # our requester under both
        await create_models(env, PORTS, NODE, max_instances=3)
        [gpu0, gpu1] = sorted(next(n for n in await env.cluster.kubelet.nodes() if n.name == NODE).gpus)
        await env.create_requesters(RS, "model-a", replicas=0, node=NODE, gpu=gpu0)
        under_fmas = Swaps(env, RS, PORTS, fma.log_tail)
        servers: dict[str, float] = {}  # ISC -> its server's start

        async def woken(swaps: Swaps, isc: str, launcher: Obj) -> None:
            """`isc` served hot from `launcher`: its server the one that started first, then put to sleep again."""
            assert pods.name(await swaps.serve(isc)) == pods.name(launcher), f"{isc}: not the same launcher"
            assert await process_start(launcher, PORTS[isc]) == servers[isc], f"{isc}'s server was made again"
            await swaps.release(launcher, isc)

        # FMA's controllers: A cold, then B warm; both left asleep.
        launcher = await under_fmas.serve("model-a")
        servers["model-a"] = await process_start(launcher, PORTS["model-a"])
        await under_fmas.release(launcher, "model-a")
        assert pods.name(await under_fmas.serve("model-b")) == pods.name(launcher)
        servers["model-b"] = await process_start(launcher, PORTS["model-b"])
        await under_fmas.release(launcher, "model-b")

        # FMA's controllers stopped, ours installed: both sleepers woken, and C made on the other GPU.
        await fma.stop()
        # Launchers made without the chart's launcher token, so that FMA's controllers (which send none) can drive
        # them after the move back (docs/operations.md).
        await env.controllers.install(NO_ADMISSION_POLICIES, "launcherToken.enabled=false")
        under_ours = Swaps(env, RS, PORTS, lambda: "")
        for isc in ("model-a", "model-b"):
            await woken(under_ours, isc, launcher)
        await env.pin_requesters(RS, NODE, gpu1)
        assert pods.name(await under_ours.serve("model-c")) == pods.name(launcher)
        servers["model-c"] = await process_start(launcher, PORTS["model-c"])
        await under_ours.release(launcher, "model-c")
        assert [pods.name(p) for p in await env.launchers()] == [pods.name(launcher)], "our populator kept FMA's"
        there = {"labelSelector": {"matchLabels": {"kubernetes.io/hostname": OTHER_NODE}}}
        await env.create_population_policy("keep-other", "lc", count=1, selector=there)
        await env.wait_launchers_ready(2)
        [ours_made] = [p for p in await env.launchers() if pods.name(p) != pods.name(launcher)]

        # Ours uninstalled, FMA's started again: every sleeper, FMA's and ours, woken hot by FMA's controller.
        await env.controllers.uninstall()
        await fma.start()
        for isc in ("model-c", "model-a", "model-b"):
            await env.pin_requesters(RS, NODE, gpu1 if isc == "model-c" else gpu0)
            await woken(under_fmas, isc, launcher)
        listing = await open_listing(launcher)
        assert len(listing["instances"]) == 3, listing
        # On the other Node, FMA's controllers use the launcher ours made.
        other_gpu = sorted(next(n for n in await env.cluster.kubelet.nodes() if n.name == OTHER_NODE).gpus)[0]
        await env.pin_requesters(RS, OTHER_NODE, other_gpu)
        assert pods.name(await under_fmas.serve("model-a")) == pods.name(ours_made), "FMA's made another launcher"
        assert len([p for p in await env.launchers() if not pods.is_deleting(p)]) == 2


pytestmark = pytest.mark.timeout(1800)
