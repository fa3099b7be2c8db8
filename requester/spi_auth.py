"""Who may change this requester (E15): the SPI's state-changing routes need the controller's bearer token.

The dual-pods controller sends a ServiceAccount token of its own that the TokenRequest API issued for
this requester's audience (`api.requester.requester_audience`: namespace and Pod name). This module
asks the API server about it with a TokenReview for that audience, checks that the API server says the
audience matches, and that the user is one of the controller ServiceAccounts this requester trusts
(`--trusted-controllers`). Nothing needs configuring per Pod: every replica of the controller uses the
same ServiceAccount, so a leader failover changes nothing here, and users who write requester Pods
only give them a ServiceAccount that may create TokenReviews.

Fails closed: no token, a token the API server refuses, an untrusted user, and a token that cannot be
checked at all (no RBAC, no API server) are each refused with 401 or 403 and a message saying which.
A positive answer is cached for `CACHE_S` (the controller reuses its token for minutes); at most
`MAX_REVIEWS` TokenReviews are in flight, so a flood of made-up tokens cannot multiply into load on
the API server beyond that.

In a Pod the TokenReview is one HTTPS request with the Pod's ServiceAccount files (`InClusterApi`, no
client library: importing kubernetes_asyncio takes about 0.2 s, which would land on the first call of
every hot start, where the controller's whole share is about 50 ms). Outside a Pod (development, tests)
the kubeconfig is read by kubernetes_asyncio (`KubeconfigApi`), imported off the event loop at start.
"""

import asyncio
import fnmatch
import hashlib
import importlib
import json
import logging
import os
import ssl
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from api.requester import SpiErrorReason

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SA_PREFIX = "system:serviceaccount:"
CACHE_S = 30.0
CACHE_ENTRIES = 64
MAX_REVIEWS = 4
REVIEW_TIMEOUT_S = 5.0
MAX_TOKEN_BYTES = 16 * 1024
TOKEN_REVIEWS_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="dualpods-requester"'}


@dataclass(frozen=True)
class Refusal:
    """Why a call is refused: its status, reason and message."""

    status: int
    reason: SpiErrorReason
    detail: str

    @property
    def headers(self) -> dict[str, str]:
        return CHALLENGE if self.status == 401 else {}


class SpiAuth(Protocol):
    async def check(self, request: web.Request) -> Refusal | None:
        """None to let the call through."""

    async def warm(self) -> None:
        """Prepare what the first check needs (called once the servers listen)."""

    async def close(self) -> None: ...


class OpenSpi:
    """`--spi-auth none`: FMA's open SPI, for an FMA controller or a cluster without the TokenReview RBAC."""

    async def check(self, request: web.Request) -> Refusal | None:
        return None

    async def warm(self) -> None:
        return None

    async def close(self) -> None:
        return None


class TrustedControllers:
    """ServiceAccount patterns: `NAME` (in this requester's namespace) or `NAMESPACE/NAME`; `*` globs."""

    def __init__(self, patterns: str, namespace: str) -> None:
        self.patterns = tuple(
            p if "/" in p else f"{namespace}/{p}" for p in (part.strip() for part in patterns.split(",")) if p
        )
        if not self.patterns:
            raise ValueError("no trusted controller ServiceAccounts given")
        for pattern in self.patterns:
            namespace_part, _, name = pattern.partition("/")
            if not namespace_part or not name or "/" in name:
                raise ValueError(f"{pattern!r} is not NAME or NAMESPACE/NAME")

    def trusts(self, username: str) -> bool:
        if not username.startswith(SA_PREFIX):
            return False
        namespace, _, name = username.removeprefix(SA_PREFIX).partition(":")
        return any(fnmatch.fnmatchcase(f"{namespace}/{name}", pattern) for pattern in self.patterns)


class CannotVerify(Exception):
    """The API server could not be asked, or refused to answer; the message says why and what to fix."""


def _forbidden(message: str) -> CannotVerify:
    return CannotVerify(
        "this requester's ServiceAccount may not create TokenReviews, so it cannot check the controller's token; "
        "run the Pod as the chart's `<release>-requester` ServiceAccount (or bind its own to a role allowing "
        f"`create tokenreviews`): {message}"
    )


