"""Connecting to the API server: in-cluster credentials in a Pod, else a kubeconfig; with client-go's
client-side rate limit (QPS and burst, `--kube-api-qps`/`--kube-api-burst`), every request counted, and
each one's time charged to the reconcile pass that makes it (kube.passclock).

The API server answers some writes with Warning headers (a deprecated field, an unknown field under
server-side field validation, a policy in Warn mode): each is counted, and each distinct one logged once, as
client-go does, so what the server says about our objects is not lost.

kubernetes-asyncio has no rate limit of its own: without one, a wave of work (a thousand requesters
scheduled at once) would reach the API server as fast as the workers can send it.
"""

import functools
import json
import logging
import re
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Histogram

from api.crds import GROUP, VERSION, CustomResource
from kube.informer import ListWatchFunction, decode
from kube.passclock import waiting
from kube.ratelimit import TokenBucket

log = logging.getLogger(__name__)

# client-go's own defaults (5 requests/s, burst 10) suit a controller of a few objects; these carry 1,000
# requesters on 250 nodes in a minute (docs/benchmarks.md: about 11 requests per requester bound).
DEFAULT_QPS = 200.0
DEFAULT_BURST = 400
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# RFC 7234's warn-code, warn-agent and quoted warn-text, as the API server writes them: `299 - "text"`.
WARNING = re.compile(r'^\d{3} \S+ "((?:[^"\\]|\\.)*)"')
# How an API call fails without the API server refusing what it asked: it did not answer (a connection refused or
# cut, a timeout) or answered with an error status (ApiException: a conflict, a 5xx, or a refusal).
API_FAILURES = (ApiException, aiohttp.ClientError, OSError, TimeoutError)
# Distinct warnings logged per process; later new ones are counted but not logged.
LOGGED_WARNINGS_MAX = 1000


@dataclass(frozen=True)
class ApiLimits:
    qps: float = DEFAULT_QPS  # <= 0: no limit
    burst: int = DEFAULT_BURST


class ApiMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "dualpods_kube_api_requests",
            "Requests this controller made to the API server, by HTTP method and status code (0: no answer).",
            ["method", "code"],
            registry=registry,
        )
        self.latency = Histogram(
            "dualpods_kube_api_request_seconds",
            "Each request to the API server, from its send (after the rate limit) to its answer, by HTTP method.",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.warnings = Counter(
            "dualpods_kube_api_warnings",
            "Warnings the API server sent with its answers (Warning headers), by HTTP method; each distinct text is "
            "logged once.",
            ["method"],
            registry=registry,
        )
        self.throttled = Histogram(
            "dualpods_kube_api_rate_limit_wait_seconds",
            "How long each request waited for the client-side rate limit (--kube-api-qps, --kube-api-burst).",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )


class LimitedApiClient(client.ApiClient):  # type: ignore[misc]
    """kubernetes-asyncio's client, rate-limited and counted."""

    def __init__(self, configuration: client.Configuration, limits: ApiLimits, metrics: ApiMetrics | None) -> None:
        super().__init__(configuration)
        # kubernetes-asyncio opens its session with trust_env=True, and aiohttp then reads ~/.netrc in a thread
        # for every request (9 % of the controller's Python time at scale); a proxy comes from the kubeconfig's
        # `proxy-url` (configuration.proxy), which is still sent with each request.
        self.rest_client.pool_manager._trust_env = False
        self.limits = limits
        self._bucket = TokenBucket(limits.qps, limits.burst)
        self._metrics = metrics
        self._logged_warnings: set[str] = set()

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        return self._send(method, url, super().request(method, url, *args, **kwargs))

    async def _send(self, method: str, url: str, sending: Awaitable[Any]) -> Any:
        with waiting():
            waited = await self._bucket.acquire()
            sent = time.monotonic()
            code = 0
            try:
                response = await sending
                code = int(getattr(response, "status", 0) or 0)
                # A watch answers with aiohttp's own response, any other call with kubernetes-asyncio's wrapper.
                self._warned(method, url, getattr(response, "aiohttp_response", response).headers)
                return response
            except ApiException as err:
                code = int(err.status or 0)
                self._warned(method, url, err.headers)
                raise
            finally:
                if self._metrics is not None:
                    self._metrics.throttled.observe(waited)
                    self._metrics.latency.labels(method).observe(time.monotonic() - sent)
                    self._metrics.requests.labels(method, str(code)).inc()

    def _warned(self, method: str, url: str, headers: Any) -> None:
        for header in headers.getall("Warning", []) if headers else []:
            matched = WARNING.match(header)
            text = matched.group(1).replace('\\"', '"') if matched else header
            if self._metrics is not None:
                self._metrics.warnings.labels(method).inc()
            if text not in self._logged_warnings and len(self._logged_warnings) < LOGGED_WARNINGS_MAX:
                self._logged_warnings.add(text)
                log.warning("the API server warned about %s %s: %s", method, urlsplit(url).path, text)


async def api_client(
    kubeconfig: str | None, limits: ApiLimits = ApiLimits(), registry: CollectorRegistry | None = None
) -> LimitedApiClient:
    """In a Pod its ServiceAccount (unless a kubeconfig is given), else the kubeconfig."""
    metrics = ApiMetrics(registry) if registry is not None else None
    configuration = client.Configuration()
    if kubeconfig is None:
        try:
            config.load_incluster_config(client_configuration=configuration)
            return LimitedApiClient(configuration, limits, metrics)
        except config.ConfigException:
            pass
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return LimitedApiClient(configuration, limits, metrics)


def custom_objects(api: client.ApiClient, namespace: str, kind: type[CustomResource]) -> ListWatchFunction:
    """List/watch one of our custom resources in a namespace, for an Informer."""
    objects = client.CustomObjectsApi(api)
    bound: Any = functools.partial(
        objects.list_namespaced_custom_object, GROUP, VERSION, namespace, kind.RESOURCE.plural
    )
    return bound  # type: ignore[no-any-return]


def refusal(err: ApiException) -> tuple[str, str]:
    """The API server's Status answer of a refused call: its machine-readable `reason` (e.g. Invalid,
    Forbidden, Conflict) and its message. PodWriter puts an answer it read itself in `reason`."""
    text = err.body or err.reason or ""
    try:
        status = json.loads(text)
        return str(status.get("reason") or ""), str(status.get("message") or text)
    except (ValueError, TypeError, AttributeError):
        return "", str(text)


async def answer_of(call: Awaitable[Any]) -> dict[str, Any]:
    """The JSON answer of a kubernetes-asyncio call made with `_preload_content=False`, or its refusal as
    ApiException: for callers that read a field or two of what they write (a version, a name, a token), since
    decoding the whole answer into the client's models cost more CPU than sending the request."""
    answer: aiohttp.ClientResponse = await call
    async with answer:
        if answer.status >= 300:
            raise ApiException(status=answer.status, reason=await answer.text())
        decoded: dict[str, Any] = decode(await answer.read())
        return decoded
