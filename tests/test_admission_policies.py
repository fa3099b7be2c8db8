"""FMA's admission policies: config/validating-admission-policies/ is generated from the chart's template, is valid
for Kubernetes 1.30+, and every CEL expression in it, run as the API server runs it, denies each protected change
and admits the rest. Kubernetes 1.20 (the loopback cluster) cannot run ValidatingAdmissionPolicies, so a Python
CEL implementation (cel-python) evaluates them on old/new Pod pairs here.

`.venv/bin/python -m scripts.admission_policies` regenerates config/ from the chart.
"""

import copy
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from api import keys
from e2e.chart import CHART
from scripts.admission_policies import CONCATENATED, CONFIG_DIR, POLICY_KINDS, generated_files
from scripts.helm_chart import REPO, render_chart, run_helm

IMMUTABLE = "fma-immutable-fields"
BOUND = "fma-bound-serverreqpod"
Obj = dict[str, Any]


@pytest.mark.parametrize(("release", "namespace"), [("dualpods", "dualpods-system"), ("team-a", "models")])
def test_config_is_the_charts_rendering_for_any_release(release: str, namespace: str) -> None:
    """One source of truth; and no release-specific text, so one copy serves every install."""
    on_disk = {path: path.read_text() for path in [*CONFIG_DIR.glob("*.yaml"), CONCATENATED] if path.exists()}
    generated = generated_files(release, namespace)
    stale = sorted(
        str(p.relative_to(REPO)) for p in on_disk.keys() | generated.keys() if on_disk.get(p) != generated.get(p)
    )
    assert not stale, f"{', '.join(stale)} differ from the chart: run `python -m scripts.admission_policies`"


def test_the_chart_renders_no_policies_unless_enabled() -> None:
    assert not [d for d in render_chart("dualpods", "dualpods-system") if d["kind"] in POLICY_KINDS]


def test_the_chart_refuses_policies_before_kubernetes_1_30() -> None:
    """A clear message at install rather than the API server's "no matches for kind"."""
    args = ("template", "dualpods", str(CHART), "--set=admissionPolicies.enabled=true", "--kube-version")
    refused = run_helm(*args, "v1.29.4")
    assert refused.returncode != 0
    assert "admissionPolicies.enabled needs Kubernetes >= 1.30" in refused.stderr
    assert run_helm(*args, "v1.30.0-eks-1a2b3c").returncode == 0


@pytest.mark.parametrize(("release", "namespace"), [("dualpods", "dualpods-system"), ("my-models", "team-b")])
def test_the_chart_exempts_its_own_service_account(release: str, namespace: str) -> None:
    docs = render_chart(release, namespace, "admissionPolicies.enabled=true")
    (deployment, *_) = [d for d in docs if d["kind"] == "Deployment"]
    controller_account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    (account,) = [
        d["metadata"] for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == controller_account
    ]
    controllers = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    policies = [compile_policy(d) for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    assert len(policies) == 2
    for old, new in PROTECTED_EDITS:
        assert [d for p in policies for d in admit(p, old, new, USER).denials]
        assert not [d for p in policies for d in admit(p, old, new, controllers).denials]
    for doc in docs:
        if doc["kind"] in POLICY_KINDS:
            assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == release


# --- the manifests ------------------------------------------------------------------------------------------


def manifests() -> list[Obj]:
    return [doc for path in sorted(CONFIG_DIR.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())]


def _minor(version: str) -> int:
    return int(version.split(".")[1])


SUPPORTED = sorted({v for v in kubernetes_validate.utils.all_versions() if _minor(v) >= 30}, key=_minor)


@pytest.mark.parametrize("version", SUPPORTED)
def test_manifests_are_valid_kubernetes_objects(version: str) -> None:
    docs = manifests()
    assert sorted(d["kind"] for d in docs) == sorted(POLICY_KINDS * 2)
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_manifests_need_kubernetes_1_30() -> None:
    """admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy went GA in 1.30: 1.29 has no such schema."""
    with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
        kubernetes_validate.validate(manifests()[0], "1.29.0", strict=True)


def test_policies_and_bindings_match_pod_updates_and_deny() -> None:
    docs = {d["metadata"]["name"]: d for d in manifests()}
    assert set(docs) == {IMMUTABLE, BOUND, f"bind-{IMMUTABLE}", f"bind-{BOUND}"}
    pod_updates = {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                      "operations": ["UPDATE"]}]}  # fmt: skip
    for name in (IMMUTABLE, BOUND):
        spec, binding = docs[name]["spec"], docs[f"bind-{name}"]["spec"]
        assert (spec["failurePolicy"], spec["matchConstraints"]) == ("Fail", pod_updates)
        assert binding == {"policyName": name, "matchResources": pod_updates, "validationActions": ["Deny"]}
        for validation in spec["validations"]:
            # The API server requires a message, without line breaks, for a multi-line expression.
            assert validation["message"]
            assert "\n" not in validation["message"]


