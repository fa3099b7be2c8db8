"""The controllers' Kubernetes plumbing against the real API server: informer cache, Pod writes, the rate-limited
client, and leader election."""

import asyncio
import functools
import time
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from controller.dualpods.writer import FIELD_MANAGER, PodWriter, set_annotation, set_finalizer, set_label
from e2e.cluster.cluster import LoopbackCluster
from e2e.waiting import wait_for, wait_pod_gone
from kube.client import ApiLimits, api_client
from kube.informer import LAST_APPLIED, Informer, Obj
from kube.leader import LeaderElection, LostLeadership


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
            api, namespace, "dual-pods", identity, lease_duration=8, renew_deadline=5, retry_period=0.2
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
    # A correctness bound: a released lease is taken at the next retry (0.2 s; 0.2-0.4 s on a quiet machine), one
    # left to expire only after 8 s; 6 s tells the two apart with 15x the quiet time to spare.
    assert loop.time() - released_at < 6.0, "a released lease is taken over without waiting for expiry"

    leases = client.CoordinationV1Api(api)
    lease = await leases.read_namespaced_lease("dual-pods", namespace)
    assert (lease.spec.holder_identity, lease.spec.lease_transitions) == ("two", 1)

    # Someone else takes the lease away: the leader notices and stops leading.
    lease.spec.holder_identity = "intruder"
    lease.spec.lease_duration_seconds = 3600
    await leases.replace_namespaced_lease("dual-pods", namespace, lease)
    try:
        async with asyncio.timeout(30):  # it notices within its renew deadline (5 s) and a retry period
            await second
    except LostLeadership:
        pass
    else:
        raise AssertionError("the leader kept leading after losing the lease")


async def test_pod_writes_patch_only_their_change(api: client.ApiClient, namespace: str) -> None:
    """An update sends a metadata patch guarded by the cached resourceVersion: what the cache trims stays as
    the API server has it, a stale copy gets 409, and a change beyond metadata is refused before any call."""
    core = client.CoreV1Api(api)
    applied = '{"kind": "Pod", "metadata": {"name": "written"}}'
    await core.create_namespaced_pod(namespace, {
        "metadata": {"name": "written", "annotations": {LAST_APPLIED: applied}},
        # Bound to no Node: nobody else writes to it while the test does.
        "spec": {"nodeName": "no-such-node", "containers": [{"name": "c", "image": "pause"}]},
    })  # fmt: skip
    informer = Informer("pods", functools.partial(core.list_namespaced_pod, namespace))
    await informer.list()
    cached = informer.get(f"{namespace}/written")
    assert cached is not None
    assert LAST_APPLIED not in cached["metadata"]["annotations"], "the cache holds the trimmed copy"

    writer = PodWriter(api, namespace)
    assert await writer.update(cached, lambda pod: set_label(pod, "team", "blue"), "test")
    live = api.sanitize_for_serialization(await core.read_namespaced_pod("written", namespace))
    assert live["metadata"]["labels"] == {"team": "blue"}
    assert live["metadata"]["annotations"][LAST_APPLIED] == applied
    ours = [f for f in live["metadata"]["managedFields"] if f["manager"] == FIELD_MANAGER]
    assert ours, "the write is tracked as the controller's"
    assert "f:labels" in ours[0]["fieldsV1"]["f:metadata"]

    with pytest.raises(ApiException) as stale:
        await writer.update(cached, lambda pod: set_label(pod, "team", "red"), "stale")
    assert stale.value.status == 409
    assert not await writer.update(cached, lambda pod: None, "nothing to change")
    with pytest.raises(ValueError, match="metadata only"):
        await writer.update(cached, lambda pod: pod.update(spec={}), "not metadata")


async def test_a_write_guarded_by_the_uid_alone(api: client.ApiClient, namespace: str) -> None:
    """A requester's metadata write (`if_unchanged=False`) lands over another client's write made since the
    read (a kubelet's status write, at scale), removes only its own finalizer, answers with the version the
    API server stored, and is refused on a Pod of the same name made since."""
    core = client.CoreV1Api(api)
    pod = {
        "metadata": {"name": "guarded"},
        "spec": {"nodeName": "no-such-node", "containers": [{"name": "c", "image": "pause"}]},
    }
    await core.create_namespaced_pod(namespace, pod)
    informer = Informer("pods", functools.partial(core.list_namespaced_pod, namespace))
    await informer.list()
    cached = informer.get(f"{namespace}/guarded")
    assert cached is not None
    writer = PodWriter(api, namespace)

    def live() -> Any:
        return core.read_namespaced_pod("guarded", namespace)

    def finalized_and_annotated(pod: Obj) -> None:
        set_finalizer(pod, "example.com/mine", True)
        set_annotation(pod, "k", "v")

    await core.patch_namespaced_pod("guarded", namespace, {"metadata": {"finalizers": ["example.com/others"]}})
    version = await writer.update(cached, finalized_and_annotated, "test", if_unchanged=False)
    written = await live()
    assert version == written.metadata.resource_version
    assert sorted(written.metadata.finalizers) == ["example.com/mine", "example.com/others"]
    assert written.metadata.annotations == {"k": "v"}

    await informer.list()
    cached = informer.get(f"{namespace}/guarded")
    assert cached is not None
    await core.patch_namespaced_pod("guarded", namespace, {"metadata": {"labels": {"meanwhile": "yes"}}})
    await writer.update(cached, lambda p: set_finalizer(p, "example.com/mine", False), "test", if_unchanged=False)
    assert (await live()).metadata.finalizers == ["example.com/others"]

    await core.patch_namespaced_pod("guarded", namespace, {"metadata": {"finalizers": None}})
    await core.delete_namespaced_pod("guarded", namespace, grace_period_seconds=0)
    await wait_pod_gone(core, namespace, "guarded")
    await core.create_namespaced_pod(namespace, pod)
    with pytest.raises(ApiException) as other_pod:
        await writer.update(cached, lambda p: set_annotation(p, "k", "stale"), "test", if_unchanged=False)
    assert other_pod.value.status == 409, other_pod.value  # a conflict, as with a resourceVersion
    assert (await live()).metadata.annotations is None


async def test_the_api_client_is_rate_limited_and_counted(cluster: LoopbackCluster) -> None:
    registry = CollectorRegistry()
    limited = await api_client(str(cluster.kubeconfig), ApiLimits(qps=20, burst=2), registry)
    assert not limited.rest_client.pool_manager.trust_env, "no ~/.netrc read in a thread for every request"
    try:
        core = client.CoreV1Api(limited)
        started = time.monotonic()
        await asyncio.gather(*(core.list_namespace() for _ in range(6)))
        assert time.monotonic() - started >= (6 - 2) / 20 * 0.9, "four beyond the burst, at 20 per second"
    finally:
        await limited.close()
    assert registry.get_sample_value("dualpods_kube_api_requests_total", {"method": "GET", "code": "200"}) == 6
    assert registry.get_sample_value("dualpods_kube_api_rate_limit_wait_seconds_count") == 6
