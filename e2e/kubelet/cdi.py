"""What a container runtime puts in a GPU container's environment: the device plugin's UUID list, or a CDI spec's edits.

Every CDI spec NVIDIA generates (the GPU Operator's device plugin from v25.10, NVIDIA's DRA driver) sets
`NVIDIA_VISIBLE_DEVICES=void`, overwriting what the Pod or image set, and injects the GPUs as device nodes
that only NVML can name. No GPU exists here, so the loopback kubelet declares what NVML would report in
`SIMULATED_NVML_ENV` instead of the device nodes (docs: shared/reference/dra-cdi.md §2, §5).
"""

from e2e.kubelet.gpus import VISIBLE_DEVICES_ENV
from requester.visible_devices import SIMULATED_NVML_ENV

CDI_VOID = "void"


def gpu_env(uuids: list[str], cdi: bool) -> dict[str, str]:
    """The variables for a container given the GPUs `uuids`; `cdi`: injected through CDI, not the legacy runtime."""
    listed = ",".join(uuids)
    if cdi:
        return {VISIBLE_DEVICES_ENV: CDI_VOID, SIMULATED_NVML_ENV: listed}
    return {VISIBLE_DEVICES_ENV: listed}
