"""The requester's SPI as a contract between the dual-pods controller and `python -m requester` (FMA's paths).

Beside FMA's routes it defines how the controller proves who it is (E15): every state-changing call
carries `Authorization: Bearer <token>`, a ServiceAccount token of the controller issued by the
TokenRequest API for the audience of that one requester, `requester_audience(namespace, pod name)`.
The requester checks it with a TokenReview for that audience, so the token is worthless against the
API server and against every other requester. Errors are `SpiError` bodies.
"""

import ipaddress
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

ACCELERATORS_PATH: Final = "/v1/dual-pods/accelerators"
MEMORY_USAGE_PATH: Final = "/v1/dual-pods/accelerator-memory-usage"
BECOME_READY_PATH: Final = "/v1/become-ready"
BECOME_UNREADY_PATH: Final = "/v1/become-unready"
SET_LOG_PATH: Final = "/v1/set-log"
PROXY_CONFIG_PATH: Final = "/v1/proxy/config"
PROXY_OPENAPI_PATH: Final = "/v1/proxy/openapi.json"

AUDIENCE_PREFIX: Final = "dualpods-requester"
# The shortest lifetime the TokenRequest API grants; the controller renews well before it ends.
TOKEN_LIFETIME_S: Final = 600
# What a requester trusts unless told otherwise: the chart's controller ServiceAccount
# (`<release>-fma-controllers`, the name FMA's admission policies exempt) in the requester's namespace.
DEFAULT_TRUSTED_CONTROLLERS: Final = "*-fma-controllers"
LIMIT_MAX: Final = 2**31 - 1  # the largest limit a proxy config may carry
INT64_MAX: Final = 2**63 - 1
MAX_LOG_CHUNK_BYTES: Final = 1024 * 1024  # one set-log body


def requester_audience(namespace: str, pod_name: str) -> str:
    """The token audience of one requester Pod."""
    return f"{AUDIENCE_PREFIX}:{namespace}:{pod_name}"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class SpiErrorReason(StrEnum):
    """Machine-readable cause of an SPI error, in the `reason` field beside the `detail` message."""

    UNAUTHENTICATED = "Unauthenticated"  # 401: no bearer token, or one the API server does not accept
    CANNOT_VERIFY = "CannotVerify"  # 401: the requester could not check the token (no RBAC, API down)
    FORBIDDEN = "Forbidden"  # 403: a valid token of an identity this requester does not trust
    INVALID_BODY = "InvalidBody"  # 400
    INVALID_PARAMETER = "InvalidParameter"  # 400: a query parameter
    BODY_TOO_LARGE = "BodyTooLarge"  # 413
    NOT_FOUND = "NotFound"  # 404: no such route, or nothing configured yet
    METHOD_NOT_ALLOWED = "MethodNotAllowed"  # 405
    NO_GPUS = "NoGPUs"  # 500: the GPU queries of a requester without GPUs
    GPU_QUERY_FAILED = "GPUQueryFailed"  # 500
    LOG_WRITE_FAILED = "LogWriteFailed"  # 500
    INTERNAL = "Internal"  # 500


class SpiError(BaseModel):
    detail: str = Field(description="what is wrong, naming the value")
    reason: SpiErrorReason


def _limit(description: str) -> Any:
    return Field(default=None, ge=1, le=LIMIT_MAX, description=description)


class ProxyConfig(BaseModel):
    """FMA 0.7's `PUT /v1/proxy/config` body, plus optional limits of the instance."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # as Go decodes FMA's JSON: no "8000", no true

    address: str = Field(
        max_length=45,
        description="the model server's IP address (v4 or v6; unicast, not a host name)",
        json_schema_extra={"anyOf": [{"format": "ipv4"}, {"format": "ipv6"}]},
    )
    port: int = Field(ge=1, le=65535, description="the model server's port")
    max_model_len: int | None = _limit("the instance's context length, for servers that cannot report it")
    kv_cache_tokens: int | None = _limit("tokens the instance's KV cache holds")
    max_num_seqs: int | None = _limit("sequences the instance runs at once")

    @field_validator("address")
    @classmethod
    def _unicast_ip(cls, address: str) -> str:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            raise ValueError(f"address must be an IP address, got {address!r}") from None
        if ip.is_unspecified or ip.is_multicast:
            raise ValueError(f"address must be a unicast address, got {address!r}")
        return ip.compressed

    @property
    def host_port(self) -> str:
        """`address:port`, with IPv6 addresses bracketed as URLs need them."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"


class ProxyLimits(BaseModel):
    """What the proxy knows now of its server's limits (given, else discovered); null where unknown."""

    max_model_len: int | None
    kv_cache_tokens: int | None
    max_num_seqs: int | None


class ProxyConfigState(BaseModel):
    """`GET /v1/proxy/config`: the target as put, and the limits known now."""

    address: str
    port: int
    max_model_len: int | None = None
    kv_cache_tokens: int | None = None
    max_num_seqs: int | None = None
    limits: ProxyLimits


def _go_integer(value: object) -> object:
    """A query integer as Go's strconv.ParseInt (FMA's requester) reads it: an optional sign, then digits."""
    if isinstance(value, str):
        digits = value[1:] if value[:1] in "+-" else value
        if not digits.isascii() or not digits.isdigit():
            raise ValueError(f"Failed to parse startPos={value!r} as an integer")
        return int(value)
    return value


class SetLogQuery(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    start_pos: Annotated[int, BeforeValidator(_go_integer)] = Field(
        alias="startPos",
        ge=-INT64_MAX - 1,
        le=INT64_MAX,
        description="the byte offset of the body in the relayed log (a sign is allowed, as in FMA)",
    )
