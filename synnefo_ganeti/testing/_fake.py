"""``FakeGaneti``: a Ganeti cluster in a few milliseconds, for tests, demos and benchmarks.

``async with FakeGaneti() as fake:`` starts an aiohttp server answering Ganeti 3.0's RAPI
(or 3.1's, or 2.16's: ``version=``), HTTPS with a generated self-signed certificate or plain
HTTP, backed by an in-memory cluster whose job engine writes a queue directory as Ganeti does.
Its knobs (latency, ``max_clients``, op run times, faults, crashed nodes, slow submits) can be
changed while it runs.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from synnefo_ganeti.testing import _node_faults, _ops_nodes
from synnefo_ganeti.testing._engine import FakeCluster
from synnefo_ganeti.testing._queue import QueueDir
from synnefo_ganeti.testing._server import FAULT_KINDS, Fault, RapiApp
from synnefo_ganeti.testing._slow import SlowSubmit
from synnefo_ganeti.testing._sockets import Accepted, Listener, spawn_serving
from synnefo_ganeti.testing._tls import keep_certificate, write_certificate
from synnefo_ganeti.testing._versions import DEFAULT_VERSION, profile

__all__ = ["FakeGaneti"]


class _Tracked(asyncio.Protocol):
    """Passes everything to aiohttp's protocol, and says when the connection is gone."""

    def __init__(self, inner: Any, on_lost: Callable[[], None]) -> None:
        self.inner = inner
        self.on_lost = on_lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self.inner.eof_received()
        return result

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self.inner.connection_lost(exc)
        finally:
            self.on_lost()


_SHM = "/dev/shm"
_SHM_USABLE = os.path.isdir(_SHM) and os.access(_SHM, os.W_OK)


