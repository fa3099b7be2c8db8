"""The placement webhook's HTTPS endpoint, served by the leading dual-pods controller, and its registration.

The chart installs a MutatingWebhookConfiguration (`failurePolicy: Ignore`, a short timeout) whose client config
names no server yet. The leader, when it starts, makes a key and a self-signed certificate for its own address,
serves `POST /placement` with them, and writes its URL and certificate into that configuration; it writes them
again whenever the configuration changes (a `helm upgrade` puts the chart's back). A new leader writes its own, so
the API server calls whichever controller leads; while none does, the call fails and the Pod is created as it
came (the stock scheduler places it), so a stopped controller never holds a requester back.
"""

import asyncio
import base64
import contextlib
import datetime
import ipaddress
import json
import logging
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from controller.dualpods.placement.admission import BadReview, Placement
from controller.dualpods.placement.choice import OPTED_IN_CONDITION
from kube.informer import Obj

log = logging.getLogger(__name__)

PATH = "/placement"
WEBHOOK_NAME = "placement.dual-pods.llm-d.ai"  # the webhook's entry in the configuration
CERTIFICATE_DAYS = 365


def self_signed(host: str) -> tuple[bytes, bytes]:
    """A P-256 key and a self-signed certificate for `host` (an IP address or a DNS name), both PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dualpods placement webhook")])
    try:
        alternative: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        alternative = x509.DNSName(host)
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERTIFICATE_DAYS))
        .add_extension(x509.SubjectAlternativeName([alternative]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, certificate.public_bytes(serialization.Encoding.PEM)


def tls_context(key_pem: bytes, certificate_pem: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory(prefix="dualpods-placement-") as tmp:  # ssl loads a chain from files only
        key, certificate = Path(tmp) / "key.pem", Path(tmp) / "cert.pem"
        key.write_bytes(key_pem)
        certificate.write_bytes(certificate_pem)
        context.load_cert_chain(certificate, key)
    return context


def app(placement: Placement) -> web.Application:
    """`POST /placement`: an AdmissionReview in, its answer out; a body that is not one gets a 400 with a JSON
    message."""

    async def review(request: web.Request) -> web.Response:
        try:
            body = await request.json()
            return web.json_response(await placement.review(body))
        except (BadReview, json.JSONDecodeError, UnicodeDecodeError) as err:
            return web.json_response({"error": f"not an AdmissionReview of a Pod's creation: {err}"}, status=400)

    application = web.Application(client_max_size=3 * 2**20)  # the API server's own limit on an object
    application.router.add_post(PATH, review)
    return application


@contextlib.asynccontextmanager
async def serving(placement: Placement, host: str, port: int) -> AsyncIterator[tuple[str, bytes]]:
    """The endpoint on `host:port` with a fresh certificate: its URL and the certificate (PEM), while inside."""
    key_pem, certificate_pem = self_signed(host)
    runner = web.AppRunner(app(placement), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls_context(key_pem, certificate_pem))
    await site.start()
    address = f"[{host}]" if ":" in host else host
    try:
        yield f"https://{address}:{port}{PATH}", certificate_pem
    finally:
        await runner.cleanup()


@dataclass(frozen=True)
class Endpoint:
    """Where the leader serves the webhook, and the configuration that must call it."""

    host: str  # this replica's address (its Pod IP)
    port: int
    configuration: str  # the MutatingWebhookConfiguration's name


async def serve_placement(
    api: client.ApiClient, placement: Placement, endpoint: Endpoint, opted_in: Callable[[], str], changed: asyncio.Event
) -> None:
    """Serve the webhook and keep its configuration pointing here, and sending only the requesters that opted in
    (`opted_in`: the match condition's CEL, again whenever `changed` is set), until cancelled."""
    async with serving(placement, endpoint.host, endpoint.port) as (url, certificate_pem):
        await Registration(api, endpoint.configuration, url, certificate_pem, opted_in).keep(changed)


def client_config(url: str, certificate_pem: bytes) -> dict[str, str]:
    return {"url": url, "caBundle": base64.b64encode(certificate_pem).decode()}


class Registration:
    """Keeps the webhook configuration `name` pointing at this controller's endpoint, with the match condition that
    lets through only the requesters that opted in."""

    def __init__(
        self, api: client.ApiClient, name: str, url: str, certificate_pem: bytes, opted_in: Callable[[], str]
    ) -> None:
        self.admission = client.AdmissionregistrationV1Api(api)
        self.name = name
        self.client_config = client_config(url, certificate_pem)
        self.opted_in = opted_in

    async def keep(self, changed: asyncio.Event, every_s: float = 10.0) -> None:
        """Write the webhook now, when `changed` is set (an ISC's opt-in changed), and when it was changed by
        someone else (looked at every `every_s`)."""
        while True:
            changed.clear()
            try:
                await self.write()
            except ApiException as err:
                log.warning("placement webhook %s: cannot write it: %s %s", self.name, err.status, err.reason)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every_s):
                    await changed.wait()

    def wanted(self, webhook: Obj) -> Obj:
        """The fields of the configuration's webhook entry this controller keeps: its client config, and its match
        conditions with the opt-in one (the chart's own kept)."""
        others = [c for c in webhook.get("matchConditions") or [] if c.get("name") != OPTED_IN_CONDITION]
        opted_in = {"name": OPTED_IN_CONDITION, "expression": self.opted_in()}
        return {"clientConfig": self.client_config, "matchConditions": [*others, opted_in]}

    async def write(self) -> bool:
        """Bring the configuration's placement webhook in line; True when it had to change."""
        found: Any = await self.admission.read_mutating_webhook_configuration(self.name, _preload_content=False)
        configuration = json.loads(await found.read())
        ops = []
        for index, webhook in enumerate(configuration.get("webhooks") or []):
            if webhook.get("name") != WEBHOOK_NAME:
                continue
            for field, value in self.wanted(webhook).items():
                if webhook.get(field) != value:
                    ops.append({"op": "add", "path": f"/webhooks/{index}/{field}", "value": value})
        if not ops:
            return False
        version = configuration["metadata"]["resourceVersion"]
        ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": version})
        await self.admission.patch_mutating_webhook_configuration(
            self.name, ops, _content_type="application/json-patch+json"
        )
        log.info("placement webhook %s now calls %s", self.name, self.client_config["url"])
        return True
