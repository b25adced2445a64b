"""The fake's servers close every accepted socket exactly once, however they are stopped.

A server stopped while clients connect used to lose a socket now and then (one cancelled
``loop.sock_accept`` or an unstarted connection task): it was closed by the garbage
collector with a ``ResourceWarning``, which ``filterwarnings = error`` turns into a failed
test somewhere else. These tests stop servers under a stream of connections, many times.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from synnefo_ganeti.testing import ChaosProxy, FakeGaneti
from synnefo_ganeti.testing._sockets import Accepted, Listener, spawn_serving

ROUNDS = 8


@contextlib.contextmanager
def no_leaks() -> Iterator[None]:
    """Fails if a socket is left to the garbage collector, or the loop logs an error callback."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
            gc.collect()
    finally:
        loop.set_exception_handler(previous)
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []
    assert [context.get("message") for context in errors] == []


async def _connect_forever(port: int, clients: list[socket.socket], request: bytes) -> None:
    loop = asyncio.get_running_loop()
    while True:
        sock = socket.socket()
        sock.setblocking(False)
        clients.append(sock)
        with contextlib.suppress(OSError):
            await loop.sock_connect(sock, ("127.0.0.1", port))
            if request:
                await loop.sock_sendall(sock, request)
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def hammering(port: int, request: bytes = b"") -> AsyncIterator[None]:
    clients: list[socket.socket] = []
    tasks = [asyncio.create_task(_connect_forever(port, clients, request)) for _ in range(16)]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sock in clients:
            sock.close()


@pytest.mark.parametrize("tls", [True, False], ids=["https", "http"])
async def test_a_fake_stopped_while_clients_connect_closes_every_socket(tls: bool) -> None:
    request = b"" if tls else b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n"
    with no_leaks():
        for round_ in range(ROUNDS):
            fake = FakeGaneti(tls=tls, max_clients=4)
            await fake.start()
            async with hammering(fake.port, request):
                for _ in range(1 + round_ % 5):
                    await asyncio.sleep(0)
                await fake.stop()


async def test_a_proxy_stopped_while_clients_connect_closes_every_socket() -> None:
    async with FakeGaneti(tls=False) as fake:
        with no_leaks():
            for round_ in range(ROUNDS):
                proxy = ChaosProxy("127.0.0.1", fake.port)
                await proxy.start()
                async with hammering(proxy.port, b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n"):
                    for _ in range(1 + round_ % 5):
                        await asyncio.sleep(0)
                    if round_ % 2:
                        proxy.set_mode("refuse")  # closes the listener while the accept task waits
                    await proxy.stop()


async def test_a_cancelled_accept_loses_no_connection() -> None:
    """Whenever the accepting task is cancelled, a connection is either returned or still pending."""
    with no_leaks():
        for yields in range(6):
            raw = socket.create_server(("127.0.0.1", 0))
            listener = Listener(raw)
            accepting = asyncio.create_task(listener.accept())
            await asyncio.sleep(0)
            client = socket.create_connection(raw.getsockname())
            for _ in range(yields):
                await asyncio.sleep(0)
            accepting.cancel()
            results = await asyncio.gather(accepting, return_exceptions=True)
            accepted = results[0]
            if isinstance(accepted, socket.socket):
                accepted.close()
            else:
                assert isinstance(accepted, asyncio.CancelledError)
                pending, _ = raw.accept()  # still in the backlog, not lost
                pending.close()
            listener.close()
            assert raw.fileno() == -1
            client.close()


async def test_an_accepted_socket_is_closed_when_its_task_never_ran_or_failed() -> None:
    with no_leaks():
        tasks: set[asyncio.Task[None]] = set()

        async def serve(accepted: Accepted, fail: bool) -> None:
            if fail:
                raise OSError("before any transport")

        for fail in (False, True):
            ours, theirs = socket.socketpair()
            accepted = Accepted(ours)
            task = spawn_serving(serve(accepted, fail), accepted, tasks)
            if not fail:
                task.cancel()  # before it ever ran
            await asyncio.gather(task, return_exceptions=True)
            assert ours.fileno() == -1 and accepted.taken and not tasks
            theirs.close()

        # once a transport took it, the transport closes it, not us
        ours, theirs = socket.socketpair()
        accepted = Accepted(ours)
        accepted.take()
        accepted.close()
        assert ours.fileno() != -1
        ours.close()
        theirs.close()