class FakeGaneti:
    """A fake Ganeti cluster with a real RAPI server and a real queue directory.

    Keyword arguments, all optional:

    * ``nodes``: how many nodes (``node1.fake.test``...), each with ``node_memory``
      MiB, ``node_disk`` MiB and ``node_cpus`` CPUs;
    * ``queue_dir``: where to write job files (default: a temporary directory,
      removed on exit); ``fsync`` to fsync each version as Ganeti does;
    * ``latency``: seconds added to every answer, or a callable drawing them;
    * ``max_clients``: requests served at once (ganeti-rapi's 20); more wait;
    * ``tls``: HTTPS with a generated certificate (``ca_file``), else plain HTTP;
      ``tls_dir``: keep the certificate there (``rapi.pem``, ``rapi.key``: reused if present,
      else made there and kept), so that ``ca_file`` and ``fingerprint`` stay the same across
      restarts (default: a new one at each start, removed on exit);
    * ``host``/``port``: where to listen (default 127.0.0.1 and a free port);
    * ``username``/``password``: RAPI credentials (default ``fake`` and a random one);
    * ``max_running_jobs``, ``op_times`` (seconds per ``OP_ID``, and ``"dry_run"``),
      ``archive_after`` (seconds after a job ends, default never), ``wait_timeout``
      (a ``/wait`` long-poll answers unchanged after this, Ganeti's 10 s);
      ``op_times["OP_INSTANCE_CREATE/disks"]``: the part of a create that holds its node locks;
    * ``default_iallocator`` (``hail``): what a create without ``pnode`` uses;
      ``opportunistic_retry``: seconds between an opportunistic create's lock attempts (Ganeti's 2);
    * ``oses`` (``GET /2/os``; a variant as ``os+variant``), ``disk_templates``, ``cluster_name``;
    * ``ipolicy``: the instance policy's bounds, ``{"memory-size": (min, max), ...}`` over the
      default ones (``cpu-count``, ``disk-size``, ``disk-count``, ``nic-count``, ``spindle-use``);
    * ``version``: the Ganeti it answers as, ``"3.0"`` (default), ``"3.1"`` or ``"2.16"``: each one's
      ``/2/info``, defaults, refusals and routes (:mod:`._versions`); ``ValueError`` for another;
    * ``hosts``: names the cluster's resolver knows, ``{name: ip}`` besides the nodes' own: a create
      (or rename) with ``name_check``, Ganeti 3.0's and 2.16's default, needs its name there.
    """

    def __init__(
        self,
        *,
        nodes: int = 3,
        queue_dir: str | os.PathLike[str] | None = None,
        latency: float | Callable[[], float] = 0.0,
        max_clients: int = 20,
        tls: bool = True,
        tls_dir: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        username: str = "fake",
        password: str | None = None,
        max_running_jobs: int = 20,
        op_times: dict[str, float] | None = None,
        archive_after: float | None = None,
        wait_timeout: float = 10.0,
        fsync: bool = False,
        node_memory: int = 32768,
        node_disk: int = 512 * 1024,
        node_cpus: int = 8,
        oses: tuple[str, ...] = ("noop",),
        disk_templates: tuple[str, ...] = ("diskless", "file"),
        cluster_name: str = "cluster.fake.test",
        default_iallocator: str = "hail",
        opportunistic_retry: float = 2.0,
        ipolicy: dict[str, tuple[int, int]] | None = None,
        version: str = DEFAULT_VERSION,
        hosts: dict[str, str] | None = None,
    ) -> None:
        self._version = profile(version)  # first: a bad version is refused before anything else
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, not {nodes}")
        if max_clients < 1:
            raise ValueError(f"max_clients must be >= 1, not {max_clients}")
        if max_running_jobs < 1:
            raise ValueError(f"max_running_jobs must be >= 1, not {max_running_jobs}")
        if not callable(latency) and latency < 0:
            raise ValueError(f"latency must be >= 0 seconds, not {latency}")
        for key, seconds in (op_times or {}).items():
            if seconds < 0:
                raise ValueError(f"op_times[{key!r}] must be >= 0 seconds, not {seconds}")
        if tls_dir is not None and not tls:
            raise ValueError("tls_dir needs tls=True")
        self.host = host
        self.port = port
        self.tls = tls
        self.tls_dir = Path(tls_dir) if tls_dir is not None else None
        self.username = username
        self.password = password or secrets.token_urlsafe(12)
        self.fsync = fsync
        self._queue_arg = Path(queue_dir) if queue_dir is not None else None
        self._hosts = dict(hosts or {})
        self._cluster_kwargs: dict[str, Any] = {
            "name": cluster_name, "nodes": nodes, "node_memory": node_memory, "node_disk": node_disk,
            "node_cpus": node_cpus, "oses": oses, "disk_templates": disk_templates,
            "max_running_jobs": max_running_jobs, "op_times": op_times, "archive_after": archive_after,
            "default_iallocator": default_iallocator, "opportunistic_retry": opportunistic_retry,
            "ipolicy": ipolicy,
        }  # fmt: skip
        self._app_kwargs: dict[str, Any] = {
            "max_clients": max_clients,
            "latency": latency,
            "wait_timeout": wait_timeout,
        }
        self.url = ""
        self.ca_file: str | None = None
        self.fingerprint: str | None = None
        self.queue_dir: Path | None = None
        self._cluster: FakeCluster | None = None
        self._rapi: RapiApp | None = None
        self._runner: web.AppRunner | None = None
        self._temp: Path | None = None
        self._ssl: ssl.SSLContext | None = None
        self._listener: Listener | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        if self._rapi is None or self._cluster is None:
            return "<FakeGaneti not started>"
        return (
            f"<FakeGaneti {self.url} Ganeti {self._version.software_version}, {len(self._cluster.nodes)} nodes, "
            f"{len(self._cluster.instances)} instances, "
            f"{len(self._cluster.jobs)} jobs, {self._rapi.active}/{self._rapi.max_clients} requests active>"
        )

    @property
    def cluster(self) -> FakeCluster:
        """The in-memory cluster (nodes, instances, jobs): inspect or change it directly."""
        if self._cluster is None:
            raise RuntimeError("FakeGaneti is not started; use 'async with FakeGaneti() as fake:'")
        return self._cluster

    @property
    def version(self) -> str:
        """The Ganeti version it answers as: ``"3.0"``, ``"3.1"`` or ``"2.16"`` (``FakeGaneti(version=)``)."""
        return self._version.name

    @property
    def rapi(self) -> RapiApp:
        if self._rapi is None:
            raise RuntimeError("FakeGaneti is not started; use 'async with FakeGaneti() as fake:'")
        return self._rapi

    # ------------------------------------------------------------------ knobs

    @property
    def latency(self) -> float | Callable[[], float]:
        return self.rapi.latency

    @latency.setter
    def latency(self, value: float | Callable[[], float]) -> None:
        self.rapi.latency = value

    @property
    def requests(self) -> int:
        """Requests answered or being answered so far."""
        return self.rapi.requests

    def inject_fault(
        self, kind: str, *, method: str | None = None, path: str | None = None, times: int | None = None,
        delay: float = 0.5,
    ) -> Fault:  # fmt: skip
        """Answer matching requests with a fault: ``502``, ``503``, ``504``, ``401``, ``reset``, ``hang``,
        ``slow_body`` (one byte every ``delay`` s) or ``malformed_json``; ``path`` is a glob
        (``/2/jobs/*/wait``); ``times`` bounds how often (default: until cleared)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}; choose from {', '.join(FAULT_KINDS)}")
        fault = Fault(kind=kind, method=method, path=path, times=times, delay=delay)
        self.rapi.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        self.rapi.faults.clear()

    def crash_node(self, name: str) -> None:
        """The node's machine dies hard (the lab's ``crash-node-multi.sh``): Ganeti still lists it
        online, reads no live figures from it (``null`` in ``/2/nodes?bulk=1``), reads its
        instances ``ERROR_nodedown`` (``ERROR_nodeoffline`` once it is marked offline through
        ``/2/nodes/NAME/modify`` or ``/role``), fails creates on it as Ganeti does and fails every
        create by an iallocator until it is marked offline (``IAllocator``: ``Can't get data for
        node``); each RPC to it waits :attr:`rpc_timeout` first. ``NotFoundError`` for an unknown
        node, ``ConflictError`` for the master (the fake's RAPI runs there)."""
        _node_faults.crash_node(self.cluster, name)

    def restore_node(self, name: str) -> None:
        """The crashed node is back (its daemons restarted): read again at once, its instances
        stopped; if it was marked offline meanwhile, it stays offline until marked online."""
        _node_faults.restore_node(self.cluster, name)

    @property
    def rpc_timeout(self) -> float:
        """Seconds an RPC to a crashed node takes to fail, and so every read of live data and
        every op that asks it (Ganeti's connect timeout is 5 s; default 0: at once)."""
        return self.cluster.rpc_timeout

    @rpc_timeout.setter
    def rpc_timeout(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"rpc_timeout must be >= 0 seconds, not {value}")
        self.cluster.rpc_timeout = value

    def slow_submit(
        self, answer_after: float, *, job_after: float | None = None, method: str | None = "POST",
        path: str | None = "/2/instances", times: int | None = None, queued_for: float = 0.0,
    ) -> SlowSubmit:  # fmt: skip
        """Make matching writes slow as a busy ganeti-rapi: the job reaches the queue (and
        ``/2/jobs``) ``job_after`` seconds after the request (default ``answer_after``) whether the
        client still waits or not, and the answer comes ``answer_after`` seconds after it (never
        before the job exists). Default: creates (``POST /2/instances``); ``method=None`` with
        ``path=None``: every POST, PUT and DELETE; ``path`` is a glob. ``times`` bounds how many
        requests it slows (default: until :meth:`clear_slow_submits`). ``queued_for``: seconds the
        job stays written and listed ("queued") before luxid's scheduler takes it (luxid writing it
        to a dead master candidate): a cancel meanwhile is "not found in queue", as Ganeti's is;
        the answer comes after it."""
        rule = SlowSubmit(
            answer_after=answer_after, job_after=answer_after if job_after is None else job_after,
            method=method, path=path, times=times, queued_for=queued_for,
        )  # fmt: skip
        self.rapi.slow.rules.append(rule)
        return rule

    def clear_slow_submits(self) -> None:
        """No more slow submits (those already held back still reach the queue)."""
        self.rapi.slow.rules.clear()

    def master_failover(self, node: str) -> None:
        """Make ``node`` the master, as ``gnt-cluster master-failover`` run there does (Ganeti's
        RAPI has no call for it); ``ConflictError`` if it is the master or not a candidate."""
        _ops_nodes.master_failover(self.cluster, node)

    async def kill_job(self, job_id: int) -> bool:
        """A running job's process dies with its master, as a new master's luxid then ends it
        ("detected death of job N": the 3-node lab, ``tests/fixtures/ganeti-3.0-masterfail``);
        False when the job is not running. See :meth:`FakeCluster.kill`."""
        return await self.cluster.kill(job_id)

    def archive_jobs(self) -> int:
        """Archive every ended job now (``gnt-job autoarchive 0``); returns how many."""
        return sum(self.cluster.archive(job_id) for job_id in list(self.cluster.jobs))

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        # A kept certificate first: a bad tls_dir fails before anything is made.
        kept = keep_certificate(self.tls_dir) if self.tls and self.tls_dir is not None else None
        # Job files go to tmpfs where there is one: a disk renames ~1,500 small files/s, which
        # at 100 submits/s (7 versions each) would stall the server's event loop.
        base = _SHM if _SHM_USABLE else None
        self._temp = Path(tempfile.mkdtemp(prefix="fake-ganeti-", dir=base))
        self.queue_dir = self._queue_arg or self._temp / "queue"
        queue = QueueDir(self.queue_dir, fsync=self.fsync)
        self._cluster = FakeCluster(queue=queue, **self._cluster_kwargs)
        self._cluster.model.version = self._version
        self._cluster.model.hosts.update(self._hosts)
        self._rapi = RapiApp(self._cluster, self.username, self.password, **self._app_kwargs)
        self._ssl = None
        if self.tls:
            cert, key, self.fingerprint = kept or write_certificate(self._temp)
            self.ca_file = str(cert)
            self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._ssl.load_cert_chain(cert, key)
        self._runner = web.AppRunner(
            self._rapi.application(), handle_signals=False, access_log=None, shutdown_timeout=0.5
        )
        await self._runner.setup()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, self.port))
            listener.listen(1024)
        except OSError:
            listener.close()
            await self._runner.cleanup()
            self._runner = None
            raise
        self._listener = Listener(listener)
        self.port = listener.getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"{'https' if self.tls else 'http'}://{host}:{self.port}"
        self._accepting = asyncio.get_running_loop().create_task(self._accept(), name="fake-ganeti-accept")

    async def _accept(self) -> None:
        """Accept a connection only while fewer than ``max_clients`` are open, as ganeti-rapi
        forks at most that many children: the others wait in the listen backlog. A connection
        holds its slot from accept to close, its TLS handshake included."""
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.rapi.max_clients)
        assert self._runner is not None and self._runner.server is not None and self._listener is not None
        factory = self._runner.server
        while True:
            await slots.acquire()
            try:
                connection = await self._listener.accept()
            except BaseException:
                slots.release()
                raise
            accepted = Accepted(connection)
            spawn_serving(
                self._serve(accepted, loop.time(), factory, slots.release), accepted, self._connections
            )

    async def _serve(self, accepted: Accepted, at: float, factory: Any, release: Callable[[], None]) -> None:
        """Serve one connection until it closes. The socket is the transport's once its protocol
        is made; before that, ``spawn_serving`` closes it when this task ends, however it ends."""
        closed = asyncio.Event()
        transport: asyncio.Transport | None = None
        try:

            def protocol() -> asyncio.Protocol:
                accepted.take()
                handler = factory()
                self.rapi.accepted_at[id(handler)] = at  # the latency counts from here

                def lost() -> None:
                    self.rapi.accepted_at.pop(id(handler), None)
                    closed.set()

                return _Tracked(handler, lost)

            loop = asyncio.get_running_loop()
            try:
                transport, _ = await loop.connect_accepted_socket(protocol, accepted.sock, ssl=self._ssl)
            except (OSError, ssl.SSLError):
                return  # a failed handshake: the transport has closed the socket
            await closed.wait()
        except asyncio.CancelledError:
            if transport is not None and not closed.is_set():
                transport.abort()  # stop(): the socket closes now, not after a TLS goodbye
            raise
        finally:
            accepted.close()
            release()

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._rapi is not None:
            await self._rapi.slow.aclose()
        if self._cluster is not None:
            await self._cluster.aclose()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None