# --- evaluating the policies as the API server does ---------------------------------------------------------


@dataclass(frozen=True)
class Expression:
    """A compiled CEL expression of a policy; `where` names it in test output (e.g. validations[2])."""

    where: str
    text: str
    program: celpy.Runner


@dataclass(frozen=True)
class Policy:
    name: str
    match_conditions: list[Expression]
    variables: list[tuple[str, Expression]]
    validations: list[tuple[Expression, str]]

    def expressions(self) -> Iterator[Expression]:
        yield from self.match_conditions
        yield from (e for _, e in self.variables)
        yield from (e for e, _ in self.validations)


@cache
def _environment() -> celpy.Environment:
    return celpy.Environment()


def _compile(where: str, text: str) -> Expression:
    env = _environment()
    return Expression(where, text, env.program(env.compile(text)))


def compile_policy(doc: Obj) -> Policy:
    spec = doc["spec"]
    conditions, variables = spec.get("matchConditions", []), spec.get("variables", [])
    return Policy(
        name=doc["metadata"]["name"],
        match_conditions=[_compile(f"matchConditions[{c['name']}]", c["expression"]) for c in conditions],
        variables=[(v["name"], _compile(f"variables[{v['name']}]", v["expression"])) for v in variables],
        validations=[
            (_compile(f"validations[{i}]", v["expression"]), v["message"]) for i, v in enumerate(spec["validations"])
        ],
    )


@cache
def policies() -> tuple[Policy, ...]:
    return tuple(compile_policy(d) for d in manifests() if d["kind"] == "ValidatingAdmissionPolicy")


# What each expression evaluated to, across calls: True/False, or for a variable whether its map was empty.
Outcomes = dict[tuple[str, str], set[object]]


@dataclass
class Decision:
    """One policy's verdict on one request; `errors` would reject it too (failurePolicy: Fail)."""

    applies: bool = True
    denials: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _run(expression: Expression, activation: Mapping[str, Any]) -> celtypes.Value | CELEvalError:
    try:
        return expression.program.evaluate(activation)
    except CELEvalError as error:
        return error


def _boolean(policy: Policy, expression: Expression, activation: Mapping[str, Any], decision: Decision,
             seen: Outcomes | None) -> bool | None:  # fmt: skip
    """The expression's truth value, or None after recording an evaluation error (a non-bool result is one)."""
    result = _run(expression, activation)
    if not isinstance(result, celtypes.BoolType):
        decision.errors.append(f"{policy.name} {expression.where}: {result!r}")
        return None
    if seen is not None:
        seen.setdefault((policy.name, expression.where), set()).add(bool(result))
    return bool(result)


def request(username: str, new: Obj) -> Obj:
    """The AdmissionRequest attributes a policy sees for a Pod update."""
    return {
        "operation": "UPDATE",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": new["metadata"]["name"],
        "namespace": new["metadata"]["namespace"],
        "userInfo": {"username": username, "groups": ["system:authenticated"]},
        "dryRun": False,
    }


