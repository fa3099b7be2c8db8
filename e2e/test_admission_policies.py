"""FMA's admission policies judged by the loopback cluster's own API server: it type-checks every expression,
and for each edit of the case table below (of bound launchers and requesters, unbound and plain Pods, by a user
and by an `*-fma-controllers` ServiceAccount) it denies exactly the edits the table says, with the policy's
message, and admits the rest. Then the chart's default install: on a requester the real controllers bound, a
user's edit of the status annotation is refused while the controllers write it.

The Pods of the table are created held by a scheduling gate, so they never run; each edit is a PUT made as the
case's user (impersonated by the cluster's admin).
"""

import copy
import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from e2e.cluster.cluster import LoopbackCluster
from e2e.crds import kubectl
from e2e.dualpods_env import installed
from e2e.waiting import wait_for
from scripts.admission_policies import CONCATENATED

IMMUTABLE = "fma-immutable-fields"
BOUND = "fma-bound-serverreqpod"
Obj = dict[str, Any]
HOLD = {"name": "dualpods.test/never-schedule"}
DENIED = re.compile(r"ValidatingAdmissionPolicy '([^']+)' with binding '[^']+' denied request: ([^\n]*)")


# --- Pods and edits -----------------------------------------------------------------------------------------

USER = "alice"
CONTROLLERS = "system:serviceaccount:ns:rel-fma-controllers"


