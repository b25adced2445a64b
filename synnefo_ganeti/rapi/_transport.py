"""The transport: one aiohttp session per backend, a bounded pool of request slots.

Design, and why:

* ganeti-rapi serves ``--max-clients`` (20) connections at a time and makes the
  others wait; more concurrency than that is slower, not faster (measured: 68.9
  submits/s at 20 connections, 39.1 at 40). So the transport never has more than
  ``max_connections`` requests in flight: a semaphore guards every request, and
  the connector's own limit is the same number.
* ``/2/jobs/ID/wait`` holds its connection for up to 10 s. Long-polls first take
  one of ``long_poll_slots`` (default 5) and only then a request slot, so however
  many jobs are being waited on, at least ``max_connections - long_poll_slots``
  slots stay free for submissions.
* ganeti-rapi closes every connection after its answer; the client never asks for
  that itself: a request carrying ``Connection: close`` (what aiohttp's
  ``force_close`` sends) waits ~40 ms longer in Ganeti's HTTP server, and so does a
  GET without ``Content-Length``. Bodiless requests carry ``Content-Length: 0``.
* No ``BasicAuth``/``auth=`` (deprecated in aiohttp 3.14): the ``Authorization``
  header is built once. The password lives only inside that header value.
* aiohttp's own resend of a GET, PUT or DELETE whose connection broke is off: one
  call is one request on the wire, so the retry policy counts every attempt.
* Errors are mapped here, once, onto :mod:`synnefo_ganeti.errors`; each message
  names the backend (its configured name and URL) and what to do. Retrying is the
  layer above's business.
* Every attempt is counted here (``synnefo_ganeti_rapi_requests_total``, by backend
  ``name``, HTTP method and outcome) and timed on the wire, from holding a slot to the
  whole answer read (``synnefo_ganeti_rapi_request_duration_seconds``; long-polls
  are left out: they last as long as Ganeti makes them wait).
* ``connection_losses`` counts the connection-level failures (refused, reset, no connection
  in time, TLS; not an answer that was only slow) and the sessions opened: what the client knows
  of the server (its Ganeti version) is read again after one (``_api_versions.py``).
"""

from __future__ import annotations

import asyncio
import base64
import html
import logging
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias

import aiohttp
import orjson
from prometheus_client import Counter, Histogram
from yarl import URL

from synnefo_ganeti._gc import gc_paused
from synnefo_ganeti._version import __version__
from synnefo_ganeti.errors import (
    AuthenticationError,
    BadRequestError,
    GanetiError,
    RapiConnectionError,
    RapiError,
    RapiNotFoundError,
    RapiTimeoutError,
    TLSError,
    UnavailableError,
)
from synnefo_ganeti.metrics import RAPI_LATENCY, RAPI_REQUESTS
from synnefo_ganeti.rapi._calls import with_job_reason
from synnefo_ganeti.rapi._tls import TLSConfig

__all__ = ["QueryArgs", "Transport"]

logger = logging.getLogger("synnefo_ganeti.rapi")

#: a request's query: a mapping, or (name, value) pairs where a name repeats (``?tag=a&tag=b``)
QueryArgs: TypeAlias = Mapping[str, str] | Sequence[tuple[str, str]]
_NO_BODY: Final = object()
USER_AGENT: Final = f"synnefo-ganeti/{__version__}"
LONG_POLL_GRACE: Final = 10.0  # Ganeti's /wait answers after at most ~10 s; allow this much more
_CLOSE_TURNS: Final = 4
_FINGERPRINT: Final = re.compile(r"[0-9A-F]{2}(?::[0-9A-F]{2}){31}")
# CPython before 3.12.8 (and 3.13.0) leaks TLS transports whose close the peer never completes.
_NEEDS_CLEANUP_CLOSED: Final = sys.version_info < (3, 12, 8) or (3, 13, 0) <= sys.version_info < (3, 13, 1)