def admit(policy: Policy, old: Obj, new: Obj, username: str, seen: Outcomes | None = None) -> Decision:
    """The API server's order: all matchConditions (any false: the policy is skipped), then the variables, then every
    validation (false: deny with its message). Any evaluation error is recorded; with failurePolicy Fail it rejects."""
    activation: dict[str, Any] = {
        "object": json_to_cel(new),
        "oldObject": json_to_cel(old),
        "request": json_to_cel(request(username, new)),
    }
    decision = Decision()
    matched = [_boolean(policy, e, activation, decision, seen) for e in policy.match_conditions]
    if False in matched:
        return Decision(applies=False)
    variables: dict[celtypes.StringType, Any] = {}
    for name, expression in policy.variables:
        value = _run(expression, activation | {"variables": celtypes.MapType(variables)})
        if isinstance(value, CELEvalError):
            decision.errors.append(f"{policy.name} {expression.where}: {value!r}")
        elif seen is not None:
            seen.setdefault((policy.name, expression.where), set()).add(bool(value))
        variables[celtypes.StringType(name)] = value
    activation["variables"] = celtypes.MapType(variables)
    for expression, message in policy.validations:
        if _boolean(policy, expression, activation, decision, seen) is False:
            decision.denials.append(message)
    return decision


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


def evaluate(case: Case, seen: Outcomes | None = None) -> tuple[set[tuple[str, str]], list[str], list[str]]:
    """The (policy, key) pairs a case is denied for, the denial messages, and any evaluation errors."""
    decisions = [(p.name, admit(p, case.old, case.new, case.user, seen)) for p in policies()]
    messages = [(name, m) for name, d in decisions for m in d.denials]
    denied = {(name, key) for name, m in messages for key in PROTECTED_KEYS if f" {key} " in m}
    return denied, [m for _, m in messages], [e for _, d in decisions for e in d.errors]


def test_case_ids_are_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_admission(case: Case) -> None:
    denied, messages, errors = evaluate(case)
    assert not errors, "an evaluation error rejects the update (failurePolicy: Fail)"
    assert len(messages) == len(denied), f"each denial names one key: {messages}"
    assert denied == case.denied, messages


def test_denial_messages_say_who_manages_the_key() -> None:
    _, messages, _ = evaluate(next(c for c in CASES if c.id == "launcher-change-requester"))
    assert messages == [
        f"The annotation {keys.REQUESTER_ANNOTATION} is managed by FMA controllers and cannot be modified directly."
    ]
    _, messages, _ = evaluate(next(c for c in CASES if c.id == "requester-delete-isc"))
    assert messages == [
        f"The annotation {ISC} cannot be modified once the server-requesting pod is bound to a providing pod."
    ]


def test_every_expression_both_admits_and_denies() -> None:
    """Each matchCondition and validation is true in some case and false in another; each variable sees a Pod with
    and without its map. An expression that cannot change its answer protects nothing (or everything)."""
    seen: Outcomes = {}
    for case in CASES:
        evaluate(case, seen)
    for policy in policies():
        for expression in policy.expressions():
            outcomes = seen.get((policy.name, expression.where), set())
            assert outcomes == {True, False}, f"{policy.name} {expression.where} only {outcomes}: {expression.text}"


@pytest.mark.parametrize(
    ("username", "exempt"),
    [
        (CONTROLLERS, True),
        ("system:serviceaccount:dualpods-system:dualpods-fma-controllers", True),
        ("system:serviceaccount:other-team:x-fma-controllers", True),  # FMA's contract: any namespace, any prefix
        ("system:serviceaccount:ns:fma-controllers", False),  # the suffix needs its dash
        ("system:serviceaccount:ns:rel-fma-controllers-x", False),
        ("system:serviceaccount:a:b:rel-fma-controllers", False),
        ("system:serviceaccount::rel-fma-controllers", False),
        ("rel-fma-controllers", False),
        ("system:serviceaccount:ns:dual-pods-controller", False),
        ("", False),
    ],
)
def test_only_fma_controller_service_accounts_are_exempt(username: str, exempt: bool) -> None:
    for old, new in PROTECTED_EDITS:
        decisions = [admit(p, old, new, username) for p in policies()]
        assert not [e for d in decisions for e in d.errors]
        assert any(d.applies for d in decisions) is not exempt
        assert any(d.denials for d in decisions) is not exempt


def test_the_evaluator_reports_evaluation_errors() -> None:
    """What the no-error assertions rest on: indexing a map the Pod does not have is an error, not a false."""
    broken = compile_policy(
        {"metadata": {"name": "broken"}, "spec": {"validations": [
            {"expression": "oldObject.metadata.annotations['a'] == ''", "message": "m"}]}}
    )  # fmt: skip
    decision = admit(broken, BARE, BARE, USER)
    assert decision.errors
    assert not decision.denials
    assert admit(broken, PLAIN, PLAIN, USER).errors
