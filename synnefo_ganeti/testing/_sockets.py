"""Listening and accepted sockets of the fake's servers, each closed exactly once.

Why not ``loop.sock_accept``: when the task awaiting it is cancelled (a server's ``stop()``)
in the loop iteration where a client connects, the accepted socket is lost: either the
future's result is dropped with the cancelled task, or (CPython 3.11) the selector's
callback accepts into a cancelled future, fails on ``set_result`` and drops the socket.
Either way it is closed only by the garbage collector, with a ``ResourceWarning``.

Here a :class:`Listener` waits for readability (a future nobody's result depends on)
and accepts synchronously, so an accepted socket is always returned to its caller; the
caller hands it to the task serving it as an :class:`Accepted`, which closes the socket
when the task ends (cancelled before it ran, or failed before a transport took the
socket). Once a transport took it (its protocol factory ran), the transport closes it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Coroutine
from typing import Any

__all__ = ["Accepted", "Listener", "spawn_serving"]


class Listener:
    """A non-blocking listening socket; ``await accept()`` never loses a connection."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._fd = sock.fileno()
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        state = "closed" if self.sock.fileno() == -1 else "listening"
        return f"<Listener fd={self._fd} {state}>"

    async def accept(self) -> socket.socket:
        """The next connection (non-blocking). Cancelling the wait accepts nothing."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                connection, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                pass
            else:
                # From here to the caller's hand-off nothing awaits: no cancellation can drop it.
                connection.setblocking(False)
                return connection
            if self.sock.fileno() == -1:
                raise OSError(9, "the listener is closed")
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiter, self._loop = waiter, loop
            loop.add_reader(self._fd, self._readable, waiter)
            try:
                await waiter
            finally:
                self._unregister(waiter)

    @staticmethod
    def _readable(waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    def _unregister(self, waiter: asyncio.Future[None]) -> None:
        if self._waiter is waiter and self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._waiter = self._loop = None

    def close(self) -> None:
        """Stop watching the socket (at once, before its descriptor can be reused) and close it."""
        waiter = self._waiter
        if waiter is not None:
            self._unregister(waiter)
            waiter.cancel()
        self.sock.close()


class Accepted:
    """An accepted socket on its way to a transport: whoever ends up owning it closes it, once."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.taken = False

    def __repr__(self) -> str:
        return f"<Accepted {self.sock!r} {'taken' if self.taken else 'not taken'}>"

    def take(self) -> None:
        """A transport owns the socket from now on (called from its protocol factory)."""
        self.taken = True

    def close(self) -> None:
        """Close the socket unless a transport took it."""
        if not self.taken:
            self.taken = True
            self.sock.close()


def spawn_serving(
    coro: Coroutine[Any, Any, None],
    accepted: Accepted,
    tasks: set[asyncio.Task[None]],
    name: str | None = None,
) -> asyncio.Task[None]:
    """Run ``coro`` serving ``accepted`` as a task held in ``tasks``; when the task ends (even
    cancelled before it ever ran), the socket is closed unless a transport took it."""

    def done(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        accepted.close()

    task = asyncio.get_running_loop().create_task(coro, name=name)
    tasks.add(task)
    task.add_done_callback(done)
    return task
