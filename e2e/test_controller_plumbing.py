"""The controllers' Kubernetes plumbing against the real API server: informer cache and leader election."""

import asyncio
import functools
from typing import Any

from kubernetes_asyncio import client

from controller.informer import Informer, Obj
from controller.leader import LeaderElection, LostLeadership
from e2e.waiting import wait_for


def configmap(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}


async def test_informer_lists_watches_and_indexes(api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map(namespace, configmap("before", team="a"))
    informer = Informer("configmaps", functools.partial(core.list_namespaced_config_map, namespace))
    informer.add_index("team", lambda obj: [obj["metadata"].get("labels", {}).get("team", "")])
    changes: list[tuple[str | None, str | None]] = []

    def record(old: Obj | None, new: Obj | None) -> None:
        changes.append((old["data"]["k"] if old else None, new["data"]["k"] if new else None))

    informer.subscribe(record)
    running = asyncio.ensure_future(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 10)
        assert [o["metadata"]["name"] for o in informer.by_index("team", "a")] == ["before"]
        assert informer.get(f"{namespace}/before") is not None

        await core.create_namespaced_config_map(namespace, configmap("after", team="b"))
        await core.patch_namespaced_config_map("before", namespace, {"data": {"k": "v2"}})
        await core.delete_namespaced_config_map("after", namespace)
        await wait_for(lambda: len(changes) >= 4, what="four changes", within=10)
        assert changes == [(None, "v"), (None, "v"), ("v", "v2"), ("v", None)]
        assert informer.by_index("team", "b") == []
        assert informer.get(f"{namespace}/before")["data"] == {"k": "v2"}  # type: ignore[index]
    finally:
        running.cancel()


async def test_one_leader_at_a_time_and_a_fast_handover(api: client.ApiClient, namespace: str) -> None:
    leading: list[str] = []
    stop_first = asyncio.Event()

    def elector(identity: str) -> LeaderElection:
        return LeaderElection(
            api, namespace, "dual-pods", identity, lease_duration=3, renew_deadline=2, retry_period=0.2
        )

    async def lead_until(identity: str, stop: asyncio.Event) -> None:
        leading.append(identity)
        await stop.wait()

    first = asyncio.ensure_future(elector("one").run(functools.partial(lead_until, "one", stop_first)))
    await wait_for(lambda: leading == ["one"], what="one to lead", within=10)
    second = asyncio.ensure_future(elector("two").run(functools.partial(lead_until, "two", asyncio.Event())))
    await asyncio.sleep(1.0)
    assert leading == ["one"], "two replicas must not lead at once"

    stop_first.set()  # the first leader finishes and releases the lease
    await first
    loop = asyncio.get_running_loop()
    released_at = loop.time()
    await wait_for(lambda: leading == ["one", "two"], what="two to take over", within=10)
    assert loop.time() - released_at < 2.0, "a released lease is taken over without waiting for expiry"

    leases = client.CoordinationV1Api(api)
    lease = await leases.read_namespaced_lease("dual-pods", namespace)
    assert (lease.spec.holder_identity, lease.spec.lease_transitions) == ("two", 1)

    # Someone else takes the lease away: the leader notices and stops leading.
    lease.spec.holder_identity = "intruder"
    lease.spec.lease_duration_seconds = 3600
    await leases.replace_namespaced_lease("dual-pods", namespace, lease)
    try:
        await asyncio.wait_for(second, 10)
    except LostLeadership:
        pass
    else:
        raise AssertionError("the leader kept leading after losing the lease")
