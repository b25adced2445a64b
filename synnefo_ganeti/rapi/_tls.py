"""How a client trusts ganeti-rapi's certificate.

Ganeti generates a self-signed certificate per cluster (``/var/lib/ganeti/rapi.pem``
on a node, CN ``ganeti.example.com`` and no subjectAltName), so the system CA store
never trusts it. Two ways to trust it:

* ``ca_file``: verify the chain against that file. The hostname is not checked by
  default (Ganeti's generated certificate names no real host; Ganeti's own client
  does the same), ``verify_hostname=True`` turns the check on.
* ``fingerprint``: pin the certificate's SHA-256 digest, whatever it says.

Every mode resumes TLS sessions (see :class:`ResumingContext`): ganeti-rapi closes
each connection, and a resumed handshake spares both sides the public-key work.

With neither, the system store is used and the hostname checked, as for any
HTTPS server. ``insecure=True`` turns verification off, and says so in the log.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import ssl
from typing import Any

from synnefo_ganeti.errors import ConfigError

__all__ = ["ResumingContext", "TLSConfig", "build_tls", "parse_fingerprint"]

logger = logging.getLogger("synnefo_ganeti.rapi")

TLSConfig = ssl.SSLContext | bool

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


class _ResumingObject(ssl.SSLObject):
    """Hands its TLS session back to its context once it has one (TLS 1.3 tickets come after
    the handshake, with the first read), and checks a pinned fingerprint after the handshake."""

    _captured = False

    def do_handshake(self) -> None:
        super().do_handshake()
        context = self.context
        if isinstance(context, ResumingContext):
            context._after_handshake(self)

    def read(self, len: int = 1024, buffer: Any = None) -> Any:
        data = super().read(len, buffer)
        if not self._captured:
            # A full handshake's session (TLS 1.3: its ticket, which arrives with the first
            # read) is kept; a resumed one changes nothing worth the cost of reading it.
            self._captured = True
            context = self.context
            if isinstance(context, ResumingContext) and not self.session_reused:
                context._remember(self)
        return data


class ResumingContext(ssl.SSLContext):
    """An SSL context whose new connections resume the last TLS session.

    ganeti-rapi closes every connection, so without resumption each request pays a
    full handshake (an RSA signature on the server, key exchange on both sides).
    asyncio gives no way to pass a session to a connection, so the context passes
    it itself (``wrap_bio``). Optionally pins the peer certificate's SHA-256.
    """

    sslobject_class = _ResumingObject
    _session: ssl.SSLSession | None = None
    _pinned: bytes | None = None
    resumed = 0
    handshakes = 0

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        if session is None and not server_side:
            session = self._session
        return super().wrap_bio(
            incoming, outgoing, server_side=server_side, server_hostname=server_hostname, session=session
        )

    def _after_handshake(self, obj: ssl.SSLObject) -> None:
        self.handshakes += 1
        if obj.session_reused:
            self.resumed += 1
        if self._pinned is not None:
            der = obj.getpeercert(binary_form=True) or b""
            got = hashlib.sha256(der).digest()
            if not hmac.compare_digest(got, self._pinned):
                self._session = None
                raise ssl.SSLCertVerificationError(
                    f"certificate fingerprint mismatch: the server's SHA-256 is {got.hex(':').upper()}"
                )

    def _remember(self, obj: ssl.SSLObject) -> None:
        session = obj.session
        if session is not None:
            self._session = session


def _client_context(*, cafile: str | None = None, verify: bool = True) -> ResumingContext:
    context = ResumingContext(ssl.PROTOCOL_TLS_CLIENT)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif cafile is not None:
        context.load_verify_locations(cafile=cafile)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    return context


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
        return _client_context(verify=False), "insecure"
    if fingerprint:
        context = _client_context(verify=False)
        context._pinned = parse_fingerprint(fingerprint)
        return context, "fingerprint"
    if ca_file:
        path = os.fspath(ca_file)
        if not os.path.isfile(path):
            raise ConfigError(
                f"{url}: ca_file {path} does not exist; copy /var/lib/ganeti/rapi.pem from the cluster's "
                "master node, or pin the certificate with fingerprint"
            )
        try:
            context = _client_context(cafile=path)
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
    context = _client_context()
    context.check_hostname = verify_hostname is not False
    return context, "system-ca"
