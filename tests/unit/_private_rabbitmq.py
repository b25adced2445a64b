"""A private RabbitMQ node that a test starts, stops (gracefully or with SIGKILL) and starts again.

The shared broker at 127.0.0.1:5672 (node ``rabbit@localhost``) serves every other test on the
machine: restarting it would break them. A broker-restart test instead runs its own node,
``sgtest-<uuid>@localhost``, on free ports (AMQP and Erlang distribution), with its own
mnesia, log and plugin files and Erlang cookie in a temporary folder, and its own config file
(the machine's ``/etc/rabbitmq/rabbitmq.conf`` names the shared node's listener, 5672).

The folder is made with :func:`tempfile.mkdtemp`, not in pytest's ``tmp_path``: run as root,
the server runs as the ``rabbitmq`` user (as the distribution's ``rabbitmq-server`` wrapper
does), who cannot enter ``/tmp/pytest-of-root`` (mode 700); so the folder is chowned to it.
The server runs in the foreground (``/usr/lib/rabbitmq/bin/rabbitmq-server``) in its own
session: its ``sh`` turns a SIGTERM into the node's graceful shutdown (the ``TERM`` trap of
that script, what ``docker stop`` does), and a SIGKILL of the process group is a crash.
:meth:`PrivateRabbitMQ.start` waits for the node's readiness by connecting over AMQP until it
answers (an event, with a deadline), never by sleeping a fixed time. The data folder stays
across :meth:`stop`/:meth:`kill` and :meth:`start`: durable exchanges, queues, bindings and
persistent messages survive a restart, as on a real broker's restart.

``async with PrivateRabbitMQ(server) as broker:`` starts it; leaving the block kills whatever
runs and removes the folder, on failure too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import socket
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

import aio_pika

__all__ = ["PrivateRabbitMQ", "find_rabbitmq_server", "require_private_rabbitmq"]

#: where Debian's rabbitmq-server package keeps the real start script (``/usr/sbin``'s wrapper
#: ``su``s to the ``rabbitmq`` user, redirects the output and drops our environment's meaning)
_SERVER_SCRIPTS = ("/usr/lib/rabbitmq/bin/rabbitmq-server",)
#: seconds a node may take to boot (about 7 s on two shared CPUs) or to stop gracefully
_BOOT_DEADLINE = 90.0
_STOP_DEADLINE = 60.0


def find_rabbitmq_server() -> Path | None:
    """The foreground start script of the installed RabbitMQ server, or None without it."""
    for candidate in (os.environ.get("SYNNEFO_GANETI_TEST_RABBITMQ_SERVER"), *_SERVER_SCRIPTS):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def require_private_rabbitmq() -> Path:
    """The server's start script; the calling test is skipped without it (or without a
    ``rabbitmq`` user to run it as, when root), and failed in CI."""
    import pytest

    server = find_rabbitmq_server()
    problem = None
    if server is None:
        problem = f"no RabbitMQ server script ({', '.join(_SERVER_SCRIPTS)}); install rabbitmq-server"
    elif os.geteuid() == 0:
        try:
            pwd.getpwnam("rabbitmq")
        except KeyError:
            problem = "running as root without a 'rabbitmq' user to run a private RabbitMQ as"
    if problem is not None or server is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the RabbitMQ restart tests: {problem}")
        pytest.skip(problem or "")
    return server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PrivateRabbitMQ:
    """A RabbitMQ node of its own on 127.0.0.1:``port`` (guest/guest), started, stopped, killed."""

    def __init__(self, server: Path) -> None:
        self.server = server
        self.node = f"sgtest-{uuid.uuid4().hex[:12]}@localhost"
        self.port = _free_port()
        self.dist_port = _free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="sg-private-rabbitmq-"))
        self.output = self.folder / "server.out"
        self.starts = 0  # times the node was started (and answered)
        self._process: asyncio.subprocess.Process | None = None
        self._user = "rabbitmq" if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    def __repr__(self) -> str:
        state = f"running (pid {self._process.pid})" if self.running and self._process else "stopped"
        return f"<PrivateRabbitMQ {self.node} 127.0.0.1:{self.port} {state}, started {self.starts} times>"

    async def __aenter__(self) -> PrivateRabbitMQ:
        try:
            for sub in ("mnesia", "log"):
                (self.folder / sub).mkdir()
            (self.folder / "enabled_plugins").write_text("[].\n")  # no plugins: a faster boot
            (self.folder / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n")
            if self._user is not None:
                entry = pwd.getpwnam(self._user)
                for path in (self.folder, *self.folder.rglob("*")):
                    os.chown(path, entry.pw_uid, entry.pw_gid)
            await self.start()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.kill()  # (the data goes with the folder: no reason to stop it gently)
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
        env.update(
            HOME=str(self.folder),  # (the node's own Erlang cookie, made there)
            RABBITMQ_NODENAME=self.node,  # (overrides /etc/rabbitmq/rabbitmq-env.conf's NODENAME)
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_CONFIG_FILE=str(self.folder / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.folder / "advanced.config"),
            RABBITMQ_MNESIA_BASE=str(self.folder / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.folder / "log"),
            RABBITMQ_PID_FILE=str(self.folder / "pid"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.folder / "enabled_plugins"),
        )
        return env

    def log_tail(self, size: int = 3000) -> str:
        """The end of the server's output and of its node log (for a failure's message)."""
        parts = []
        for path in (self.output, self.folder / "log" / f"{self.node}.log"):
            with contextlib.suppress(OSError):
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-size:]}")
        return "\n".join(parts)

    async def start(self) -> None:
        """Start the node (on the same ports and data as before) and wait until it answers AMQP."""
        if self.running:
            raise RuntimeError(f"{self!r} is already running")
        user: dict[str, object] = {}
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        with self.output.open("ab") as output:
            self._process = await asyncio.create_subprocess_exec(
                str(self.server),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=asyncio.subprocess.STDOUT,
                cwd=self.folder,
                env=self._environment(),
                start_new_session=True,  # (its own process group: a kill takes the whole node)
                **user,  # type: ignore[arg-type]
            )
        await self._wait_ready()
        self.starts += 1

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + _BOOT_DEADLINE
        problem: BaseException | None = None
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"{self!r} exited while booting:\n{self.log_tail()}")
            try:  # (the port first: a refused AMQP connect logs an error in aiormq)
                _reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.transport.abort()
                connection = await aio_pika.connect(self.url, timeout=5)
            except (OSError, TimeoutError, aio_pika.exceptions.AMQPError) as exc:
                problem = exc
                await asyncio.sleep(0.1)  # (polling an event with a deadline, not waiting a time)
                continue
            await connection.close()
            return
        raise RuntimeError(
            f"{self!r} did not answer within {_BOOT_DEADLINE:g} s ({problem!r}):\n{self.log_tail()}"
        )

    async def stop(self) -> None:
        """A graceful stop: SIGTERM to the start script, which stops the node (every connection
        closed by the broker, ``CONNECTION_FORCED``) and exits; waits for that."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            async with asyncio.timeout(_STOP_DEADLINE):
                await process.wait()
        except TimeoutError:
            await self.kill()
            raise RuntimeError(
                f"{self!r} did not stop within {_STOP_DEADLINE:g} s:\n{self.log_tail()}"
            ) from None
        self._kill_group(process.pid)  # (nothing should be left; a straggler would hold the ports)
        await self._wait_gone()

    async def kill(self) -> None:
        """A crash: SIGKILL to every process of the node; nothing flushed, connections cut."""
        process = self._process
        if process is None:
            return
        self._kill_group(process.pid)
        await process.wait()
        await self._wait_gone()

    async def _wait_gone(self) -> None:
        """Until the node's AMQP port refuses connections: the killed node's processes are gone
        (its start script, which we wait for, can end before the Erlang VM does)."""
        deadline = time.monotonic() + _STOP_DEADLINE
        while time.monotonic() < deadline:
            try:
                _reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                return
            writer.transport.abort()
            await asyncio.sleep(0.05)
        raise RuntimeError(f"{self!r}: port {self.port} still answers {_STOP_DEADLINE:g} s after the stop")

    @staticmethod
    def _kill_group(pgid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
