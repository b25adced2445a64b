"""How a client trusts ganeti-rapi's certificate.

Ganeti generates a self-signed certificate per cluster (``/var/lib/ganeti/rapi.pem``
on a node, CN ``ganeti.example.com`` and no subjectAltName), so the system CA store
never trusts it. Two ways to trust it:

* ``ca_file``: verify the chain against that file. The hostname is not checked by
  default (Ganeti's generated certificate names no real host; Ganeti's own client
  does the same), ``verify_hostname=True`` turns the check on.
* ``fingerprint``: pin the certificate's SHA-256 digest, whatever it says.

With neither, the system store is used and the hostname checked, as for any
HTTPS server. ``insecure=True`` turns verification off, and says so in the log.
"""

from __future__ import annotations

import logging
import os
import re
import ssl

import aiohttp

from synnefo_ganeti.errors import ConfigError

__all__ = ["TLSConfig", "build_tls", "parse_fingerprint"]

logger = logging.getLogger("synnefo_ganeti.rapi")

TLSConfig = ssl.SSLContext | aiohttp.Fingerprint | bool

_HEX = re.compile(r"^[0-9a-f]{64}$")


def parse_fingerprint(value: str) -> bytes:
    """``"6B:5D:F2:..."``, ``"6b5df2..."`` or ``"sha256:6b5d..."`` -> 32 raw bytes."""
    text = value.strip().lower()
    text = text.removeprefix("sha256:").removeprefix("sha256=")
    text = text.replace(":", "").replace(" ", "")
    if not _HEX.match(text):
        raise ConfigError(
            f"fingerprint {value!r} is not a SHA-256 digest (64 hex digits, colons allowed); "
            "get it with: openssl x509 -in /var/lib/ganeti/rapi.pem -noout -fingerprint -sha256"
        )
    return bytes.fromhex(text)


def build_tls(
    url: str,
    *,
    ca_file: str | os.PathLike[str] | None,
    fingerprint: str | None,
    insecure: bool,
    verify_hostname: bool | None,
) -> tuple[TLSConfig, str]:
    """The ``ssl=`` argument for aiohttp and a short label of the trust mode."""
    chosen = [
        name
        for name, on in (("ca_file", ca_file), ("fingerprint", fingerprint), ("insecure", insecure))
        if on
    ]
    if len(chosen) > 1:
        raise ConfigError(
            f"{url}: give only one of ca_file, fingerprint or insecure, not {' and '.join(chosen)}"
        )
    if not url.startswith("https://"):
        if chosen:
            raise ConfigError(f"{url}: {chosen[0]} needs an https:// URL (ganeti-rapi serves HTTPS on :5080)")
        return False, "plain-http"
    if insecure:
        logger.warning(
            "TLS verification is OFF for %s (insecure=True): anyone on the path can read the RAPI "
            "password and forge answers; pin the certificate with ca_file or fingerprint instead",
            url,
        )
        return False, "insecure"
    if fingerprint:
        return aiohttp.Fingerprint(parse_fingerprint(fingerprint)), "fingerprint"
    if ca_file:
        path = os.fspath(ca_file)
        if not os.path.isfile(path):
            raise ConfigError(
                f"{url}: ca_file {path} does not exist; copy /var/lib/ganeti/rapi.pem from the cluster's "
                "master node, or pin the certificate with fingerprint"
            )
        try:
            context = ssl.create_default_context(cafile=path)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"{url}: ca_file {path} holds no usable PEM certificate ({exc}); "
                "use the cluster's /var/lib/ganeti/rapi.pem"
            ) from exc
        # Ganeti's generated certificate has no extensions; strict X.509 checks
        # (default from Python 3.13) would refuse it although it is the pinned anchor.
        context.verify_flags &= ~getattr(ssl, "VERIFY_X509_STRICT", 0)
        context.check_hostname = bool(verify_hostname)
        return context, "ca_file"
    context = ssl.create_default_context()
    context.check_hostname = verify_hostname is not False
    return context, "system-ca"
