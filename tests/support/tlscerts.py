"""Certificates made in the test (``cryptography``), and a Secret volume as the kubelet
writes one.

``Authority(name)`` is a CA that issues server and client certificates for
``127.0.0.1``/``localhost``. ``SecretVolume`` lays files out as a mounted Kubernetes
Secret is laid out: ``<dir>/tls.crt -> ..data/tls.crt``, ``..data -> ..<version>/``; its
``update`` writes a new version directory and flips ``..data`` with one ``rename``,
which is what the kubelet does when cert-manager renews the Secret.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Authority", "Pair", "SecretVolume"]

_DAY = dt.timedelta(days=1)


@dataclass(frozen=True)
class Pair:
    """A PEM certificate and its PEM (unencrypted) private key."""

    cert: bytes
    key: bytes

    @property
    def der(self) -> bytes:
        return x509.load_pem_x509_certificate(self.cert).public_bytes(serialization.Encoding.DER)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


class Authority:
    """A self-signed CA issuing certificates for the tests."""

    def __init__(self, name: str) -> None:
        self._key = _key()
        self._name = _name(name)
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
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
            .sign(self._key, hashes.SHA256())
        )
        self.pem = self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, common: str, *, client: bool = False) -> Pair:
        """A leaf for 127.0.0.1 and localhost: a server certificate, or a client's."""
        key = _key()
        now = dt.datetime.now(dt.UTC)
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + _DAY)
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        return Pair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


class SecretVolume:
    """A directory laid out as a mounted Secret (module docstring)."""

    def __init__(self, root: Path, files: dict[str, bytes]) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._versions = itertools.count()
        self.update(files)
        for name in files:
            (root / name).symlink_to(Path("..data") / name)

    def path(self, name: str) -> Path:
        return self.root / name

    def update(self, files: dict[str, bytes]) -> None:
        version = f"..v{next(self._versions)}"
        (self.root / version).mkdir()
        for name, data in files.items():
            (self.root / version / name).write_bytes(data)
        staged = self.root / "..data_tmp"
        staged.symlink_to(version)
        os.replace(staged, self.root / "..data")  # the one atomic flip
