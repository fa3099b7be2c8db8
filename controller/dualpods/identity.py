"""What instance a requester asks for through an InferenceServerConfig, on given GPUs, and its ID.

The ID hashes the ISC's model-server config, the runtime, whether LoRA is on, and the GPUs — not the
launcher: "the same model server on the same GPUs" is the hot-start match, whichever launcher holds it.
LoRA adapters themselves are not part of it: they change at run time (E8). The `I…i` wrapper keeps
the ID a valid label value.

For a vLLM instance without LoRA the ID is FMA's, byte for byte, so that instances FMA's controller
created are found and woken here after a migration (and the other way round): `I` + base64url (unpadded)
of SHA-256 over the YAML that Go's `sigs.k8s.io/yaml.Marshal` writes for the `modelServerConfig` (FMA's
five fields, empty ones left out; see `gocompat.goyaml`), then `;gpus=` and the GPU UUIDs joined by
commas, + `i`. Our extensions append `;runtime=<runtime>` (not vLLM) and `;lora` after the YAML, so
they never collide with an FMA ID.
"""

import base64
import hashlib
import shlex
from collections.abc import Mapping
from typing import Any

from api import keys
from api.crds import InferenceServerConfig, LauncherConfig
from api.launcher import VllmConfig
from controller.dualpods.memory_budget import gpu_sleeper_reserve
from gocompat import goyaml

VLLM = "vllm"
TRANSFORMERS = "transformers"
# Annotation values and the runtime each selects (E4).
RUNTIME_VALUES = {"vllm": VLLM, "huggingface": TRANSFORMERS, "transformers": TRANSFORMERS}


def runtime_of(requester_annotations: Mapping[str, str], isc_annotations: Mapping[str, str]) -> str:
    """The runtime asked for; the requester Pod's annotation wins over the ISC's. ValueError (with
    what is wrong and what would be right) for an unknown value: never a silent default."""
    for where, annotations in (
        ("the requester Pod", requester_annotations),
        ("the InferenceServerConfig", isc_annotations),
    ):
        chosen: dict[str, str] = {}
        for key in (keys.RUNTIME_ANNOTATION, keys.RUNTIME_ANNOTATION_ALIAS):
            if key not in annotations:
                continue
            runtime = RUNTIME_VALUES.get(annotations[key].strip().lower())
            if runtime is None:
                raise ValueError(
                    f"{key}: {annotations[key]!r} on {where} is not a runtime; use one of {', '.join(RUNTIME_VALUES)}"
                )
            chosen[key] = runtime
        if len(set(chosen.values())) > 1:
            raise ValueError(f"{where} asks for two runtimes: {chosen}")
        if chosen:
            return next(iter(chosen.values()))
    return VLLM


def fma_model_server_config(isc: InferenceServerConfig) -> dict[str, Any]:
    """The `modelServerConfig` as FMA's Go type encodes it: port always, the rest only when not empty."""
    server = isc.spec.model_server_config
    fields: dict[str, Any] = {
        "port": server.port,
        "options": server.options,
        "env_vars": dict(server.env_vars),
        "labels": dict(server.labels),
        "annotations": dict(server.annotations),
    }
    return {name: value for name, value in fields.items() if value or name == "port"}


def instance_id(isc: InferenceServerConfig, gpu_uuids: list[str], runtime: str = VLLM) -> str:
    config = goyaml.marshal(fma_model_server_config(isc))
    extras = (f";runtime={runtime}" if runtime != VLLM else "") + (";lora" if isc.spec.lora_adapters else "")
    digest = hashlib.sha256(f"{config}{extras};gpus={','.join(gpu_uuids)}".encode()).digest()
    return "I" + base64.urlsafe_b64encode(digest).decode().rstrip("=") + "i"


def vllm_config(
    isc: InferenceServerConfig,
    gpu_uuids: list[str],
    runtime: str = VLLM,
    sleeper_reserve_bytes: int | None = None,
    verify_wakes: bool | None = None,
) -> VllmConfig:
    """The create body of the instance; `verify_wakes` is the LauncherConfig's (None: the launcher's default)."""
    server = isc.spec.model_server_config
    options = [server.options, f"--port {server.port}"]
    env = dict(server.env_vars)
    if isc.spec.lora_adapters:
        # Loaded at start, then kept in step with the ISC at run time (E8).
        if "--enable-lora" not in shlex.split(server.options):
            options.append("--enable-lora")
        options.append("--lora-modules " + " ".join(shlex.quote(f"{a.name}={a.path}") for a in isc.spec.lora_adapters))
        env.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    return VllmConfig(
        options=" ".join(o for o in options if o).strip(),
        gpu_uuids=gpu_uuids,
        env_vars=env or None,
        annotations={keys.INSTANCE_ISC_NAME: isc.metadata.name, keys.INSTANCE_INFERENCE_PORT: str(server.port)},
        runtime=runtime if runtime != VLLM else None,
        gpu_sleeper_reserve_bytes=sleeper_reserve_bytes,
        verify_wakes=verify_wakes,
    )


def launcher_instance_config(
    isc: InferenceServerConfig, lc: LauncherConfig, gpus: list[str], runtime: str
) -> VllmConfig:
    """The create body of `isc`'s instance on `gpus` in a launcher made from `lc` (its sleeper reserve and
    wake checks)."""
    budget = lc.spec.sleeper_budget.gpu_memory_bytes
    reserve = gpu_sleeper_reserve(int(budget) if budget is not None else None, lc.spec.max_instances)
    return vllm_config(isc, gpus, runtime, reserve, lc.spec.verify_wakes)
