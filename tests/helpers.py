"""The tests' one support module: waiting for things, instance specs, clients, a scriptable
in-process RAPI stub and self-signed certificates.

Fixtures shared by many files (``pg_url``, ``make_pg_url``, ``db_url``, ``sqlite_url``, ``testbed``)
live in ``tests/conftest.py``.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from aiohttp import web

from synnefo_ganeti import InstanceSpec, RapiClient, RetryPolicy
from synnefo_ganeti.testing._tls import write_certificate

if TYPE_CHECKING:
    from synnefo_ganeti.testing import FakeGaneti

FIXTURES = Path(__file__).parent / "fixtures"
RAPI_FIXTURES = FIXTURES / "ganeti-3.0-rapi"
QUEUE_FIXTURES = FIXTURES / "ganeti-3.0-queue"

USER = "ci"
PASSWORD = "s3cret-Pa55word"


# -- waiting for something to have happened -----------------------------------------------------------

#: how long ``eventually`` waits by default: long enough for a loaded CI machine, short enough
#: that a hang fails well before pytest-timeout's 120 s
WAIT = 30.0

T = TypeVar("T")


async def eventually(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = WAIT,
    what: str = "the condition",
    interval: float = 0.02,
) -> T:
    """Polls ``predicate`` (sync, or returning an awaitable) until it returns something true; returns it.

    Fails with ``AssertionError`` naming ``what`` (and the last value seen) after ``timeout`` seconds.
    Use it to wait for an event a test cannot be told about directly, never a fixed sleep.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout:g} s waiting for {what} (last: {result!r})")
        await asyncio.sleep(interval)


def eventually_sync(
    predicate: Callable[[], T], *, timeout: float = WAIT, what: str = "the condition", interval: float = 0.02
) -> T:
    """``eventually`` for code outside an event loop (threads, child processes)."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout:g} s waiting for {what} (last: {result!r})")
        time.sleep(interval)


async def clock_ticks() -> None:
    """Until the wall clock has moved past its reading now, so that everything stamped so far is
    strictly earlier than anything stamped from here on (``time.time()`` may be coarse)."""
    now = time.time()
    await eventually(lambda: time.time() > now, what="the wall clock to move on", interval=0.001)


# -- instance specs and clients ------------------------------------------------------------------------


def spec(
    name: str = "vm1.example.org",
    *,
    memory: int = 256,
    vcpus: int | None = None,
    disk_template: str = "diskless",
    os: str = "noop",
    **kwargs: Any,
) -> InstanceSpec:
    """An instance spec that every backend of the tests accepts; ``kwargs`` are InstanceSpec's own
    (a ``beparams`` there replaces ``memory``/``vcpus``)."""
    beparams: dict[str, Any] = {"memory": memory}
    if vcpus is not None:
        beparams["vcpus"] = vcpus
    kwargs.setdefault("beparams", beparams)
    return InstanceSpec(name=name, disk_template=disk_template, os=os, **kwargs)


#: retries quick enough for a test against a stub
FAST_RETRY = RetryPolicy(attempts=3, backoff=0.001, max_backoff=0.002)
#: no retries at all
ONCE = RetryPolicy(attempts=1)


def stub_client(url: str, **kwargs: Any) -> RapiClient:
    """A client of a ``StubRapi`` (its user and password; ``FAST_RETRY`` unless ``retry`` is given)."""
    kwargs.setdefault("retry", FAST_RETRY)
    kwargs.setdefault("username", USER)
    kwargs.setdefault("password", PASSWORD)
    return RapiClient(url, **kwargs)


def fake_client(fake: FakeGaneti, **kwargs: Any) -> RapiClient:
    """A client of a ``FakeGaneti`` (its credentials and CA; no retries unless ``retry`` is given)."""
    kwargs.setdefault("retry", ONCE)
    return RapiClient(
        fake.url, username=fake.username, password=fake.password, ca_file=fake.ca_file, **kwargs
    )


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- the RAPI stub -------------------------------------------------------------------------------------


def rapi_fixture(name: str) -> Any:
    """A recorded RAPI answer (``.json`` body, or ``.txt`` body + status line)."""
    text = (RAPI_FIXTURES / name).read_text()
    if name.endswith(".txt"):
        body, _, _status = text.rstrip("\n").rpartition("\n")
        return orjson.loads(body)
    return orjson.loads(text)


@dataclass
class Certificate:
    cert: Path
    key: Path
    sha256: str  # "AB:CD:..."


def make_certificate(directory: Path, common_name: str = "ganeti.example.com") -> Certificate:
    """A self-signed certificate without extensions, like the one Ganeti generates."""
    folder = directory / common_name
    folder.mkdir()
    cert, key, fingerprint = write_certificate(folder, common_name)
    return Certificate(cert, key, fingerprint)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class StubRapi:
    """An aiohttp server answering like ganeti-rapi, routes scripted by the test.

    Checks basic auth like Ganeti (401 body as Ganeti's), records every request,
    and tracks the highest number of requests in progress at once.
    """

    certificate: Certificate | None = None
    routes: dict[tuple[str, str], Handler] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    active: int = 0
    peak: int = 0
    url: str = ""
    _runner: web.AppRunner | None = None

    def route(self, method: str, path: str, handler: Handler | Any) -> None:
        if not callable(handler):
            value = handler

            async def fixed(_request: web.Request) -> web.StreamResponse:
                return json_response(value)

            handler = fixed
        self.routes[(method, path)] = handler

    async def __aenter__(self) -> StubRapi:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        context: ssl.SSLContext | None = None
        if self.certificate is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(self.certificate.cert, self.certificate.key)
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        server = site._server
        assert server is not None
        port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"{'https' if context else 'http'}://127.0.0.1:{port}"
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(Seen(request.method, request.path, dict(request.query), dict(request.headers), body))
        import base64

        expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        if request.headers.get("Authorization") != expected:
            return json_response(
                {
                    "code": 401,
                    "message": "Unauthorized",
                    "explain": "No permission -- see authorization schemes",
                },
                status=401,
            )
        handler = self.routes.get((request.method, request.path))
        if handler is None:
            return json_response(
                {"code": 404, "message": "Not Found", "explain": "Nothing matches the given URI"}, status=404
            )
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            return await handler(request)
        finally:
            self.active -= 1


def json_response(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")


def ganeti_error(status: int, message: str, explain: str = "") -> web.Response:
    return json_response({"code": status, "message": message, "explain": explain}, status=status)


async def never_answer(_request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(3600)  # a server that never answers: the client's timeout must end the call
    raise AssertionError("unreachable")