def pod(name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> Obj:
    """A Pod as the API server serializes it: a metadata map is absent rather than empty or null."""
    metadata: Obj = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "7"}
    if labels is not None:
        metadata["labels"] = labels
    if annotations is not None:
        metadata["annotations"] = annotations
    container = {"name": keys.INFERENCE_SERVER_CONTAINER, "image": "registry.example/app:1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [container]}}


BOUND_LAUNCHER = pod(
    "launcher-1",
    labels={keys.COMPONENT_LABEL: keys.LAUNCHER_COMPONENT, keys.LAUNCHER_CONFIG_NAME_LABEL: "cpu-launcher",
            keys.NODE_NAME_LABEL: "node-1", keys.DUAL_LABEL: "req-1", keys.SLEEPING_LABEL: "false"},
    annotations={keys.REQUESTER_ANNOTATION: "uid-req-1 req-1", keys.INSTANCE_ID_ANNOTATION: "abc123",
                 keys.SERVER_PORT_ANNOTATION: "8005", keys.VLLM_CONFIG_ANNOTATION: json.dumps({"options": "--x"}),
                 keys.ISC_ROUTING_METADATA_ANNOTATION: json.dumps({"labels": {"model": "smol"}}),
                 keys.LAUNCHER_CONFIG_HASH_ANNOTATION: "h4sh"},
)  # fmt: skip
BOUND_REQUESTER = pod(
    "req-1",
    labels={"app": "smol", keys.DUAL_LABEL: "launcher-1", keys.INSTANCE_LABEL: "abc123"},
    annotations={keys.INFERENCE_SERVER_CONFIG_ANNOTATION: "smol", keys.STATUS_ANNOTATION: '{"Errors":null}',
                 keys.ACCELERATORS_ANNOTATION: "GPU-0"},
)  # fmt: skip
UNBOUND_REQUESTER = pod("req-2", annotations={keys.INFERENCE_SERVER_CONFIG_ANNOTATION: "unbound-config"})
PLAIN = pod("web", labels={"app": "web"}, annotations={"team": "a"})
BARE = pod("bare")

ANNOTATIONS, LABELS = "annotations", "labels"
ISC, DUAL, STATUS = keys.INFERENCE_SERVER_CONFIG_ANNOTATION, keys.DUAL_LABEL, keys.STATUS_ANNOTATION
REQUESTER, INSTANCE_ID = keys.REQUESTER_ANNOTATION, keys.INSTANCE_ID_ANNOTATION
LAUNCHER_CONFIG_NAME = keys.LAUNCHER_CONFIG_NAME_LABEL
MANAGED = [(ANNOTATIONS, k) for k in (REQUESTER, STATUS, INSTANCE_ID, keys.SERVER_PORT_ANNOTATION,
                                      keys.VLLM_CONFIG_ANNOTATION, keys.ISC_ROUTING_METADATA_ANNOTATION)]  # fmt: skip
MANAGED += [(LABELS, DUAL), (LABELS, LAUNCHER_CONFIG_NAME)]
PROTECTED_KEYS = {k for _, k in MANAGED} | {ISC}


def edit(old: Obj, changes: Mapping[str, str | None], kind: str = ANNOTATIONS) -> Obj:
    """A copy of `old` with metadata keys set, or removed where the value is None."""
    new = copy.deepcopy(old)
    target = new["metadata"].setdefault(kind, {})
    for key, value in changes.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return new


def label(old: Obj, changes: Mapping[str, str | None]) -> Obj:
    return edit(old, changes, LABELS)


def drop(old: Obj, *maps: str) -> Obj:
    """A copy of `old` without whole metadata maps, as `kubectl edit` removing every label leaves it."""
    new = copy.deepcopy(old)
    for name in maps:
        new["metadata"].pop(name, None)
    return new


@dataclass(frozen=True)
class Case:
    """An update and the (policy, key) pairs it must be denied for; none: admitted."""

    id: str
    old: Obj
    new: Obj
    denied: frozenset[tuple[str, str]] = frozenset()
    user: str = USER


def _deny(*pairs: tuple[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset(pairs)


def _managed_key_cases() -> Iterator[Case]:
    """validate.sh's launcher cases, for every managed key: changed, emptied or deleted → denied; by the controllers
    → admitted. (The status annotation lives on requesters.)"""
    for kind, key in MANAGED:
        name, old = ("requester", BOUND_REQUESTER) if key == STATUS else ("launcher", BOUND_LAUNCHER)
        assert old["metadata"][kind][key]
        short = key.removeprefix(keys.PREFIX)
        for how, value in (("change", "tampered"), ("empty", ""), ("delete", None)):
            new = edit(old, {key: value}, kind)
            yield Case(f"{name}-{how}-{short}", old, new, _deny((IMMUTABLE, key)))
            yield Case(f"{name}-{how}-{short}-by-controllers", old, new, user=CONTROLLERS)


# A protected change on each kind of bound Pod, one per policy.
PROTECTED_EDITS = [
    (BOUND_LAUNCHER, edit(BOUND_LAUNCHER, {REQUESTER: "xyz patched-requester"})),
    (BOUND_REQUESTER, edit(BOUND_REQUESTER, {ISC: "other"})),
]
HALF_BOUND = label(BOUND_REQUESTER, {DUAL: ""})
CASES: list[Case] = [
    *_managed_key_cases(),
    Case("launcher-unprotected-label", BOUND_LAUNCHER, label(BOUND_LAUNCHER, {"regular-label": "yes"})),
    Case("launcher-unprotected-annotation", BOUND_LAUNCHER,
         edit(BOUND_LAUNCHER, {keys.LAUNCHER_CONFIG_HASH_ANNOTATION: "other"})),
    Case("launcher-drop-labels", BOUND_LAUNCHER, drop(BOUND_LAUNCHER, LABELS),
         _deny((IMMUTABLE, DUAL), (IMMUTABLE, LAUNCHER_CONFIG_NAME))),
    Case("launcher-unbind-by-controllers", BOUND_LAUNCHER,
         label(edit(BOUND_LAUNCHER, {REQUESTER: None, INSTANCE_ID: None}), {DUAL: None}), user=CONTROLLERS),
    # The bound requester (validate.sh tests 4-6, and more).
    Case("requester-change-isc", BOUND_REQUESTER, edit(BOUND_REQUESTER, {ISC: "patched-config"}), _deny((BOUND, ISC))),
    Case("requester-delete-isc", BOUND_REQUESTER, edit(BOUND_REQUESTER, {ISC: None}), _deny((BOUND, ISC))),
    Case("requester-empty-isc", BOUND_REQUESTER, edit(BOUND_REQUESTER, {ISC: ""}), _deny((BOUND, ISC))),
    Case("requester-same-isc", BOUND_REQUESTER, edit(BOUND_REQUESTER, {ISC: "smol"})),
    Case("requester-change-dual", BOUND_REQUESTER, label(BOUND_REQUESTER, {DUAL: "other"}),
         _deny((IMMUTABLE, DUAL), (BOUND, DUAL))),
    Case("requester-delete-dual", BOUND_REQUESTER, label(BOUND_REQUESTER, {DUAL: None}),
         _deny((IMMUTABLE, DUAL), (BOUND, DUAL))),
    Case("requester-unprotected-label", BOUND_REQUESTER, label(BOUND_REQUESTER, {"regular-label": "yes"})),
    Case("requester-unprotected-dual-pods-annotation", BOUND_REQUESTER,
         edit(BOUND_REQUESTER, {keys.ACCELERATORS_ANNOTATION: "GPU-1"})),
    Case("requester-drop-annotations", BOUND_REQUESTER, drop(BOUND_REQUESTER, ANNOTATIONS),
         _deny((BOUND, ISC), (IMMUTABLE, STATUS))),
    Case("requester-drop-labels", BOUND_REQUESTER, drop(BOUND_REQUESTER, LABELS),
         _deny((BOUND, DUAL), (IMMUTABLE, DUAL))),
    Case("requester-retarget-by-controllers", BOUND_REQUESTER,
         label(edit(BOUND_REQUESTER, {ISC: "other"}), {DUAL: None}), user=CONTROLLERS),
    # An unbound requester (validate.sh tests 7 and 8): its ISC annotation is the user's to change.
    Case("unbound-change-isc", UNBOUND_REQUESTER, edit(UNBOUND_REQUESTER, {ISC: "new-unbound-config"})),
    Case("unbound-delete-isc", UNBOUND_REQUESTER, edit(UNBOUND_REQUESTER, {ISC: None})),
    Case("unbound-add-label", UNBOUND_REQUESTER, label(UNBOUND_REQUESTER, {"regular-label": "yes"})),
    Case("unbound-forge-status", UNBOUND_REQUESTER, edit(UNBOUND_REQUESTER, {STATUS: "{}"}),
         _deny((IMMUTABLE, STATUS))),
    # Half bound (an empty dual label, or an empty ISC annotation) is not bound for FMA.
    Case("half-bound-change-isc", HALF_BOUND, edit(HALF_BOUND, {ISC: "other"})),
    Case("empty-isc-set-isc", edit(BOUND_REQUESTER, {ISC: ""}), BOUND_REQUESTER),
    # A plain Pod (validate.sh test 9), and protected keys forged where there were none.
    Case("plain-add-label", PLAIN, label(PLAIN, {"regular-label": "yes"})),
    Case("plain-drop-all-metadata", PLAIN, drop(PLAIN, LABELS, ANNOTATIONS)),
    Case("plain-forge-requester", PLAIN, edit(PLAIN, {REQUESTER: "uid-x x"}), _deny((IMMUTABLE, REQUESTER))),
    Case("plain-forge-empty-launcher-config-name", PLAIN, label(PLAIN, {LAUNCHER_CONFIG_NAME: ""}),
         _deny((IMMUTABLE, LAUNCHER_CONFIG_NAME))),
    Case("plain-forge-binding", PLAIN, label(edit(PLAIN, {ISC: "smol"}), {DUAL: "launcher-1"}),
         _deny((IMMUTABLE, DUAL))),
    Case("plain-forge-requester-by-controllers", PLAIN, edit(PLAIN, {REQUESTER: "uid-x x"}), user=CONTROLLERS),
    # No labels or annotations at all, on either side: nothing to index, and nothing may fail.
    Case("bare-to-bare", BARE, {**BARE, "spec": {"containers": [], "activeDeadlineSeconds": 5}}),
    Case("bare-add-label", BARE, label(BARE, {"regular-label": "yes"})),
    Case("bare-forge-instance-id", BARE, edit(BARE, {INSTANCE_ID: "abc"}), _deny((IMMUTABLE, INSTANCE_ID))),
    Case("bare-forge-dual", BARE, label(BARE, {DUAL: "x"}), _deny((IMMUTABLE, DUAL))),
    Case("bare-to-bare-by-controllers", BARE, copy.deepcopy(BARE), user=CONTROLLERS),
]  # fmt: skip


# --- the API server's verdicts ------------------------------------------------------------------------------


@pytest.fixture
async def policies(cluster: LoopbackCluster, api: client.ApiClient) -> AsyncIterator[list[Obj]]:
    """config/validating-admission-policies.yaml applied as FMA's installer applies it, once the API server has
    type-checked it; deleted afterwards (the policies are cluster-wide)."""
    await kubectl(cluster, "apply", "-f", str(CONCATENATED))
    admission = client.AdmissionregistrationV1Api(api)

    async def checked() -> list[Obj]:
        found: list[Obj] = []
        for name in (IMMUTABLE, BOUND):
            policy = api.sanitize_for_serialization(await admission.read_validating_admission_policy(name))
            status = policy.get("status") or {}
            if status.get("observedGeneration") != policy["metadata"]["generation"] or "typeChecking" not in status:
                return []
            found.append(policy)
        return found

    try:
        found = await wait_for(checked, what="the policies type-checked by the API server", within=60)
        await _wait_admission(api, enforced=True)
        yield found
    finally:
        await kubectl(cluster, "delete", "--ignore-not-found", "-f", str(CONCATENATED))
        await _wait_admission(api, enforced=False)


# Edits of a bound requester that only one policy refuses, each: the probes of _wait_admission.
PROBES = {IMMUTABLE: {STATUS: '{"Errors":["forged"]}'}, BOUND: {ISC: "other"}}


async def _wait_admission(api: client.ApiClient, enforced: bool) -> None:
    """Until the API server's admission (which learns of policies through a watch of its own) enforces both policies,
    or neither: for each policy, a dry-run edit by the admin (not exempt) that only it refuses is refused by it, or
    admitted. Each test applies and deletes the policies, so without the wait for neither a test could be judged by
    the previous test's policies, still in that cache, and then by none (seen under load: an edit admitted)."""
    core = client.CoreV1Api(api)
    name = "policy-probe"
    metadata = {k: BOUND_REQUESTER["metadata"][k] for k in ("labels", "annotations")}
    await core.create_namespaced_pod("default", {
        "metadata": {"name": name, **metadata},
        "spec": {**BOUND_REQUESTER["spec"], "schedulingGates": [HOLD]},
    })  # fmt: skip

    async def refused_by(policy: str) -> bool:
        edit = {"metadata": {"annotations": PROBES[policy]}}
        try:
            await core.patch_namespaced_pod(name, "default", edit, dry_run="All")
        except ApiException as error:
            message = _message(error)
            if error.status == 422 and [p for p, _ in DENIED.findall(message)] == [policy]:
                return True
            raise
        return False

    async def settled() -> bool:
        return all([await refused_by(policy) == enforced for policy in PROBES])

    try:
        await wait_for(settled, what=f"the policies {'enforced' if enforced else 'lifted'}", within=30)
    finally:
        await core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def _message(error: ApiException) -> str:
    """The message of the API server's Status in a refusal ("" when it sent none)."""
    return str(json.loads(error.body).get("message", "")) if error.body else ""


async def _as(cluster: LoopbackCluster, username: str) -> client.ApiClient:
    """A client acting as `username` (the admin impersonating it)."""
    impersonating = await cluster.api_client()
    impersonating.set_default_header("Impersonate-User", username)
    return impersonating


async def _grant_edit(api: client.ApiClient, namespace: str, usernames: list[str]) -> None:
    """Kubernetes' `edit` role in `namespace` for each user, so that only the policies can refuse their edits."""
    subjects = [{"kind": "User", "name": name, "apiGroup": "rbac.authorization.k8s.io"} for name in usernames]
    await client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(namespace, {
        "metadata": {"name": "editors"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": subjects,
    })  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    """The API server's answer to one edit: the denials (policy, message) it gave, none if it admitted the edit."""

    denials: list[tuple[str, str]]

    @property
    def denied(self) -> set[tuple[str, str]]:
        """The (policy, key) pairs the denials name."""
        return {(policy, key) for policy, text in self.denials for key in PROTECTED_KEYS if f" {key} " in text}


async def _verdict(cluster: LoopbackCluster, api: client.ApiClient, namespace: str, name: str, old: Obj, new: Obj,
                   username: str) -> Verdict:  # fmt: skip
    """Create `old` (held unscheduled), then PUT `new`'s metadata maps (and activeDeadlineSeconds) over it as
    `username`. Any refusal but the policies' (a 422 naming them) fails the test."""
    core = client.CoreV1Api(api)
    metadata = {k: v for k, v in old["metadata"].items() if k in ("labels", "annotations")}
    spec = {**old["spec"], "schedulingGates": [HOLD]}
    created = await core.create_namespaced_pod(namespace, {"metadata": {"name": name, **metadata}, "spec": spec})
    body = api.sanitize_for_serialization(created)
    for field in ("labels", "annotations"):
        body["metadata"].pop(field, None)
        if field in new["metadata"]:
            body["metadata"][field] = new["metadata"][field]
    if "activeDeadlineSeconds" in new["spec"]:
        body["spec"]["activeDeadlineSeconds"] = new["spec"]["activeDeadlineSeconds"]
    async with await _as(cluster, username) as acting:
        try:
            await client.CoreV1Api(acting).replace_namespaced_pod(name, namespace, body)
        except ApiException as error:
            message = _message(error)
            status, denials = error.status, DENIED.findall(message)
        else:
            return Verdict([])
    if status != 422 or not denials:
        pytest.fail(f"{name}: refused, but not by the policies: {status} {message}")
    return Verdict(denials)


def test_case_ids_are_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


def test_the_api_server_type_checks_every_expression_without_a_warning(policies: list[Obj]) -> None:
    for policy in policies:
        checking = policy["status"]["typeChecking"]
        assert not checking.get("expressionWarnings"), (policy["metadata"]["name"], checking)


async def test_the_api_server_judges_every_edit_as_the_table_says(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, policies: list[Obj]
) -> None:
    """Each case's denial names exactly the (policy, key) pairs it expects (the API server may report several
    denials in one answer); nothing else fails."""
    await _grant_edit(api, namespace, [USER, CONTROLLERS])
    wrong = {}
    for case in CASES:
        name = re.sub(r"[^a-z0-9-]", "-", case.id)[:60]
        verdict = await _verdict(cluster, api, namespace, name, case.old, case.new, case.user)
        denied = verdict.denied
        if len(denied) != len(verdict.denials) or not denied <= case.denied or bool(denied) != bool(case.denied):
            wrong[case.id] = (verdict.denials, sorted(case.denied))
    assert not wrong, wrong


async def test_denial_messages_say_who_manages_the_key(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, policies: list[Obj]
) -> None:
    await _grant_edit(api, namespace, [USER])
    expected = {
        "launcher-change-requester": f"The annotation {keys.REQUESTER_ANNOTATION} is managed by FMA controllers and "
        "cannot be modified directly.",
        "requester-delete-isc": f"The annotation {ISC} cannot be modified once the server-requesting pod is bound to "
        "a providing pod.",
    }
    for case_id, message in expected.items():
        case = next(c for c in CASES if c.id == case_id)
        verdict = await _verdict(cluster, api, namespace, case_id, case.old, case.new, USER)
        assert [text for _, text in verdict.denials] == [message]


@pytest.mark.parametrize(
    ("username", "exempt"),
    [
        (CONTROLLERS, True),
        ("system:serviceaccount:dualpods-system:dualpods-fma-controllers", True),
        ("system:serviceaccount:other-team:x-fma-controllers", True),  # FMA's contract: any namespace, any prefix
        ("system:serviceaccount:ns:fma-controllers", False),  # the suffix needs its dash
        ("system:serviceaccount:ns:rel-fma-controllers-x", False),
        ("rel-fma-controllers", False),
        ("system:serviceaccount:ns:dual-pods-controller", False),
    ],
)
async def test_only_fma_controller_service_accounts_are_exempt(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, policies: list[Obj], username: str, exempt: bool
) -> None:
    await _grant_edit(api, namespace, [username])
    for index, (old, new) in enumerate(PROTECTED_EDITS):
        verdict = await _verdict(cluster, api, namespace, f"edit-{index}", old, new, username)
        assert bool(verdict.denials) is not exempt, verdict


# --- the chart's policies over a requester the controllers bound ---------------------------------------------


async def test_the_charts_policy_refuses_a_users_status_edit_and_lets_the_controllers_write_it(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    async with installed(cluster, api, namespace, tmp_path, "admissionPolicies.enabled=true") as env:
        admission = client.AdmissionregistrationV1Api(api)
        await wait_for(lambda: admission.read_validating_admission_policy(IMMUTABLE), what="the chart's policy")
        await env.create_launcher_config("lc", max_instances=1, launcher_args=["--stand-in"])
        await env.create_isc("isc", "lc", port=8005, options="--model a")
        await env.create_requesters("rs", "isc")
        requester = await env.ready_requester("rs")
        # The controllers bound it and wrote its status after the policies were in place.
        assert keys.STATUS_ANNOTATION in requester["metadata"]["annotations"]
        assert requester["metadata"]["labels"][keys.DUAL_LABEL]

        await _grant_edit(api, namespace, [USER])
        forged = {"metadata": {"annotations": {keys.STATUS_ANNOTATION: '{"Errors":["forged"]}'}}}
        async with await _as(cluster, USER) as acting:
            with pytest.raises(ApiException) as refused:
                await client.CoreV1Api(acting).patch_namespaced_pod(requester["metadata"]["name"], namespace, forged)
        assert refused.value.status == 422
        assert DENIED.findall(json.loads(refused.value.body or "{}")["message"]) == [
            (IMMUTABLE, f"The annotation {keys.STATUS_ANNOTATION} is managed by FMA controllers and cannot be "
                        "modified directly.")
        ]  # fmt: skip
