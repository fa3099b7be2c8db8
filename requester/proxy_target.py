"""Where the proxy forwards to: FMA 0.7's `PUT /v1/proxy/config` body, validated, following the controller.

The body is `api.requester.ProxyConfig`: FMA's `{"address", "port"}`, plus optional limits of the
instance for model servers that cannot report them (see `backend_limits`). The address must be an IP
address: the controller knows the provider Pod's IP, and a name would need a DNS lookup on every
(re)connect. FMA sets the target once, so whoever calls first decides where the Pod's clients' prompts
go; here only the controller may call (E15, `spi_auth`), and the target follows its latest binding:
a new target replaces the old one for every request from then on, and whatever was learnt of the old
server's limits is forgotten.
"""

import asyncio
import json
import logging
from collections.abc import Callable

from pydantic import ValidationError

from api.requester import ProxyConfig
from api.validation import validation_message

log = logging.getLogger(__name__)
Target = ProxyConfig


class TargetError(ValueError):
    """The body is not a valid target (a 400); the message names the value."""


def parse_target(body: bytes) -> Target:
    """Validate a `PUT /v1/proxy/config` body; raises TargetError saying what is wrong."""
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError) as err:  # bad JSON, bad UTF-8, absurd nesting
        raise TargetError(f"the body is not JSON: {err}") from None
    if not isinstance(decoded, dict):
        raise TargetError(f"the body must be a JSON object, got {type(decoded).__name__}")
    try:
        return ProxyConfig.model_validate(decoded)
    except ValidationError as err:
        raise TargetError(validation_message(err)) from None


class ProxyTarget:
    """The target, once set; `wait()` returns when it is; listeners hear of every change."""

    def __init__(self) -> None:
        self._target: Target | None = None
        self._set = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []

    @property
    def target(self) -> Target | None:
        return self._target

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def set(self, target: Target) -> bool:
        """Point the proxy at `target`; False when it already pointed there (a retried call)."""
        if self._target == target:
            return False
        previous, self._target = self._target, target
        if previous is not None:
            log.warning("proxy re-pointed", extra={"from": previous.host_port, "to": target.host_port})
        for listener in self._listeners:
            listener()
        self._set.set()
        return True

    async def wait(self) -> Target:
        await self._set.wait()
        assert self._target is not None
        return self._target
