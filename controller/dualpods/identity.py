"""What instance an InferenceServerConfig asks for on given GPUs, and its ID.

The ID hashes the ISC's model-server config and the GPUs, not the launcher: "the same model server on
the same GPUs" is the hot-start match, whichever launcher holds it. The `I…i` wrapper keeps the ID a
valid label value.
"""

import base64
import hashlib
import json

from api import keys
from api.crds import InferenceServerConfig
from api.launcher import VllmConfig


def instance_id(isc: InferenceServerConfig, gpu_uuids: list[str]) -> str:
    config = json.dumps(isc.spec.model_server_config.to_k8s(), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(f"{config};gpus={','.join(gpu_uuids)}".encode()).digest()
    return "I" + base64.urlsafe_b64encode(digest).decode().rstrip("=") + "i"


def vllm_config(isc: InferenceServerConfig, gpu_uuids: list[str]) -> VllmConfig:
    server = isc.spec.model_server_config
    return VllmConfig(
        options=f"{server.options} --port {server.port}".strip(),
        gpu_uuids=gpu_uuids,
        env_vars=dict(server.env_vars) or None,
        annotations={keys.INSTANCE_ISC_NAME: isc.metadata.name, keys.INSTANCE_INFERENCE_PORT: str(server.port)},
    )
