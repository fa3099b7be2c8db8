"""The two pieces FMA's Pod hashes share: the de-individualized spec and the hash encoding.

FMA's launcher template hash and its direct-mode nominal hash both start from a Pod spec with what belongs to one
Pod taken out (its DeIndividualize) and both write SHA-256 as unpadded standard base64; both controllers here
must do the same, byte for byte, to find the launchers and sleeping servers FMA left.
"""

import base64
import copy
import hashlib
import re
from typing import Any, Final

# The ServiceAccount token volume the API server adds to each Pod (FMA's DeIndividualize drops the first one).
API_ACCESS_VOLUME: Final = re.compile(r"^kube-api-access-[a-z0-9]+$")


def deindividualize(spec: dict[str, Any]) -> dict[str, Any]:
    """A copy of `spec` without what belongs to one Pod, exactly as FMA's DeIndividualize: no ephemeral containers,
    and without the first `kube-api-access-*` volume and, in each (init) container, the first mount of it."""
    spec = copy.deepcopy(spec)
    spec.pop("ephemeralContainers", None)
    volumes = spec.get("volumes") or []
    token = next((v for v in volumes if API_ACCESS_VOLUME.match(v.get("name") or "")), None)
    if token is None:
        return spec
    volumes.remove(token)
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        mounts = container.get("volumeMounts") or []
        mount = next((m for m in mounts if m.get("name") == token["name"]), None)
        if mount is not None:
            mounts.remove(mount)
    return spec


def go_hash(data: str) -> str:
    """FMA's hash encoding: base64, standard alphabet, no padding, of the SHA-256 of `data`'s UTF-8 bytes."""
    return base64.b64encode(hashlib.sha256(data.encode()).digest()).decode().rstrip("=")
