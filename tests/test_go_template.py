"""The server-patch annotation: the Go template subset, and the YAML read as Go reads it. The YAML cases, and the
whole annotation-to-Pod path, are checked against kubectl, which reads a YAML patch with the same
`sigs.k8s.io/yaml` that FMA uses (see tests/test_strategic_merge.py for the oracle)."""

from typing import Any, Final

import pytest

from gocompat.go_template import (
    GoTemplateError,
    PatchYAMLError,
    load_patch_yaml,
    render_server_patch,
    render_template,
)
from gocompat.strategic_merge import apply_strategic_merge_patch, pod_schema
from tests.test_strategic_merge import POD, as_go_json, kubectl_patch

DATA: Final = {"NodeName": "node-1", "LocalVolume": "pvc-node-1"}


@pytest.mark.parametrize(
    ("source", "rendered"),
    [
        ("plain text, no actions: {} } {", "plain text, no actions: {} } {"),
        ("host: {{ .NodeName }}", "host: node-1"),
        ("host: {{.NodeName}}", "host: node-1"),
        ("host: {{\n  .NodeName\n}}", "host: node-1"),
        ('"{{ .NodeName }}-{{ .LocalVolume }}"', '"node-1-pvc-node-1"'),
        ("a:  \n {{- .NodeName }}", "a:node-1"),
        ("{{ .NodeName -}} \t\n b", "node-1b"),
        ("x {{- .NodeName -}} y", "xnode-1y"),
        ("x {{- /* only a comment */ -}} y", "xy"),
        ("x {{/* a comment\n over lines, with }} inside */}} y", "x  y"),
        ("x {{/* c */ -}}\n  y", "x y"),
        ("{{ .NodeName }}{{- .LocalVolume }}", "node-1pvc-node-1"),
    ],
)
def test_renders_like_go(source: str, rendered: str) -> None:
    assert render_template(source, DATA) == rendered


def test_values_are_inserted_as_they_are() -> None:
    assert render_template("{{ .NodeName }}", {"NodeName": "a: {b}\n"}) == "a: {b}\n"


@pytest.mark.parametrize("source", ["{{ .Nope }}", "line\nline\n  {{ .LocalVolume }}"])
def test_missing_key_is_an_error_naming_it(source: str) -> None:
    key = source.rpartition(".")[2].strip(" }")
    with pytest.raises(GoTemplateError, match=f"no value for key '{key}'"):
        render_template(source, {"NodeName": "n"})


def test_missing_key_error_gives_the_line() -> None:
    with pytest.raises(GoTemplateError, match="line 3"):
        render_template("a\nb\n{{ .LocalVolume }}", {"NodeName": "n"})


def test_empty_local_volume_renders_as_fma_does() -> None:
    """FMA's data is a struct whose LocalVolume is never filled: it renders as empty text, not an error."""
    assert render_template("claim: '{{ .LocalVolume }}'", {"NodeName": "n", "LocalVolume": ""}) == "claim: ''"


@pytest.mark.parametrize(
    "source",
    [
        "{{ if .NodeName }}x{{ end }}",
        "{{ range .NodeName }}{{ end }}",
        "{{ .NodeName | printf }}",
        '{{ printf "%s" .NodeName }}',
        "{{ quote .NodeName }}",
        "{{ . }}",
        "{{ .NodeName.Sub }}",
        "{{ $x := .NodeName }}",
        '{{ "literal" }}',
        "{{ 3 }}",
        '{{ template "t" }}',
        "{{ with .NodeName }}{{ end }}",
        "{{}}",
        "{{-.NodeName}}",
        "{{ .NodeName-}}",
    ],
)
def test_unsupported_constructs_are_refused(source: str) -> None:
    with pytest.raises(GoTemplateError, match="unsupported template construct"):
        render_template(source, DATA)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("a {{ .NodeName", "unclosed action"),
        ("{{/* never closed", "comment must end"),
        ("{{/* c */ x }}", "comment must end"),
    ],
)
def test_malformed_templates_are_refused(source: str, message: str) -> None:
    with pytest.raises(GoTemplateError, match=message):
        render_template(source, DATA)


# YAML scalars whose type differs between YAML 1.1 readers; each one goes through kubectl's reading too.
YAML_SCALARS: Final = [
    "y", "Y", "n", "yes", "on", "Off", "true", "~", "null", "", "=", "-", "+", ".",
    "1e3", "1E+3", "1.0", "1.", ".5", "-.5", "+1", "0777", "08", "09.5", "0_7", "1_000", "1_0.5", "0x1F", "-0x1f",
    "0o17", "0b101", "0x", "1e", "1:30", "0.0.1", "2024-01-01", "2001-12-14t21:59:43.10-05:00", "12abc",
    "123456789012345678", "12345678901234567890", "-9223372036854775809", "1e20", "1.5e300", "1e21",
]  # fmt: skip


