"""Annotation, label and finalizer keys of the dual-pods protocol (FMA 0.6 compatible)."""

from typing import Final

PREFIX: Final = "dual-pods.llm-d.ai/"
# FMA's rule for an InferenceServerConfig's routing labels and annotations: only these exact prefixes are reserved,
# so `app.kubernetes.io/name` or `node.k8s.io/x` may route.
RESERVED_METADATA_PREFIXES: Final = (PREFIX, "kubernetes.io/", "k8s.io/")

# Set by users on a server-requesting Pod.
SERVER_PATCH_ANNOTATION: Final = PREFIX + "server-patch"
INFERENCE_SERVER_CONFIG_ANNOTATION: Final = PREFIX + "inference-server-config"
ADMIN_PORT_ANNOTATION: Final = PREFIX + "admin-port"
DEFAULT_ADMIN_PORT: Final = 8081
INFERENCE_SERVER_CONTAINER: Final = "inference-server"

# Written by the controllers.
STATUS_ANNOTATION: Final = PREFIX + "status"
ACCELERATORS_ANNOTATION: Final = PREFIX + "accelerators"
DUAL_LABEL: Final = PREFIX + "dual"
INSTANCE_LABEL: Final = PREFIX + "instance"
SLEEPING_LABEL: Final = PREFIX + "sleeping"
REQUESTER_ANNOTATION: Final = PREFIX + "requester"
NOMINAL_ANNOTATION: Final = PREFIX + "nominal"
INSTANCE_ID_ANNOTATION: Final = PREFIX + "instance-id"
SERVER_PORT_ANNOTATION: Final = PREFIX + "server-port"
VLLM_CONFIG_ANNOTATION: Final = PREFIX + "vllm-config"
ISC_ROUTING_METADATA_ANNOTATION: Final = PREFIX + "isc-routing-metadata"
# FMA's notifier sidecar writes this on its launcher Pod when the launcher's instances change (fma.md §3.4).
INSTANCE_SIGNATURE_ANNOTATION: Final = PREFIX + "vllm-instance-signature"
LAUNCHER_CONFIG_NAME_LABEL: Final = PREFIX + "launcher-config-name"
NODE_NAME_LABEL: Final = PREFIX + "node-name"
LAUNCHER_TEMPLATE_HASH_ANNOTATION: Final = PREFIX + "launcher-populator-template-hash"
LAUNCHER_CONFIG_HASH_ANNOTATION: Final = PREFIX + "launcher-config-hash"
LAUNCHER_STUCK_LABEL: Final = PREFIX + "launcher-stuck"
# dualpods: on a launcher holding sleepers that a drain must not evict yet (the chart's launcher
# PodDisruptionBudget selects it), and when a drain of its Node was first seen (controller/dualpods/drains.py).
LAUNCHER_WARM_LABEL: Final = PREFIX + "warm"
DRAIN_STARTED_ANNOTATION: Final = PREFIX + "drain-started"
COMPONENT_LABEL: Final = "app.kubernetes.io/component"
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
GPU_RESOURCE: Final = "nvidia.com/gpu"
LAUNCHER_COMPONENT: Final = "launcher"

PROVIDER_FINALIZER: Final = PREFIX + "provider"
REQUESTER_FINALIZER: Final = PREFIX + "requester"

# Runtime selection (E4), on an InferenceServerConfig or a requester Pod (which wins): KAITO's proposal's
# key, and the key KAITO ships, as an alias.
RUNTIME_ANNOTATION: Final = "workspace.kaito.io/runtime"
RUNTIME_ANNOTATION_ALIAS: Final = "kaito.sh/runtime"

# Sleeper-aware placement (E22), on an InferenceServerConfig or a requester Pod (which wins): PLACEMENT_PREFER_SLEEPER
# asks that the requester be placed on a free GPU holding a sleeper of its model, PLACEMENT_OFF that it be left as
# FMA places it (the chart's default decides for requesters that say nothing).
PLACEMENT_ANNOTATION: Final = PREFIX + "placement"
PLACEMENT_PREFER_SLEEPER: Final = "prefer-sleeper"
PLACEMENT_OFF: Final = "off"
# Written by the dual-pods controller's placement webhook on each requester that opted in: its decision (JSON).
PLACED_ANNOTATION: Final = PREFIX + "placed"

# Well-known ConfigMap mapping node name -> {GPU UUID: index} (FMA's direct mode and mock GPUs).
GPU_MAP_CONFIGMAP: Final = "gpu-map"
# Set only by the loopback test cluster's kubelet where it plays a CDI runtime or a DRA driver: the UUIDs NVML
# would report in this container, standing in for the device nodes CDI injects on a real GPU node. The
# requester's and the launcher's fake GPU sources read it.
SIMULATED_NVML_ENV: Final = "DUALPODS_SIMULATED_NVML_UUIDS"

# The launcher's REST port is part of the contract between the controllers and launcher Pods.
LAUNCHER_PORT: Final = 8001

# Annotations the dual-pods controller puts on a launcher instance (VllmConfig.annotations).
INSTANCE_ISC_NAME: Final = "isc-name"
INSTANCE_INFERENCE_PORT: Final = "inference-port"
# On an instance the dual-pods controller made for an InferenceServerConfig's warm pool: the ISC's name.
INSTANCE_POOL: Final = "warm-pool"
