"""Direct providers (fma.md §2.6, §2.9, §2.10): the nominal Pod and its hash, the gpu-map, and the Reconciler's
direct-mode steps against the in-memory fakes of tests/test_dualpods_fakes.py (reuse or create, the sleeper limit,
bind, wake, relay, sleep and unbind).
"""

import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from controller.dualpods.gpu_map import GpuMapError, gpu_indices
from controller.dualpods.nominal import NominalError, gpu_keys, nominal_provider, server_port
from controller.dualpods.passes import Options
from controller.http import HttpError, Reply
from kube.informer import Obj
from tests.results import backs_off, terminal
from tests.test_dualpods_fakes import (
    GPU0,
    GPU1,
    NODE,
    NS,
    PATCH,
    PROVIDER,
    REQ,
    REQ_UID,
    SERVER_PORT,
    STARTED_AT,
    TOKEN_MOUNT,
    Harness,
    direct_requester_obj,
    gpu_map_obj,
    harness,
    node_obj,
    provider_obj,
    status_errors,
)

IP = "127.0.2.1"  # provider_obj's address
SERVER = "spec:\n  containers:\n  - name: inference-server\n"  # a patch of the server container, continued


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with harness(Options(sleeper_limit=1)) as made:
        made.put(node_obj(), gpu_map_obj())
        yield made


def meta(pod: Obj, key: str) -> Any:
    return pod["metadata"].get(key) or ([] if key == "finalizers" else {})


def container(pod: Obj) -> dict[str, Any]:
    found: dict[str, Any] = pod["spec"]["containers"][0]
    return found


def env(pod: Obj) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(pod).get("env") or []}


def nominal_hash(requester: Obj | None = None, indices: tuple[str, ...] = ("0",), node: str = NODE) -> str:
    return nominal_provider(requester or direct_requester_obj(), node, list(indices), [GPU0]).hash


def create_refused(status: int, message: str) -> ApiException:
    return ApiException(status=status, reason=json.dumps({"kind": "Status", "message": message}))


# ----- the nominal provider


def test_the_nominal_provider_is_the_patched_impersonal_requester() -> None:
    pod = nominal_provider(direct_requester_obj(), NODE, ["1"], [GPU1]).pod
    assert pod["apiVersion"] == "v1"
    assert pod["kind"] == "Pod"
    assert meta(pod, "namespace") == NS
    assert meta(pod, "generateName") == f"{REQ}-dual-"
    assert meta(pod, "labels") == {"model": "m1", keys.SLEEPING_LABEL: "false"}  # `app` moved off the set's selector
    assert set(meta(pod, "annotations")) == {keys.NOMINAL_ANNOTATION, keys.ACCELERATORS_ANNOTATION}
    assert meta(pod, "annotations")[keys.ACCELERATORS_ANNOTATION] == GPU1
    spec = pod["spec"]
    assert spec["nodeName"] == NODE  # as FMA: the requester's node, whose GPUs it holds
    assert "status" not in pod
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": NODE}
    assert "volumes" not in spec  # the requester's own token volume is not copied; the API server adds one
    server = container(pod)
    assert server["image"] == "vllm/vllm-openai:v1"
    assert "volumeMounts" not in server
    assert env(pod) == {"VLLM_SERVER_DEV_MODE": "1", "CUDA_VISIBLE_DEVICES": "1"}
    assert server["resources"] == {"limits": {"nvidia.com/gpu": "0"}, "requests": {"nvidia.com/gpu": "0"}}
    assert server_port(pod) == SERVER_PORT


