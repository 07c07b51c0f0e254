"""Test certificates: a CA, server certificates with SANs, and client certificates, as PEM files.

Real X.509 made with ``cryptography``, for TLS tests of the proxy, the broker and the clients.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path


def _name(common_name: str, org_unit: str | None = None) -> x509.Name:
    attrs = [
        x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kthrottle tests"),
    ]
    if org_unit is not None:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, org_unit))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    # PKCS#8, unencrypted: what Kafka's PEM key stores and Python's ssl both read.
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


class CertificateAuthority:
    def __init__(self, directory: Path, name: str = "kthrottle test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path = directory / f"{name.replace(' ', '-')}.crt"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        org_unit: str | None = None,
        client: bool = True,
        server: bool = True,
    ) -> CertFiles:
        """A key and a certificate signed by this CA, written as ``<stem>.crt`` / ``<stem>.key``
        (the certificate file is the chain: leaf, then the CA)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usages = [
            u
            for u, on in (
                (ExtendedKeyUsageOID.SERVER_AUTH, server),
                (ExtendedKeyUsageOID.CLIENT_AUTH, client),
            )
            if on
        ]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, org_unit))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        alt: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        alt += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        files = CertFiles(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        _write_key(key, files.key)
        files.cert.write_bytes(
            cert.public_bytes(serialization.Encoding.PEM) + self.cert.public_bytes(serialization.Encoding.PEM)
        )
        return files


def serial_of(pem: bytes) -> int:
    """Serial number of the first certificate in PEM bytes (which certificate a server showed)."""
    return x509.load_pem_x509_certificate(pem).serial_number
