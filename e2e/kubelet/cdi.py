"""What a container runtime puts in a GPU container's environment: the device plugin's UUID list, or a CDI spec's edits.

Every CDI spec NVIDIA generates (the GPU Operator's device plugin from v25.10, NVIDIA's DRA driver) sets
`NVIDIA_VISIBLE_DEVICES=void`, overwriting what the Pod or image set, and injects the GPUs as device nodes
that only NVML can name. No GPU exists here, so the loopback kubelet declares what NVML would report in
`SIMULATED_NVML_ENV` instead of the device nodes (docs: shared/reference/dra-cdi.md §2, §5).
"""

from api.keys import SIMULATED_NVML_ENV
from e2e.kubelet.gpus import VISIBLE_DEVICES_ENV

CDI_VOID = "void"


def gpu_env(uuids: list[str], cdi: bool) -> dict[str, str]:
    """The variables for a container given the GPUs `uuids`; `cdi`: injected through CDI, not the legacy runtime.
    Through CDI and no GPU (a container on a DRA-only Node that holds no claim: no NVIDIA runtime there, only the
    driver's CDI edits), no edit at all, and NVML sees no GPU whatever NVIDIA_VISIBLE_DEVICES says."""
    listed = ",".join(uuids)
    if cdi and not uuids:
        return {SIMULATED_NVML_ENV: ""}
    if cdi:
        return {VISIBLE_DEVICES_ENV: CDI_VOID, SIMULATED_NVML_ENV: listed}
    return {VISIBLE_DEVICES_ENV: listed}
