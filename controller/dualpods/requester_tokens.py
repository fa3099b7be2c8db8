"""The controller's credential towards requesters (E15): a short-lived token per requester, from the TokenRequest API.

Each token is the controller's own ServiceAccount's, issued for one requester's audience
(`api.requester.requester_audience`), so it opens nothing else: the API server refuses it (wrong
audience), and another requester refuses it too (its audience is its own), so a requester that
captures the token cannot replay it anywhere. With the controller's Pod given (`bound_pod`), the
token is also bound to that Pod and dies with it. Every replica of the controller runs as the same
ServiceAccount, so whichever replica leads, requesters accept it: failover needs nothing shared.

Tokens are reused until `RENEW_AFTER` of their lifetime has passed (one TokenRequest per requester
about every five minutes), and dropped when a requester refuses one (`forget`).
"""

import asyncio
import logging
import time
from dataclasses import dataclass

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api.requester import TOKEN_LIFETIME_S, bearer, requester_audience

log = logging.getLogger(__name__)

RENEW_AFTER = 0.5  # of a token's lifetime
# Tokens past their renewal (of requesters gone meanwhile) are dropped this often, not at every call: a sweep
# reads every token, and with 1,000 requesters a sweep per call was 2 % of the controller's time.
SWEEP_S = 60.0


class TokenUnavailable(Exception):
    """No token could be had for a requester; the message says why."""


@dataclass(frozen=True)
class BoundPod:
    name: str
    uid: str


class RequesterTokens:
    """Tokens of `service_account` (in `namespace`), one per requester audience."""

    def __init__(
        self, api: client.ApiClient, namespace: str, service_account: str, bound_pod: BoundPod | None = None
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._namespace = namespace
        self._service_account = service_account
        self._bound_pod = bound_pod
        self._tokens: dict[str, tuple[str, float]] = {}  # audience -> (token, renew at, monotonic)
        self._locks: dict[str, asyncio.Lock] = {}
        self._next_sweep = 0.0  # monotonic

    async def headers(self, namespace: str, pod_name: str) -> dict[str, str]:
        """`Authorization: Bearer <token>` for the requester `namespace/pod_name`."""
        audience = requester_audience(namespace, pod_name)
        async with self._locks.setdefault(audience, asyncio.Lock()):
            cached = self._tokens.get(audience)
            if cached is None or cached[1] <= time.monotonic():
                cached = await self._request(audience)
                self._tokens[audience] = cached
            self._drop_stale()
        return bearer(cached[0])

    def forget(self, namespace: str, pod_name: str) -> None:
        """The requester refused the token: ask for a new one next time."""
        self._tokens.pop(requester_audience(namespace, pod_name), None)

    def _drop_stale(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_S
        for audience in [a for a, (_, renew_at) in self._tokens.items() if renew_at <= now]:
            del self._tokens[audience]
            lock = self._locks.get(audience)
            if lock is not None and not lock.locked():
                del self._locks[audience]

    async def _request(self, audience: str) -> tuple[str, float]:
        bound = None
        if self._bound_pod is not None:
            bound = client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=self._bound_pod.name, uid=self._bound_pod.uid
            )
        body = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[audience], expiration_seconds=TOKEN_LIFETIME_S, bound_object_ref=bound
            )
        )
        started = time.monotonic()
        try:
            answer = await self._core.create_namespaced_service_account_token(
                self._service_account, self._namespace, body
            )
        except ApiException as err:
            raise TokenUnavailable(
                f"the API server refused a token of ServiceAccount {self._namespace}/{self._service_account} for "
                f"{audience}: {err.status} {err.reason}"
            ) from None
        except (OSError, TimeoutError) as err:
            raise TokenUnavailable(f"cannot ask the API server for a requester token: {err!r}") from None
        lifetime = answer.status.expiration_timestamp.timestamp() - time.time()
        log.debug("got a requester token audience=%s lifetime=%.0fs", audience, lifetime)
        return answer.status.token, started + max(lifetime, 0.0) * RENEW_AFTER
