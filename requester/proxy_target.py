"""Where the proxy forwards to: FMA 0.7's `PUT /v1/proxy/config` body, validated, and kept set-once.

FMA's body is `{"address": str, "port": int}`. Ours also takes optional limits of the instance, for
model servers that cannot report them (the proxy discovers them from vLLM itself; see
`backend_limits`). The address must be an IP address: the controller knows the provider Pod's IP,
and a name would need a DNS lookup on every (re)connect. A requester is bound at most once, so the
target is set once: repeating the same body is harmless (a retried call), a different one is refused.
"""

import asyncio
import ipaddress
from dataclasses import asdict, dataclass

LIMIT_FIELDS = ("max_model_len", "kv_cache_tokens", "max_num_seqs")


class TargetError(ValueError):
    """The body is not a valid target (a 400)."""


class TargetConflict(RuntimeError):
    """A different target is already set (a 409)."""


@dataclass(frozen=True)
class Target:
    address: str
    port: int
    max_model_len: int | None = None
    kv_cache_tokens: int | None = None
    max_num_seqs: int | None = None

    @property
    def host_port(self) -> str:
        """`address:port`, with IPv6 addresses bracketed as URLs need them."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"

    def as_json(self) -> dict[str, object]:
        """FMA's two fields, plus the limits that were given."""
        return {key: value for key, value in asdict(self).items() if value is not None}


def _positive_int(body: dict[str, object], name: str, maximum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (maximum and value > maximum):
        bound = f"an integer from 1 to {maximum}" if maximum else "a positive integer"
        raise TargetError(f"{name} must be {bound}, got {value!r}")
    return value


def parse_target(body: object) -> Target:
    """Validate a decoded JSON body; raises TargetError saying what is wrong."""
    if not isinstance(body, dict):
        raise TargetError("the body must be a JSON object")
    unknown = sorted(set(body) - {"address", "port", *LIMIT_FIELDS})
    if unknown:
        raise TargetError(f"unknown fields: {', '.join(unknown)}")
    address = body.get("address")
    if not isinstance(address, str) or not address:
        raise TargetError("address must be a non-empty string")
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise TargetError(f"address must be an IP address, got {address!r}") from None
    if ip.is_unspecified or ip.is_multicast:
        raise TargetError(f"address must be a unicast address, got {address!r}")
    if body.get("port") in (None, 0):
        raise TargetError("port must be given and not 0")
    port = _positive_int(body, "port", 65535)
    assert port is not None
    limits = {name: _positive_int(body, name) for name in LIMIT_FIELDS}
    return Target(ip.compressed, port, **limits)


class ProxyTarget:
    """The target, once set; `wait()` returns when it is."""

    def __init__(self) -> None:
        self._target: Target | None = None
        self._set = asyncio.Event()

    @property
    def target(self) -> Target | None:
        return self._target

    def set(self, target: Target) -> bool:
        """Set it; False when this same target was already set. Raises TargetConflict for another one."""
        if self._target is not None:
            if self._target != target:
                raise TargetConflict(f"proxy already configured to: {self._target.host_port}")
            return False
        self._target = target
        self._set.set()
        return True

    async def wait(self) -> Target:
        await self._set.wait()
        assert self._target is not None
        return self._target