@pytest.mark.parametrize("scalar", YAML_SCALARS)
def test_yaml_scalars_read_as_go_reads_them(scalar: str) -> None:
    text = f"metadata:\n  annotations:\n    a: {scalar}\n    b: [{scalar}]\n"
    assert_yaml_like_kubectl(text)


@pytest.mark.parametrize(
    "text",
    [
        "metadata:\n  labels:\n    1: int\n    true: bool\n    y: bool too\n    0x10: hex\n",
        "metadata:\n  labels:\n    base: &base {a: '1'}\n    merged:\n      <<: *base\n      b: '2'\n",
        "metadata: {labels: {x: 'y'}}\n---\nspec: {hostname: second}\n",
        "# only a comment\n",
        "",
    ],
)
def test_yaml_documents_read_as_go_reads_them(text: str) -> None:
    assert_yaml_like_kubectl(text)


def assert_yaml_like_kubectl(text: str) -> None:
    """Same Pod as kubectl (which refuses an empty patch: that one patches nothing), or both refuse the YAML."""
    expected = kubectl_patch(POD, text) if text else POD
    if expected is None:
        with pytest.raises(PatchYAMLError):
            load_patch_yaml(text)
    else:
        got = apply_strategic_merge_patch(POD, load_patch_yaml(text), pod_schema())
        assert as_go_json(got) == as_go_json(expected)


@pytest.mark.parametrize(
    ("text", "message", "go_refuses"),
    [
        ("metadata: [unclosed", "not valid YAML", True),
        ("- a list\n", "must be a YAML mapping", True),
        ("just text\n", "must be a YAML mapping", True),
        ("metadata:\n  annotations:\n    a: .inf\n", "JSON cannot hold", True),
        ("metadata:\n  labels:\n    ~: null key\n", "mapping key None", True),
        # Go reads these, as a string of the decoded bytes and as the key "1.5"; neither belongs in a Pod patch.
        ("metadata:\n  annotations:\n    a: !!binary aGk=\n", "JSON cannot hold", False),
        ("metadata:\n  labels:\n    1.5: float key\n", "mapping key 1.5", False),
    ],
)
def test_bad_yaml_is_refused_clearly(text: str, message: str, go_refuses: bool) -> None:
    with pytest.raises(PatchYAMLError, match=message):
        load_patch_yaml(text)
    assert (kubectl_patch(POD, text) is None) == go_refuses


# Server patches as FMA users write them (test/e2e/mkrs.sh and the direct-mode docs of FMA).
ANNOTATIONS: Final = {
    "fma e2e": """
metadata:
  labels: {
    "model-reg": "ibm-granite",
    "model-repo": "granite-3.3-2b-instruct",
    "app": null}
spec:
  containers:
  - name: inference-server
    image: test-server:latest
    command: [ /ko-app/test-server ]
    resources:
      limits:
        cpu: "2"
        memory: 9Gi
    readinessProbe:
      httpGet:
        path: /health
        port: 8000
      initialDelaySeconds: 10
      periodSeconds: 5
""",
    "node and local volume": """
{{/* Pin to the requester's node and serve from the node's model cache. */}}
metadata:
  labels:
    app: null
spec:
  nodeSelector:
    kubernetes.io/hostname: "{{ .NodeName }}"
  containers:
  - name: inference-server
    image: vllm/vllm-openai:v0.11.0
    command: ["vllm", "serve", "/models/granite", "--port", "8000"]
    env:
    - name: NODE
      value: {{ .NodeName }}
    volumeMounts:
    - name: models
      mountPath: /models
      readOnly: true
  volumes:
  - name: models
    $retainKeys: [name, persistentVolumeClaim]
    persistentVolumeClaim:
      claimName: {{ .LocalVolume -}}
""",
    "trimmed and gpu": """
spec:
  containers:
  - name: inference-server
    {{- /* the provider gets the GPU through CUDA_VISIBLE_DEVICES, not the device plugin */}}
    resources:
      limits: {nvidia.com/gpu: null, memory: 16Gi}
      requests: {nvidia.com/gpu: null}
  tolerations:
  - {key: node-{{ .NodeName }}, operator: Exists}
""",
}


@pytest.mark.parametrize("annotation", ANNOTATIONS.values(), ids=ANNOTATIONS.keys())
def test_annotation_to_pod_matches_kubectl(annotation: str) -> None:
    rendered = render_template(annotation, DATA)
    expected = kubectl_patch(POD, rendered)
    got: dict[str, Any] = apply_strategic_merge_patch(POD, render_server_patch(annotation, DATA), pod_schema())
    assert expected is not None
    assert as_go_json(got) == as_go_json(expected)
    assert "{{" not in as_go_json(got)


def test_annotation_with_unknown_key_fails_before_yaml() -> None:
    with pytest.raises(GoTemplateError, match="'Node'"):
        render_server_patch("spec: {nodeName: {{ .Node }}}", DATA)