class ReviewApi(Protocol):
    """Where TokenReviews go: `review` returns the review's `status` (authenticated, user, audiences, error)."""

    async def prepare(self) -> None:
        """Make the client, once (idempotent; `review` calls it too). Our own start-up, not the API server's
        answer: the review's time bound leaves it out (importing the client takes seconds on a busy node)."""

    async def review(self, token: str, audience: str) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class InClusterApi:
    """The API server as a Pod reaches it: `KUBERNETES_SERVICE_HOST`/`_PORT` and the ServiceAccount's files
    (the token re-read for every review, so a rotated one is used)."""

    def __init__(self, host: str, port: str, account_dir: Path = SERVICE_ACCOUNT_DIR) -> None:
        self._url = f"https://{f'[{host}]' if ':' in host else host}:{port}{TOKEN_REVIEWS_PATH}"
        self._account_dir = account_dir
        self._session: aiohttp.ClientSession | None = None

    def _tls(self) -> ssl.SSLContext:
        try:
            return ssl.create_default_context(cafile=str(self._account_dir / "ca.crt"))
        except (OSError, ssl.SSLError) as err:
            raise CannotVerify(f"cannot read the Pod's ServiceAccount CA ({self._account_dir}): {err}") from None

    async def prepare(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._tls())
            self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))

    async def review(self, token: str, audience: str) -> dict[str, Any]:
        await self.prepare()
        assert self._session is not None
        try:
            own = (self._account_dir / "token").read_text().strip()
        except OSError as err:
            raise CannotVerify(f"cannot read the Pod's ServiceAccount token: {err}") from None
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": [audience]}}  # fmt: skip
        try:
            async with self._session.post(self._url, json=body, headers={"Authorization": f"Bearer {own}"}) as answer:
                text = await answer.text()
                status = answer.status
        except (aiohttp.ClientError, OSError) as err:
            raise CannotVerify(f"the API server could not be asked to review the token: {err!r}") from None
        if status == 403:
            raise _forbidden(text[:300])
        if status not in (200, 201):
            raise CannotVerify(f"the API server answered {status} to a TokenReview: {text[:300]}")
        try:
            review: dict[str, Any] = json.loads(text).get("status") or {}
        except (ValueError, AttributeError):
            raise CannotVerify(f"the API server's TokenReview answer is not JSON: {text[:300]!r}") from None
        return review

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class KubeconfigApi:
    """The API server of a kubeconfig (outside a Pod), through kubernetes_asyncio, imported off the loop."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._api: Any = None
        self._client: Any = None  # the kubernetes_asyncio.client module, once imported
        self._loading = asyncio.Lock()

    async def prepare(self) -> None:
        async with self._loading:
            if self._api is None:
                client, config = await asyncio.to_thread(_import_kubernetes)
                configuration = client.Configuration()
                try:
                    await config.load_kube_config(config_file=self._path, client_configuration=configuration)
                except (config.ConfigException, OSError) as err:
                    raise CannotVerify(f"cannot load the kubeconfig {self._path}: {err}") from None
                self._client, self._api = client, client.ApiClient(configuration)

    async def review(self, token: str, audience: str) -> dict[str, Any]:
        await self.prepare()
        api, client = self._api, self._client
        body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[audience]))
        try:
            review = await client.AuthenticationV1Api(api).create_token_review(body)
        except client.ApiException as err:
            message = str(err.reason or err)[:300]
            if err.status == 403:
                raise _forbidden(message) from None
            raise CannotVerify(f"the API server answered {err.status} to a TokenReview: {message}") from None
        except (aiohttp.ClientError, OSError) as err:
            raise CannotVerify(f"the API server could not be asked to review the token: {err!r}") from None
        status: dict[str, Any] = api.sanitize_for_serialization(review.status) or {}
        return status

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()


def _import_kubernetes() -> tuple[Any, Any]:
    return importlib.import_module("kubernetes_asyncio.client"), importlib.import_module("kubernetes_asyncio.config")


class _Unconfigured:
    async def prepare(self) -> None:
        return None

    async def review(self, token: str, audience: str) -> dict[str, Any]:
        raise CannotVerify("no API server to review tokens with: not in a Pod, and no --kubeconfig or KUBECONFIG")

    async def close(self) -> None:
        return None


def review_api(
    kubeconfig: str | None, environ: Mapping[str, str] = os.environ, account_dir: Path = SERVICE_ACCOUNT_DIR
) -> ReviewApi:
    """In a Pod its ServiceAccount (unless a kubeconfig is given), else the kubeconfig (`--kubeconfig`,
    `$KUBECONFIG`). `environ` and `account_dir` are the Pod's (a simulation passes a container's own)."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT", "443")
    if kubeconfig is None and host:
        return InClusterApi(host, port, account_dir)
    path = kubeconfig or environ.get("KUBECONFIG")
    return KubeconfigApi(path) if path else _Unconfigured()


