"""Pod Security "restricted" (Kubernetes 1.30's Pod Security Standards, baseline included) as a check on a Pod
spec, for the chart's workloads and the examples' Pods; beyond the profile, it also wants a read-only root."""

from typing import Any

Obj = dict[str, Any]

# The volume types the restricted profile allows (Pod Security Standards, Kubernetes 1.30).
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}  # fmt: skip


def restricted_violations(pod: Obj) -> list[str]:
    """What keeps a Pod spec out of Pod Security "restricted" (baseline included), and, beyond the profile, a
    writable root file system."""
    problems = [f"hostNetwork/hostPID/hostIPC: {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']}: {kinds}")
    pod_context = pod.get("securityContext", {})
    for item in pod["containers"] + pod.get("initContainers", []):
        where = f"container {item['name']}"
        context = item.get("securityContext", {})

        def setting(key: str, context: Obj = context) -> Any:
            return context.get(key, pod_context.get(key))

        if setting("runAsNonRoot") is not True:
            problems.append(f"{where}: runAsNonRoot is not true")
        if setting("runAsUser") == 0:
            problems.append(f"{where}: runAsUser 0")
        if (setting("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile is not RuntimeDefault or Localhost")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation is not false")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{where}: capabilities do not drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: adds capabilities {capabilities['add']}")
        if context.get("privileged"):
            problems.append(f"{where}: privileged")
        if any(port.get("hostPort") for port in item.get("ports", [])):
            problems.append(f"{where}: hostPort")
        if context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: readOnlyRootFilesystem is not true")
    return problems
