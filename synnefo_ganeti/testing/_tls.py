"""A self-signed certificate like the one Ganeti generates for ganeti-rapi."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

__all__ = ["write_certificate"]


def write_certificate(directory: Path, common_name: str = "ganeti.example.com") -> tuple[Path, Path, str]:
    """Write ``rapi.pem`` (certificate) and ``rapi.key``; return both paths and the SHA-256 fingerprint.

    Like Ganeti's: RSA 2048, self-signed, no extensions, CN ``ganeti.example.com``.
    """
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .sign(key, hashes.SHA256())
    )
    cert_path = directory / "rapi.pem"
    key_path = directory / "rapi.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path, cert.fingerprint(hashes.SHA256()).hex(":").upper()