class Transport:
    """Sends requests to one ganeti-rapi, at most ``max_connections`` at a time."""

    def __init__(
        self,
        url: str,
        *,
        username: str,
        password: str,
        tls: TLSConfig,
        tls_mode: str,
        max_connections: int,
        long_poll_slots: int,
        timeout: float,
        name: str | None = None,
    ) -> None:
        self.url = url
        self.name = name or default_name(url)
        #: how messages name the backend: its URL, after its configured name when it has one
        self.where = f"{name} ({url})" if name else url
        self.username = username
        self.tls_mode = tls_mode
        self.max_connections = max_connections
        self.long_poll_slots = long_poll_slots
        self.timeout = timeout
        self._base = url.rstrip("/")
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._tls = tls
        token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
        self._auth_header = f"Basic {token}"
        self._slots = asyncio.Semaphore(max_connections)
        self._poll_slots = asyncio.Semaphore(long_poll_slots)
        self._session: aiohttp.ClientSession | None = None
        self.in_flight = 0
        self.waiting = 0
        self.long_polls = 0
        self.requests_sent = 0
        #: connection-level failures and sessions opened so far: the server may have changed since
        self.connection_losses = 0
        self._counted: dict[tuple[str, str], Counter] = {}  # (method, outcome) -> labelled child
        self._timed: dict[str, Histogram] = {}  # method -> labelled child

    def __repr__(self) -> str:
        state = "open" if self._session is not None and not self._session.closed else "closed"
        return (
            f"<Transport {self.url} {state}, {self.in_flight}/{self.max_connections} in flight, "
            f"{self.waiting} waiting, {self.long_polls}/{self.long_poll_slots} long-polls>"
        )

    async def open(self) -> None:
        if self._session is not None:
            return
        self.connection_losses += 1  # a new session: whatever was known of the server is read again
        connector = aiohttp.TCPConnector(
            limit=self.max_connections,
            ssl=self._tls,
            # The server closes each connection; keep-alive bookkeeping is harmless,
            # but sending "Connection: close" would cost ~40 ms per request.
            force_close=False,
            # Python < 3.12.8 leaks TLS transports whose shutdown the server does not
            # finish (cpython#118960); aiohttp then aborts them itself, at the latest on close.
            enable_cleanup_closed=_NEEDS_CLEANUP_CLOSED,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),  # set per request, on purpose
            headers={"User-Agent": USER_AGENT, "Accept": "application/json"},
            skip_auto_headers=("Accept-Encoding",),
            raise_for_status=False,
        )
        # aiohttp sends a GET, PUT or DELETE once more, unasked, when the connection breaks
        # before the answer: that doubles every retry of a read, and repeats a write (a
        # shutdown, a remove) that Ganeti may have taken. Retrying is the layer above's call.
        if hasattr(self._session, "_retry_connection"):
            self._session._retry_connection = False

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
            # Closing a TLS connection takes a few more loop turns (close_notify, then the
            # socket): give them, so that a program that closes its loop right after does
            # not leave sockets behind.
            for _ in range(_CLOSE_TURNS):
                await asyncio.sleep(0)

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: QueryArgs | None = None,
        body: Any = _NO_BODY,
        timeout: float | None = None,
        long_poll: bool = False,
        decode: Callable[[bytes], Any] | None = None,
    ) -> Any:
        """Send one request and return the decoded JSON answer, or raise a :class:`GanetiError`.

        ``decode``: what makes the answer of the body (:func:`decode_json`; a caller may go on
        with the decoded answer there, before any other task runs; ValueError: not JSON)."""
        if self._session is None:
            raise GanetiError(
                f"{self.where}: the client is not open; use it as 'async with RapiClient(...) as rapi:'",
                url=self.url,
            )
        if long_poll:
            async with self._poll_slots:
                self.long_polls += 1
                try:
                    return await self._send(method, path, query, body, timeout, long_poll=True, decode=decode)
                finally:
                    self.long_polls -= 1
        return await self._send(method, path, query, body, timeout, decode=decode)

    async def _send(
        self,
        method: str,
        path: str,
        query: QueryArgs | None,
        body: Any,
        timeout: float | None,
        long_poll: bool = False,
        decode: Callable[[bytes], Any] | None = None,
    ) -> Any:
        assert self._session is not None
        url = URL(self._base + path, encoded=True)
        query = with_job_reason(method, path, query, body=body is not _NO_BODY)
        if query:
            url = url.with_query(query)
        headers = {"Authorization": self._auth_header}
        data: bytes
        if body is _NO_BODY:
            data = b""
            headers["Content-Length"] = "0"
        else:
            data = orjson.dumps(body)
            headers["Content-Type"] = "application/json"
        limit = self.timeout if timeout is None else timeout
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.in_flight += 1
        self.requests_sent += 1
        outcome = "canceled"
        started = time.perf_counter()
        try:
            async with self._session.request(
                method, url, data=data, headers=headers, timeout=self._client_timeout(limit)
            ) as response:
                payload = await response.read()
                status = response.status
        except GanetiError:
            outcome = "error"
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            error = self._transport_error(exc, method, path, limit)
            outcome = _outcome(error)
            if not (isinstance(error, RapiTimeoutError) and error.maybe_sent):
                self.connection_losses += 1  # not merely slow: the server may be another one now
            raise error from None
        else:
            outcome = "ok" if status < 400 else f"http_{status}"
        finally:
            elapsed = time.perf_counter() - started
            self.in_flight -= 1
            self._slots.release()
            if outcome != "ok":  # counted below once the body proves to be JSON
                self._count(method, outcome, None if long_poll or outcome == "canceled" else elapsed)
        logger.debug("%s %s %s -> %s in %.1f ms", self.url, method, path, status, elapsed * 1000)
        if status >= 400:
            raise self._http_error(status, payload, method, path)
        try:
            answer = decode_json(payload) if decode is None else decode(payload)
        except orjson.JSONDecodeError:
            self._count(method, "bad_answer", None if long_poll else elapsed)
            raise RapiError(
                f"{self.where}: {method} {path} answered HTTP {status} with a body that is not JSON "
                f"({payload[:80]!r}); is this URL a ganeti-rapi (port 5080)?",
                url=self.url,
                status=status,
            ) from None
        self._count(method, "ok", None if long_poll else elapsed)
        return answer

    def _count(self, method: str, outcome: str, elapsed: float | None) -> None:
        counter = self._counted.get((method, outcome))
        if counter is None:
            counter = self._counted[method, outcome] = RAPI_REQUESTS.labels(self.name, method, outcome)
        counter.inc()
        if elapsed is not None:
            histogram = self._timed.get(method)
            if histogram is None:
                histogram = self._timed[method] = RAPI_LATENCY.labels(self.name, method)
            histogram.observe(elapsed)

    def _client_timeout(self, limit: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(limit)
        if timeout is None:
            # ``total`` bounds everything, the body's read included; the connect
            # phase gets its own error so that "never sent" stays knowable.
            timeout = self._timeouts[limit] = aiohttp.ClientTimeout(total=limit, connect=limit)
        return timeout

    def _http_error(self, status: int, payload: bytes, method: str, path: str) -> RapiError:
        ganeti_message: str | None = None
        explain: str | None = None
        try:
            decoded = orjson.loads(payload)
        except orjson.JSONDecodeError:
            decoded = None
        if isinstance(decoded, dict):
            raw_message = decoded.get("message")
            ganeti_message = html.unescape(str(raw_message)) if raw_message is not None else None
            raw_explain = decoded.get("explain")
            explain = str(raw_explain) if raw_explain is not None else None
        said = f": {ganeti_message}" if ganeti_message else ""
        where = f"{self.where}: {method} {path} got HTTP {status}{said}"
        kwargs: dict[str, Any] = {
            "url": self.url,
            "status": status,
            "ganeti_message": ganeti_message,
            "explain": explain,
        }
        if status == 401:
            return AuthenticationError(
                f"{where}; the RAPI refused user '{self.username}': check the username and password "
                "(on the master, /var/lib/ganeti/rapi/users)",
                **kwargs,
            )
        if status == 403:
            return AuthenticationError(
                f"{where}; user '{self.username}' may not do this: give it write access "
                "('USER PASSWORD write' in /var/lib/ganeti/rapi/users)",
                **kwargs,
            )
        if status == 404:
            return RapiNotFoundError(f"{where}; check the name or id", **kwargs)
        if status in (400, 415):
            return BadRequestError(f"{where}; fix the request's parameters", **kwargs)
        if status in (502, 503, 504):
            return UnavailableError(
                f"{where}; Ganeti cannot take requests now (queue drained or full, or a proxy failed): "
                "retry later or check 'gnt-cluster queue info' and the master daemons",
                **kwargs,
            )
        return RapiError(
            f"{where}; see ganeti-rapi's log on the master (/var/log/ganeti/rapi-daemon.log)", **kwargs
        )

    def _transport_error(self, exc: BaseException, method: str, path: str, limit: float) -> GanetiError:
        what = f"{self.where}: {method} {path}"
        if isinstance(exc, aiohttp.ClientSSLError) and "fingerprint mismatch" in _reason(exc):
            found = _FINGERPRINT.search(_reason(exc))
            got = found.group(0) if found else "unknown"
            return TLSError(
                f"{what}: TLS certificate fingerprint mismatch: the server's SHA-256 is {got}, not the "
                "pinned one; check it on the master with "
                "'openssl x509 -in /var/lib/ganeti/rapi.pem -noout -fingerprint -sha256'",
                url=self.url,
            )
        if isinstance(exc, aiohttp.ClientSSLError):
            return TLSError(
                f"{what}: TLS verification failed ({_reason(exc)}); trust the cluster's certificate with "
                "ca_file (/var/lib/ganeti/rapi.pem from the master) or fingerprint",
                url=self.url,
            )
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return RapiTimeoutError(
                f"{what}: no connection within {limit:g} s; check that ganeti-rapi runs and the address "
                "is reachable",
                url=self.url,
                maybe_sent=False,
            )
        if isinstance(exc, TimeoutError):
            return RapiTimeoutError(
                f"{what}: no answer within {limit:g} s; Ganeti may be overloaded: raise the timeout or retry",
                url=self.url,
            )
        if isinstance(exc, aiohttp.ClientConnectorError):
            return RapiConnectionError(
                f"{what}: cannot connect ({_reason(exc)}); check the URL and that ganeti-rapi runs "
                "on the master (port 5080)",
                url=self.url,
                maybe_sent=False,
            )
        if isinstance(exc, aiohttp.ClientResponseError):
            return RapiConnectionError(
                f"{what}: the answer was not valid HTTP ({exc.message}); is the scheme right "
                "(ganeti-rapi speaks https://)?",
                url=self.url,
            )
        return RapiConnectionError(
            f"{what}: the connection broke before a full answer ({_reason(exc)}); retry",
            url=self.url,
        )


def default_name(url: str) -> str:
    """The backend label of a client made without a name: the URL's ``host:port``."""
    parsed = URL(url)
    host = parsed.raw_host or url
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return f"{host}:{parsed.port}" if parsed.port is not None else host


def _outcome(error: GanetiError) -> str:
    if isinstance(error, TLSError):
        return "tls"
    if isinstance(error, RapiTimeoutError):
        return "timeout"
    return "connection"


def _reason(exc: BaseException) -> str:
    cause = getattr(exc, "os_error", None) or exc.__cause__ or exc
    text = str(cause) or type(cause).__name__
    return text


#: answers larger than this are decoded with the cyclic garbage collector paused
LARGE_ANSWER = 64 * 1024


def decode_json(payload: bytes) -> Any:
    if len(payload) < LARGE_ANSWER:
        return orjson.loads(payload)
    with gc_paused():
        return orjson.loads(payload)