def test_a_dra_requesters_claims_stay_with_the_requester() -> None:
    """Its GPUs come from a ResourceClaim the requester holds: the provider claims none (nor the same template)."""
    requester = direct_requester_obj()
    requester["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}]
    container(requester)["resources"] = {"claims": [{"name": "gpus"}]}
    pod = nominal_provider(requester, NODE, ["0", "1"], [GPU0, GPU1]).pod
    assert "resourceClaims" not in pod["spec"]
    assert container(pod)["resources"] == {"limits": {"nvidia.com/gpu": "0"}, "requests": {"nvidia.com/gpu": "0"}}


def test_the_api_access_token_volume_is_left_out_but_a_users_volume_stays() -> None:
    requester = direct_requester_obj()
    spec = requester["spec"]
    spec["volumes"] = [{"name": "kube-api-access-x7k2p", "projected": {}}, {"name": "models", "emptyDir": {}}]
    spec["containers"][0]["volumeMounts"] = [
        {"name": "kube-api-access-x7k2p", "mountPath": TOKEN_MOUNT},
        {"name": "models", "mountPath": "/models"},
    ]
    spec["ephemeralContainers"] = [{"name": "debug", "image": "busybox"}]
    pod = nominal_provider(requester, NODE, ["0"], [GPU0]).pod
    assert pod["spec"]["volumes"] == [{"name": "models", "emptyDir": {}}]
    assert container(pod)["volumeMounts"] == [{"name": "models", "mountPath": "/models"}]
    assert "ephemeralContainers" not in pod["spec"]


def test_the_hash_is_the_same_for_every_requester_of_a_set_on_the_same_gpus() -> None:
    other = direct_requester_obj("req-2", "uid-2", ip="127.0.0.9", gpus=(GPU1,), ready=True, finalizer=True, rv="9")
    other["spec"]["volumes"][0]["name"] = "kube-api-access-zzzzz"
    other["spec"]["containers"][0]["volumeMounts"][0]["name"] = "kube-api-access-zzzzz"
    other["metadata"]["annotations"]["example.com/note"] = "annotations do not count"
    assert nominal_hash(other) == nominal_hash()
    assert nominal_hash() == nominal_hash()


@pytest.mark.parametrize(
    "change",
    [
        lambda: nominal_hash(direct_requester_obj(patch=PATCH.replace("/models/m1", "/models/m2"))),
        lambda: nominal_hash(indices=("1",)),
        lambda: nominal_hash(indices=("0", "1")),
        lambda: nominal_hash(node="node-b"),
        lambda: nominal_hash(direct_requester_obj(labels={"tier": "gold"})),
    ],
    ids=["patch", "gpu", "gpus", "node", "labels"],
)
def test_the_hash_changes_with_the_patch_the_gpus_the_node_and_the_labels(change: Any) -> None:
    assert change() != nominal_hash()


def test_the_hash_is_unpadded_standard_base64_of_sha256() -> None:
    digest = nominal_hash()
    assert len(digest) == 43
    assert not digest.endswith("=")


@pytest.mark.parametrize(
    ("probe", "ports", "expected"),
    [
        ({"httpGet": {"port": 9000}}, [], 9000),
        ({"httpGet": {"port": "http"}}, [], 80),
        ({"httpGet": {"port": "HTTP"}}, [], 80),
        ({"httpGet": {"port": "api"}}, [{"name": "api", "containerPort": 8123}], 8123),
        ({"httpGet": {"port": "http"}}, [{"name": "http", "containerPort": 8124}], 8124),
    ],
)
def test_the_server_port_is_the_readiness_probes(probe: dict[str, Any], ports: list[Any], expected: int) -> None:
    pod = {"spec": {"containers": [{"name": keys.INFERENCE_SERVER_CONTAINER, "readinessProbe": probe, "ports": ports}]}}
    assert server_port(pod) == expected


@pytest.mark.parametrize(
    ("pod", "error"),
    [
        ({"spec": {"containers": [{"name": "other"}]}}, 'container "inference-server" not found'),
        ({"spec": {"containers": [{"name": "inference-server"}]}}, "has no readinessProbe"),
        ({"spec": {"containers": [{"name": "inference-server", "readinessProbe": {"exec": {}}}]}}, "not an HTTPGet"),
        (
            {"spec": {"containers": [{"name": "inference-server", "readinessProbe": {"httpGet": {"port": "x"}}}]}},
            "unsupported readinessProbe port 'x'",
        ),
    ],
)
def test_a_provider_without_a_known_port_is_an_error(pod: Obj, error: str) -> None:
    with pytest.raises(NominalError, match=error):
        server_port(pod)


@pytest.mark.parametrize(
    ("patch", "error"),
    [
        ("spec: {nodeName: '{{ .Node }}'}", "the server patch: .*Node"),
        ("spec: [", "the server patch"),
        ("spec:\n  contianers: []", 'unknown field "spec.contianers"'),
        (f"{SERVER}    imag: x", 'unknown field "spec.containers\\[0\\].imag"'),
        (f"{SERVER}    readinessProbe: null", "has no readinessProbe"),
        (f"{SERVER}    $patch: delete", "not found"),
    ],
    ids=["missing-key", "not-yaml", "unknown-field", "unknown-container-field", "no-probe", "no-server"],
)
def test_a_patch_that_makes_no_usable_provider_is_an_error(patch: str, error: str) -> None:
    with pytest.raises(NominalError, match=error):
        nominal_provider(direct_requester_obj(patch=patch), NODE, ["0"], [GPU0])


def test_the_template_sees_the_node_name() -> None:
    patch = PATCH + '  nodeSelector: {"example.com/node": "{{ .NodeName }}", "example.com/local": "x{{.LocalVolume}}"}'
    pod = nominal_provider(direct_requester_obj(patch=patch), NODE, ["0"], [GPU0]).pod
    assert pod["spec"]["nodeSelector"] == {
        "example.com/node": NODE,
        "example.com/local": "x",
        "kubernetes.io/hostname": NODE,
    }


def test_the_sleeper_index_keys_are_node_and_cuda_index() -> None:
    provider = provider_obj(indices=("0", "1"), gpus=(GPU0, GPU1))
    assert gpu_keys(provider) == [f"{NODE} 0", f"{NODE} 1"]
    provider["spec"].pop("nodeName")
    assert gpu_keys(provider) == []


# ----- the gpu-map


def test_gpu_indices_follow_the_uuids() -> None:
    assert gpu_indices(gpu_map_obj(), NODE, [GPU1, GPU0]) == ["1", "0"]


@pytest.mark.parametrize(
    ("configmap", "uuids", "errors"),
    [
        (None, [GPU0], ["GPU map ConfigMap gpu-map is not available"]),
        (gpu_map_obj({NODE: {GPU0: 0}}), [GPU0, GPU1], [f"UUID {GPU1} is not known"]),
        (gpu_map_obj({"node-b": {GPU0: 0}}), [GPU0], [f"UUID {GPU0} is on Node node-b, not {NODE}"]),
        (gpu_map_obj({}) | {"data": {NODE: "not json", "node-b": "[1]"}}, [GPU0], [f"UUID {GPU0} is not known"]),
    ],
    ids=["absent", "unknown", "elsewhere", "malformed"],
)
def test_gpu_map_errors_are_fmas(configmap: Obj | None, uuids: list[str], errors: list[str]) -> None:
    with pytest.raises(GpuMapError) as raised:
        gpu_indices(configmap, NODE, uuids)
    assert raised.value.errors == errors


# ----- the Reconciler's direct-mode steps, grouped by phase in the order of the phase table (phases.py)


def sleeper(name: str, model: str, **kwargs: Any) -> Obj:
    """An unbound provider of another model on GPU 0."""
    return provider_obj(name, requester=direct_requester_obj(patch=PATCH.replace("/models/m1", model)), **kwargs)


def _raises(error: Exception) -> Any:
    async def create(pod: Obj) -> Obj:
        raise error

    return create


def bound_pair(h: Harness, *, sleeping: str = "false", ready: bool = True, requester_ready: bool = False) -> Obj:
    """A requester bound to its provider, settled as the controller leaves it; returns the requester."""
    requester = direct_requester_obj(finalizer=True, ready=requester_ready, labels={keys.DUAL_LABEL: PROVIDER})
    requester["metadata"]["annotations"][keys.STATUS_ANNOTATION] = '{"Errors": null}'
    h.put(requester, provider_obj(bound_to=requester, sleeping=sleeping, ready=ready))
    return requester


# ----- PROVIDER_DELETED: the provider is being deleted


async def test_a_deleted_provider_takes_its_requester_with_it(h: Harness) -> None:
    requester = direct_requester_obj(rv="7")
    h.put(requester, provider_obj(bound_to=requester, deleting=True))
    await h.reconcile()
    assert h.journal.kinds() == [("delete", REQ), ("update", PROVIDER)]
    assert keys.PROVIDER_FINALIZER not in meta(h.journal.written(PROVIDER), "finalizers")


# ----- RELEASING: releasing a direct provider, or an unrouted launcher whose instances are known


async def test_unbind_puts_the_provider_to_sleep_then_unbinds_it_in_one_write(h: Harness) -> None:
    requester = bound_pair(h)
    requester["metadata"]["deletionTimestamp"] = STARTED_AT
    h.put(requester)
    await h.reconcile()
    assert h.journal.kinds() == [("sleep", IP), ("update", PROVIDER), ("update", REQ)]
    unbound = h.journal.written(PROVIDER)
    assert keys.REQUESTER_ANNOTATION not in meta(unbound, "annotations")
    assert keys.NOMINAL_ANNOTATION in meta(unbound, "annotations")  # still findable for reuse
    assert keys.DUAL_LABEL not in meta(unbound, "labels")
    assert meta(unbound, "labels")[keys.SLEEPING_LABEL] == "true"
    assert meta(unbound, "finalizers") == []
    assert meta(h.journal.written(REQ), "finalizers") == []
    h.journal.clear()
    await h.reconcile()
    assert h.journal == []  # the requester is gone; the provider stays, asleep
    assert h.has_pod(PROVIDER)


async def test_unbind_of_a_provider_known_asleep_makes_no_call(h: Harness) -> None:
    requester = direct_requester_obj()
    h.put(provider_obj(bound_to=requester, sleeping="true"))
    h.reconciler.memory.asleep[f"{PROVIDER}-uid"] = (0, True)
    await h.reconcile()
    assert h.journal.kinds() == [("update", PROVIDER)]


async def test_a_restarted_provider_is_not_taken_for_asleep(h: Harness) -> None:
    requester = direct_requester_obj()
    provider = provider_obj(bound_to=requester, restarts=1)
    h.put(provider)
    h.reconciler.memory.asleep[f"{PROVIDER}-uid"] = (0, True)  # before its restart
    await h.reconcile()
    assert h.journal.kinds() == [("sleep", IP), ("update", PROVIDER)]


async def test_unbind_deletes_a_provider_that_does_not_serve_yet(h: Harness) -> None:
    requester = direct_requester_obj()
    h.put(provider_obj(bound_to=requester, ready=False))
    await h.reconcile()
    assert h.journal.kinds() == [("delete", PROVIDER)]


async def test_unbind_deletes_a_provider_that_refuses_to_sleep(h: Harness) -> None:
    h.put(provider_obj(bound_to=direct_requester_obj()))
    h.providers.refusal = HttpError("sleep", f"http://{IP}:8000/sleep?level=1", Reply(404, "Not Found"))
    await h.reconcile()
    assert h.journal.kinds() == [("sleep", IP), ("event", PROVIDER), ("delete", PROVIDER)]


async def test_unbind_retries_a_provider_that_fails_to_sleep(h: Harness) -> None:
    h.put(provider_obj(bound_to=direct_requester_obj()))
    h.providers.refusal = HttpError("sleep", f"http://{IP}:8000/sleep?level=1", None, ConnectionError())
    assert backs_off(await h.reconcile())
    assert h.journal.kinds() == [("sleep", IP)]


# ----- UNSCHEDULED: staying, no Node or its Node is being deleted


async def test_a_requester_on_a_departed_node_is_left_to_kubernetes(h: Harness) -> None:
    h.remove(node_obj())
    h.put(direct_requester_obj())
    await h.reconcile()
    assert h.journal == []


# ----- INVALID: started, both a server patch and an ISC


async def test_requesting_both_kinds_of_provider_is_a_status_error(h: Harness) -> None:
    requester = direct_requester_obj()
    requester["metadata"]["annotations"][keys.INFERENCE_SERVER_CONFIG_ANNOTATION] = "isc"
    h.put(requester)
    await h.reconcile()
    (error,) = status_errors(h.pod(REQ)) or []
    assert "exclude each other" in error


# ----- NEEDS_GPUS: started and valid, its GPUs not recorded


async def test_the_gpus_are_asked_once_and_recorded(h: Harness) -> None:
    h.put(direct_requester_obj(gpus=None))
    h.requesters.gpus = [GPU1]
    await h.reconcile()
    assert h.journal.kinds() == [("gpu_uuids", REQ), ("update", REQ)]
    assert meta(h.pod(REQ), "annotations")[keys.ACCELERATORS_ANNOTATION] == GPU1


# ----- CORDONED: admitted, unbound on a cordoned Node


async def test_a_cordoned_node_deletes_a_requester_not_yet_served_but_not_a_served_one(h: Harness) -> None:
    h.put(node_obj(unschedulable=True), direct_requester_obj(rv="3"), provider_obj())
    await h.reconcile()
    assert h.journal.kinds() == [("delete", REQ)]  # not even a sleeper of its own is woken
    h.journal.clear()
    bound_pair(h)
    await h.reconcile()
    assert h.journal.of("delete") == []


# ----- ACQUIRING: admitted, direct mode, to bind


async def test_without_a_gpu_map_the_requester_shows_it_and_waits_for_the_map(h: Harness) -> None:
    h.remove(gpu_map_obj())
    h.put(direct_requester_obj())
    assert terminal(await h.reconcile())  # no retry: the ConfigMap's arrival brings the requester back
    assert status_errors(h.pod(REQ)) == ["GPU map ConfigMap gpu-map is not available"]
    assert h.journal.of("create") == []


async def test_gpus_the_map_places_elsewhere_are_status_errors(h: Harness) -> None:
    h.put(gpu_map_obj({"node-b": {GPU0: 0}}), direct_requester_obj(gpus=(GPU0, GPU1)))
    await h.reconcile()
    assert status_errors(h.pod(REQ)) == [f"UUID {GPU0} is on Node node-b, not {NODE}", f"UUID {GPU1} is not known"]


async def test_a_broken_patch_is_a_status_error_without_retries(h: Harness) -> None:
    h.put(direct_requester_obj(patch="spec:\n  contianers: []"))
    assert terminal(await h.reconcile())
    assert status_errors(h.pod(REQ)) == [
        'failed to construct the nominal server-providing Pod: strict decoding error: unknown field "spec.contianers"'
    ]


async def test_without_a_sleeper_a_provider_is_created_bound(h: Harness) -> None:
    requester = direct_requester_obj()
    h.put(requester, provider_obj("other-model", requester=direct_requester_obj(patch=PATCH.replace("m1", "m2"))))
    await h.reconcile()
    assert h.journal.kinds() == [("create", f"{REQ}-dual-1")]
    created = h.journal.written(f"{REQ}-dual-1")
    expected = nominal_provider(requester, NODE, ["0"], [GPU0]).pod
    assert meta(created, "annotations") == {
        **meta(expected, "annotations"),
        keys.REQUESTER_ANNOTATION: f"{REQ_UID} {REQ}",
    }
    assert meta(created, "labels") == {**meta(expected, "labels"), keys.DUAL_LABEL: REQ}
    assert meta(created, "finalizers") == [keys.PROVIDER_FINALIZER]
    assert created["spec"] == expected["spec"]
    assert h.reconciler.memory.paths[REQ_UID] == "cold"


async def test_a_sleeping_copy_is_bound_instead_of_creating_one(h: Harness) -> None:
    requester = direct_requester_obj()
    bound_elsewhere = provider_obj("bound", bound_to=direct_requester_obj("other", "other-uid"))
    going = provider_obj("going", deleting=True)
    h.put(requester, bound_elsewhere, going, provider_obj())
    await h.reconcile()
    assert h.journal.kinds() == [("update", PROVIDER)]  # the bind: one write, the claim
    written = h.journal.written(PROVIDER)
    assert meta(written, "annotations")[keys.REQUESTER_ANNOTATION] == f"{REQ_UID} {REQ}"
    assert meta(written, "labels")[keys.DUAL_LABEL] == REQ
    assert meta(written, "labels")[keys.SLEEPING_LABEL] == "true"  # until it is woken
    assert meta(written, "finalizers") == [keys.PROVIDER_FINALIZER]
    assert h.reconciler.memory.paths[REQ_UID] == "hot"


async def test_a_copy_still_serving_a_departing_requester_is_awaited_then_reused(h: Harness) -> None:
    going = direct_requester_obj("req-old", "old-uid", deleting=True, finalizer=True)
    h.put(direct_requester_obj(), going, provider_obj(bound_to=going, sleeping="false"))
    await h.reconcile()
    assert h.journal == []  # neither a second copy nor a theft
    await h.reconcile("req-old")
    assert h.journal.kinds() == [("sleep", IP), ("update", PROVIDER), ("update", "req-old")]
    h.journal.clear()
    await h.reconcile()
    assert h.journal.kinds() == [("update", PROVIDER)]
    assert meta(h.pod(PROVIDER), "annotations")[keys.REQUESTER_ANNOTATION] == f"{REQ_UID} {REQ}"


async def test_the_least_recently_used_sleepers_beyond_the_limit_go_before_a_creation(h: Harness) -> None:
    async with harness(Options(sleeper_limit=2)) as h2:
        h2.put(node_obj(), gpu_map_obj(), direct_requester_obj())
        h2.put(
            sleeper("b-used-last", "/m/a", used_at="2026-01-01T00:00:09Z"),
            sleeper("a-used-first", "/m/b", used_at="2026-01-01T00:00:05Z"),
            sleeper("c-never-written", "/m/c", created_at="2026-01-01T00:00:07Z"),
            sleeper("d-tied", "/m/d", used_at="2026-01-01T00:00:05Z"),
            sleeper("other-gpu", "/m/e", indices=("1",), gpus=(GPU1,)),
            sleeper("serving", "/m/f", bound_to=direct_requester_obj("other", "other-uid")),
        )
        await h2.reconcile()
        assert h2.journal.kinds() == [
            ("event", "a-used-first"),
            ("delete", "a-used-first"),
            ("event", "d-tied"),
            ("delete", "d-tied"),
        ]
        assert h2.journal.of("delete")[0].detail == {"uid": "a-used-first-uid", "rv": "1"}
        assert h2.journal[0].detail[1] == "SleeperBudget"

        h2.journal.clear()  # a Pod's containers get their grace period: both are still going, holding GPU memory
        h2.put(sleeper("a-used-first", "/m/b", deleting=True), sleeper("d-tied", "/m/d", deleting=True))
        await h2.reconcile()
        assert h2.journal == []

        h2.remove(sleeper("a-used-first", "/m/b"))
        h2.remove(sleeper("d-tied", "/m/d"))
        await h2.reconcile()
        assert h2.journal.kinds() == [("create", f"{REQ}-dual-1")]


async def test_sleepers_within_the_limit_stay(h: Harness) -> None:
    h.put(direct_requester_obj(), sleeper("old", "/m/a", used_at="2026-01-01T00:00:05Z"))
    await h.reconcile()
    assert h.journal.kinds() == [("create", f"{REQ}-dual-1")]


async def test_reusing_a_sleeper_deletes_none(h: Harness) -> None:
    h.put(direct_requester_obj(), sleeper("a", "/m/a"), sleeper("b", "/m/b"), provider_obj())
    await h.reconcile()
    assert h.journal.kinds() == [("update", PROVIDER)]


async def test_an_invalid_provider_is_a_status_error_not_a_retry_loop(h: Harness) -> None:
    h.put(direct_requester_obj())
    message = f'Pod "{REQ}-dual-x7k2p" is invalid: spec.containers[0].image: Required value'
    h.writer.create = _raises(create_refused(422, message))  # type: ignore[method-assign]
    assert terminal(await h.reconcile())
    assert status_errors(h.pod(REQ)) == [f"the nominal server-providing {message}"]


async def test_another_creation_failure_is_a_status_error_and_a_retry(h: Harness) -> None:
    h.put(direct_requester_obj())
    h.writer.create = _raises(create_refused(403, "exceeded quota"))  # type: ignore[method-assign]
    result = await h.reconcile()
    assert backs_off(result)
    assert "exceeded quota" in str(result)
    assert status_errors(h.pod(REQ)) == ["failed to create server-providing Pod: exceeded quota"]


# ----- DIRECT_SERVING: bound to a direct provider, in line


async def test_after_a_restart_whether_a_provider_sleeps_is_asked_once(h: Harness) -> None:
    bound_pair(h, sleeping="false")
    await h.reconcile()
    await h.reconcile()
    assert h.journal.kinds() == [("is_sleeping", IP), ("relay", REQ)]


async def test_after_a_restart_a_provider_left_asleep_is_woken(h: Harness) -> None:
    bound_pair(h, sleeping="true")
    h.providers.asleep[IP] = True
    await h.reconcile()
    assert h.journal.kinds() == [("is_sleeping", IP), ("wake", IP), ("update", PROVIDER)]


async def test_a_provider_that_stops_being_ready_makes_the_requester_unready(h: Harness) -> None:
    bound_pair(h, ready=False, requester_ready=True)
    await h.reconcile()
    assert [(c.kind, c.target, c.detail) for c in h.journal] == [("relay", REQ, False)]


# ----- whole actuations, pass after pass, across the phases


async def test_a_hot_start_binds_settles_wakes_labels_and_relays(h: Harness) -> None:
    h.put(direct_requester_obj(), provider_obj())
    h.providers.asleep[IP] = True
    h.reconciler.memory.asleep[f"{PROVIDER}-uid"] = (0, True)  # this controller put it to sleep
    done = await h.drive()
    assert [(c.kind, c.target) for c in done] == [
        ("update", PROVIDER),  # bind
        ("update", REQ),  # finalizer, dual label, status
        ("wake", IP),
        ("update", PROVIDER),  # sleeping=false
        ("relay", REQ),
    ]
    assert done[2].detail == SERVER_PORT
    requester = h.pod(REQ)
    assert meta(requester, "labels")[keys.DUAL_LABEL] == PROVIDER
    assert meta(requester, "finalizers") == [keys.REQUESTER_FINALIZER]
    assert meta(h.pod(PROVIDER), "labels")[keys.SLEEPING_LABEL] == "false"
    assert not h.providers.asleep[IP]


async def test_a_cold_start_relays_once_the_new_provider_is_ready(h: Harness) -> None:
    h.put(direct_requester_obj())
    await h.reconcile()
    created = h.journal.written(f"{REQ}-dual-1")
    h.journal.clear()
    starting = copy.deepcopy(created)
    starting["metadata"].update(resourceVersion="5")
    starting["spec"]["nodeName"] = NODE
    starting["status"] = {"phase": "Pending"}
    h.put(starting)
    done = await h.drive()
    assert [(c.kind, c.target) for c in done] == [("update", REQ)]  # settled; nothing to relay yet
    ready = provider_obj(f"{REQ}-dual-1", bound_to=h.pod(REQ), sleeping="false")
    ready["metadata"]["uid"] = created["metadata"]["uid"]
    h.put(ready)
    done = await h.drive()
    # The finalizer now that it runs, then the relay; never asked whether it sleeps: it was made awake.
    assert [(c.kind, c.target) for c in done] == [("update", REQ), ("relay", REQ)]
    assert h.metric("fma_actuation_seconds_count", exported_namespace=NS, path="cold", instancesDeleted="0",
                    isc_name="") == 1  # fmt: skip