def _bearer_token(request: web.Request) -> str | Refusal:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        detail = "this route changes the requester: it needs `Authorization: Bearer <token>` from the controller"
        return Refusal(401, SpiErrorReason.UNAUTHENTICATED, detail)
    if scheme.lower() != "bearer" or not token.strip():
        return Refusal(401, SpiErrorReason.UNAUTHENTICATED, "the Authorization header must be `Bearer <token>`")
    if len(token) > MAX_TOKEN_BYTES:
        return Refusal(401, SpiErrorReason.UNAUTHENTICATED, f"the bearer token is over {MAX_TOKEN_BYTES} bytes")
    return token.strip()


class TokenReviewAuth:
    """The SPI's writes need a token the API server issued for `audience` to a trusted ServiceAccount."""

    def __init__(self, audience: str, trusted: TrustedControllers, api: ReviewApi) -> None:
        self.audience = audience
        self.trusted = trusted
        self._api = api
        self._reviews = asyncio.Semaphore(MAX_REVIEWS)
        self._accepted: OrderedDict[bytes, tuple[str, float]] = OrderedDict()  # token digest -> (user, until)

    async def warm(self) -> None:
        """Make the client before the first call needs it (outside a Pod, importing it takes a while)."""
        try:
            await self._api.prepare()
        except CannotVerify as err:
            log.error("cannot verify the controller's tokens; state-changing calls will be refused",
                      extra={"error": str(err)})  # fmt: skip

    async def close(self) -> None:
        await self._api.close()

    async def check(self, request: web.Request) -> Refusal | None:
        token = _bearer_token(request)
        if isinstance(token, Refusal):
            return self._refused(request, token)
        digest = hashlib.sha256(token.encode()).digest()
        cached = self._accepted.get(digest)
        if cached is not None and cached[1] > time.monotonic():
            return None
        try:
            username = await self._review(token)
        except CannotVerify as err:
            return self._refused(request, Refusal(401, SpiErrorReason.CANNOT_VERIFY, str(err)))
        if isinstance(username, Refusal):
            return self._refused(request, username)
        if not self.trusted.trusts(username):
            detail = (f"{username} is not a controller this requester trusts (--trusted-controllers: "
                      f"{', '.join(self.trusted.patterns)})")  # fmt: skip
            return self._refused(request, Refusal(403, SpiErrorReason.FORBIDDEN, detail))
        self._accepted[digest] = (username, time.monotonic() + CACHE_S)
        while len(self._accepted) > CACHE_ENTRIES:
            self._accepted.popitem(last=False)
        log.info("controller authenticated", extra={"user": username, "route": request.path})
        return None

    async def _review(self, token: str) -> str | Refusal:
        """The user the API server says the token belongs to, for this audience; a Refusal if it says no.
        The time bound is the API server's alone: a first call that waits for the client to be made (`warm`,
        still importing it on a busy node) is not refused for that."""
        async with self._reviews:
            await self._api.prepare()
            try:
                async with asyncio.timeout(REVIEW_TIMEOUT_S):
                    status = await self._api.review(token, self.audience)
            except TimeoutError:
                raise CannotVerify(
                    f"the API server did not answer a TokenReview within {REVIEW_TIMEOUT_S:g} s"
                ) from None
        if not status.get("authenticated"):
            why = status.get("error") or "not authenticated"
            detail = f"the bearer token is not valid for {self.audience}: {why}"
            return Refusal(401, SpiErrorReason.UNAUTHENTICATED, detail)
        if self.audience not in (status.get("audiences") or []):
            detail = (
                f"the API server did not confirm the token's audience {self.audience} (got {status.get('audiences')})"
            )
            return Refusal(401, SpiErrorReason.UNAUTHENTICATED, detail)
        return str((status.get("user") or {}).get("username") or "")

    def _refused(self, request: web.Request, refusal: Refusal) -> Refusal:
        log.warning("refused a state-changing call",
                    extra={"route": request.path, "peer": request.remote, "reason": refusal.reason.value,
                           "detail": refusal.detail})  # fmt: skip
        return refusal


def own_namespace(explicit: str | None) -> str | None:
    """`--namespace`/`POD_NAMESPACE`, else the namespace of the Pod's ServiceAccount."""
    if explicit:
        return explicit
    try:
        return (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip() or None
    except OSError:
        return None
