"""The loopback cluster's certificates: one CA, the API server's serving cert, client certs, SA keys.

Generated with `cryptography` (no shell openssl). The CA's key is RSA-2048, as kubeadm makes it: the API
server verifies the CA's signature on a client certificate on every request (no cache), and an RSA signature
verifies in a quarter of an ECDSA P-256 one's time (with ECDSA it was 5 % of the API server's CPU in
`bench/scale.py`'s waves). The leaf keys are ECDSA P-256, quick to make on a 2-core machine and cheap in a TLS
handshake; Go, OpenSSL and kubernetes-asyncio accept both.
"""

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    """PEM files of one certificate and its private key."""

    cert: Path
    key: Path


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization is not None:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _write_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


class CertificateAuthority:
    """A self-signed CA kept in `directory`, issuing the cluster's leaf certificates."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        now = datetime.datetime.now(datetime.UTC)
        subject = _name("dualpods-loopback-ca")
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.files = KeyPair(directory / "ca.crt", directory / "ca.key")
        self.files.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self._key, self.files.key)

    def issue(
        self,
        name: str,
        common_name: str,
        *,
        organization: str | None = None,
        server_names: tuple[str, ...] = (),
        server_ips: tuple[str, ...] = (),
    ) -> KeyPair:
        """Issue a client certificate, or a serving one when names or IPs are given."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        serving = bool(server_names or server_ips)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if serving else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organization))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
        )
        if serving:
            alternative_names: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
            alternative_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(alternative_names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair


def write_service_account_keys(directory: Path) -> KeyPair:
    """The key pair that signs ServiceAccount tokens (the "cert" file holds the public key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    pair.cert.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    _write_key(key, pair.key)
    return pair
