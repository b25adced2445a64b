"""``ChaosProxy``: a TCP proxy between a RAPI client and its server that breaks the network on demand.

Design, and why:

* It proxies bytes, not HTTP: TLS passes through untouched (the client still sees the
  server's certificate), so what a client meets is what a real network does to it.
* The mode is read when a connection is accepted and holds for that connection's life:
  a test switches it between calls, never in the middle of one, and each attempt of a
  retrying client meets exactly one mode. ``times`` bounds how many connections meet a
  fault before the proxy passes traffic again (a fault that clears by itself).
* Modes:

  - ``pass``: forward both ways;
  - ``reset``: accept, wait for the client's first bytes, then close with an RST
    (``SO_LINGER`` 0); with ``forward=True`` the request reaches the server first and
    the reset replaces its answer (the "sent, but the answer was lost" case);
  - ``refuse``: stop listening, so connecting is refused by the kernel (the port is kept
    and listened on again when the mode changes);
  - ``hang``: accept, read, never answer; with ``forward=True`` the server gets the
    request and its answer is thrown away;
  - ``slow``: forward, but the answer (server to client) goes ``chunk`` bytes at a time,
    ``delay`` seconds before each.

* Counters: ``connections`` (accepted, by mode in ``by_mode``), ``bytes_up`` (client to
  server) and ``bytes_down`` (server to client).

Every connection is a task the proxy owns; ``stop()`` cancels them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections import Counter
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Protocol, Self

from synnefo_ganeti.testing._sockets import Accepted, Listener, spawn_serving

__all__ = ["PROXY_MODES", "ChaosProxy"]

PROXY_MODES = ("pass", "reset", "refuse", "hang", "slow")
_READ = 64 * 1024


class _HasURL(Protocol):
    @property
    def url(self) -> str: ...


class ChaosProxy:
    """``async with ChaosProxy(host, port) as proxy:`` forwards ``proxy.port`` to ``host:port``."""

    def __init__(self, target_host: str, target_port: int, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = host
        self.port = port
        self.mode = "pass"
        self.delay = 0.0
        self.chunk = 1
        self.forward = False
        self.times: int | None = None
        self.connections = 0
        self.by_mode: Counter[str] = Counter()
        self.bytes_up = 0
        self.bytes_down = 0
        self._listener: Listener | None = None
        self._running = False
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        listening = "listening" if self._listener is not None else "not listening"
        return (
            f"<ChaosProxy {self.host}:{self.port} -> {self.target_host}:{self.target_port} mode={self.mode} "
            f"{listening}, {self.connections} connections, {len(self._tasks)} open, "
            f"{self.bytes_up} bytes up, {self.bytes_down} bytes down>"
        )

    # ------------------------------------------------------------------ knobs

    def url_for(self, server: _HasURL | str) -> str:
        """``server``'s URL (a :class:`FakeGaneti` or a URL) with the proxy's address in it."""
        url = server if isinstance(server, str) else server.url
        scheme = url.split("://", 1)[0]
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    def set_mode(
        self,
        mode: str,
        *,
        delay: float = 0.1,
        chunk: int = 1,
        forward: bool = False,
        times: int | None = None,
    ) -> None:
        """Switch the mode for the connections accepted from now on (see the module docstring).

        ``times``: this many connections meet the mode, then the proxy passes again.
        """
        if mode not in PROXY_MODES:
            raise ValueError(f"unknown proxy mode {mode!r}; choose from {', '.join(PROXY_MODES)}")
        if delay < 0 or chunk < 1:
            raise ValueError("delay must be >= 0 and chunk >= 1")
        if times is not None and times < 1:
            raise ValueError("times must be >= 1 (or None: until changed)")
        if times is not None and mode == "refuse":
            raise ValueError("a refused connection never reaches the proxy: 'refuse' lasts until changed")
        self.mode, self.delay, self.chunk, self.forward, self.times = mode, delay, chunk, forward, times
        if mode == "refuse":
            self._close_listener()
        elif self._running and self._listener is None:
            self._listen()

    def retarget(self, host: str, port: int) -> None:
        """Send the connections accepted from now on to ``host:port``."""
        self.target_host, self.target_port = host, port

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        self._running = True
        self._listen()

    async def stop(self) -> None:
        self._running = False
        self._close_listener()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _listen(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, self.port))
            listener.listen(128)
        except OSError:
            listener.close()
            raise
        self.port = listener.getsockname()[1]
        self._listener = Listener(listener)
        self._spawn(self._accept(self._listener), f"proxy accept {self.port}")

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        for task in list(self._tasks):
            if task.get_name().startswith("proxy accept"):
                task.cancel()
        listener.close()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ connections

    async def _accept(self, listener: Listener) -> None:
        while True:
            connection = await listener.accept()
            mode = self.mode
            if self.times is not None:
                self.times -= 1
                if self.times <= 0:
                    self.mode, self.times = "pass", None
            self.connections += 1
            self.by_mode[mode] += 1
            accepted = Accepted(connection)
            coro = self._serve(accepted, mode, self.forward)
            spawn_serving(coro, accepted, self._tasks, f"proxy connection {self.connections}")

    async def _serve(self, accepted: Accepted, mode: str, forward: bool) -> None:
        """Serve one connection; its socket is closed exactly once (see :mod:`._sockets`)."""
        upstream: asyncio.StreamWriter | None = None
        reader, writer = await _streams(accepted)
        try:
            if mode == "reset" and not forward:
                await reader.read(1)  # the client's first bytes (its request, or its TLS hello)
                _reset(writer)
                return
            if mode == "hang" and not forward:
                while await reader.read(_READ):
                    pass  # read everything, answer nothing
                return
            try:
                server_reader, upstream = await asyncio.open_connection(self.target_host, self.target_port)
            except OSError:
                _reset(writer)
                return
            answered = asyncio.Event()
            async with asyncio.TaskGroup() as group:
                sending = group.create_task(self._pump(reader, upstream, up=True))
                if mode in ("reset", "hang"):  # forward=True: the server gets the request
                    group.create_task(self._swallow(server_reader, answered))
                    if mode == "hang":
                        await sending  # until the client gives up
                        raise _Done
                    await answered.wait()
                    _reset(writer)
                    raise _Done
                else:
                    slow = mode == "slow"
                    group.create_task(self._pump(server_reader, writer, up=False, slow=slow))
        except* _Done:
            pass
        except* (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            stopping = _cancelling()
            for stream in (writer, upstream):
                if stream is None:
                    continue
                if stopping:
                    stream.transport.abort()  # stop(): closed now, whatever is left unsent
                else:
                    stream.close()

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, up: bool, slow: bool = False
    ) -> None:
        while data := await source.read(_READ):
            if slow:
                for start in range(0, len(data), self.chunk):
                    await asyncio.sleep(self.delay)
                    piece = data[start : start + self.chunk]
                    sink.write(piece)
                    self.bytes_down += len(piece)
                    await sink.drain()
                continue
            sink.write(data)
            if up:
                self.bytes_up += len(data)
            else:
                self.bytes_down += len(data)
            await sink.drain()
        with contextlib.suppress(OSError):
            if sink.can_write_eof():
                sink.write_eof()

    @staticmethod
    async def _swallow(source: asyncio.StreamReader, answered: asyncio.Event) -> None:
        while await source.read(_READ):
            answered.set()
        answered.set()


async def _streams(accepted: Accepted) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """``asyncio.open_connection(sock=...)``, telling ``accepted`` when the transport takes the socket."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)

    def protocol() -> asyncio.StreamReaderProtocol:
        accepted.take()
        return asyncio.StreamReaderProtocol(reader, loop=loop)

    transport, made = await loop.connect_accepted_socket(protocol, accepted.sock)
    return reader, asyncio.StreamWriter(transport, made, reader, loop)


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class _Done(Exception):
    """Ends a connection's task group on purpose."""


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST: SO_LINGER on, 0 seconds."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
