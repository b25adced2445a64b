"""A self-signed certificate like the one Ganeti generates for ganeti-rapi, made anew or kept in a folder.

Ganeti makes ``rapi.pem`` once, at ``gnt-cluster init``, and ganeti-rapi serves it at every start;
:func:`keep_certificate` gives the fake the same: the certificate and key in a folder, made there
the first time and reused after (a client that trusts it by CA file or fingerprint keeps trusting it).
"""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

__all__ = ["keep_certificate", "write_certificate"]


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


def keep_certificate(directory: Path) -> tuple[Path, Path, str]:
    """The certificate and key in ``directory`` (``rapi.pem``, ``rapi.key``), written there if absent.

    Both files present: they are reused as they are (a key that does not match the certificate,
    or a certificate that has expired, is a ``ValueError`` naming the folder). Both absent: a new
    pair is written (the folder is created, mode 0700). One without the other is a ``ValueError``.
    Returns both paths and the certificate's SHA-256 fingerprint, as :func:`write_certificate`.
    """
    cert_path = directory / "rapi.pem"
    key_path = directory / "rapi.key"
    has_cert, has_key = cert_path.exists(), key_path.exists()
    if not has_cert and not has_key:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        return write_certificate(directory)
    if has_cert != has_key:
        missing, present = (key_path, cert_path) if has_cert else (cert_path, key_path)
        raise ValueError(
            f"{directory}: {present.name} without {missing.name}; give both, or neither to make a new pair"
        )
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except ValueError as exc:
        raise ValueError(f"{directory}: rapi.pem or rapi.key is not PEM: {exc}") from None
    if key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise ValueError(f"{directory}: rapi.key is not the key of rapi.pem")
    if cert.not_valid_after_utc <= datetime.datetime.now(datetime.UTC):
        raise ValueError(
            f"{directory}: rapi.pem expired on {cert.not_valid_after_utc:%Y-%m-%d}; remove rapi.pem and "
            "rapi.key to make a new pair"
        )
    return cert_path, key_path, cert.fingerprint(hashes.SHA256()).hex(":").upper()
