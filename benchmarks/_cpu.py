"""The CPU time of the benchmarks' processes, read from ``/proc`` (Linux): a process's own, and a
local PostgreSQL server's, split into the backends of one database and the rest.

A process's CPU is ``utime + stime`` of ``/proc/PID/stat`` (every thread of it, not its
children), in clock ticks (``os.sysconf("SC_CLK_TCK")``, 100 a second on Linux: 10 ms
resolution). PostgreSQL's backends start and exit during a run, so ``PostgresCpu`` counts two ways:

* the whole server, exactly: the postmaster's ``cutime + cstime`` (its exited children, once
  reaped) plus every live child's ``utime + stime``, at the start and at the end;
* by process, polled every ``interval`` seconds from a thread: the backends of this benchmark's
  database (their title names it), the server's own processes (checkpointer, WAL writer,
  autovacuum, ...) and the backends of other databases (someone else's work on a shared server).
  A process that exits between two polls loses its last ``interval`` of CPU.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["TICK_S", "PostgresCpu", "PostgresSplit", "database_name", "locate_postmaster", "process_cpu_s"]

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
LOCAL_HOSTS = {"", "127.0.0.1", "localhost", "::1", "[::1]"}
SERVER_TITLES = re.compile(
    r"(?:^|: )(?:checkpointer|background writer|walwriter|autovacuum launcher|archiver|startup"
    r"|logical replication launcher|logical replication worker|stats collector|walsender"
    r"|walreceiver|parallel worker|autovacuum worker|walsummarizer)"
)


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command (``fields[0]`` is the state, field 3)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        text = stat.read().decode()
    return text[text.rindex(")") + 2 :].split()


def process_cpu_s(pid: int | str = "self") -> float:
    """Seconds of CPU (user + system, every thread) used by process ``pid`` so far."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime: fields 14 and 15


def _children_of(parent: int) -> dict[int, float]:
    """The live children of ``parent`` (a single-threaded process): pid -> CPU seconds so far."""
    try:  # the kernel's list (CONFIG_PROC_CHILDREN): no scan of /proc
        with open(f"/proc/{parent}/task/{parent}/children") as listed:
            candidates = listed.read().split()
    except OSError:
        candidates = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    children: dict[int, float] = {}
    for pid in candidates:
        try:
            fields = _stat_fields(pid)
            if int(fields[1]) == parent:
                children[int(pid)] = (int(fields[11]) + int(fields[12])) * TICK_S
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return children


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


async def locate_postmaster(db_url: str) -> tuple[int | None, str | None]:
    """The local postmaster serving ``db_url`` (the parent of this connection's backend), or
    ``(None, why not)``: a server elsewhere, not PostgreSQL, or no ``/proc``."""
    parts = urlsplit(db_url)
    if parts.scheme.startswith("sqlite"):
        return None, "sqlite: the database's work is in the API and dispatcher processes"
    if not parts.scheme.startswith("postgresql"):
        return None, f"not PostgreSQL ({parts.scheme or db_url})"
    if (parts.hostname or "") not in LOCAL_HOSTS:
        return None, f"the server ({parts.hostname}) is not on this machine: its /proc cannot be read"
    import asyncpg

    url = parts._replace(scheme="postgresql").geturl()
    conn = await asyncpg.connect(url, timeout=10)
    try:  # read while the connection (and so its backend) lives
        return _postmaster_of(int(await conn.fetchval("SELECT pg_backend_pid()")))
    finally:
        await conn.close()


def _postmaster_of(backend: int) -> tuple[int | None, str | None]:
    try:
        postmaster = int(_stat_fields(backend)[1])
        with open(f"/proc/{postmaster}/comm") as comm:
            name = comm.read().strip()
    except (OSError, ValueError, IndexError):
        return None, f"backend {backend} not found in /proc (a server in another container?)"
    if name not in {"postgres", "postmaster"}:
        return None, f"the backend's parent {postmaster} is {name!r}, not the postmaster"
    return postmaster, None


@dataclass
class PostgresSplit:
    """CPU seconds of a PostgreSQL server over a run."""

    whole_server_s: float  # exact, exited backends included
    database_s: float  # the backends of this benchmark's database (polled)
    server_processes_s: float  # checkpointer, WAL writer, autovacuum, ... (polled)
    other_databases_s: float  # other databases' backends: other work on a shared server (polled)
    sampler_s: float  # the polling thread's own CPU, in the process that sampled

    @property
    def ours_s(self) -> float:
        """What this benchmark made the server do: its backends and the server's own processes."""
        return self.database_s + self.server_processes_s


@dataclass
class PostgresCpu:
    """Samples a local server's CPU from ``start()`` to ``stop()`` (see the module's docstring)."""

    postmaster: int
    database: str
    interval: float = 0.2
    _first: dict[int, float] = field(default_factory=dict)
    _last: dict[int, float] = field(default_factory=dict)
    _kind: dict[int, str] = field(default_factory=dict)
    _whole_start: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _sampler_s: float = 0.0

    def _whole(self) -> tuple[float, dict[int, float]]:
        children = _children_of(self.postmaster)
        fields = _stat_fields(self.postmaster)
        reaped = (int(fields[13]) + int(fields[14])) * TICK_S  # cutime, cstime: fields 16 and 17
        return reaped + sum(children.values()), children

    def _classify(self, pid: int) -> str:
        title = _title(pid)
        if f" {self.database} " in f" {title} ":
            return "database"
        return "server" if SERVER_TITLES.search(title) else "other"

    def _poll(self, children: dict[int, float], *, first: bool = False) -> None:
        for pid, cpu in children.items():
            if pid not in self._kind:
                self._kind[pid] = self._classify(pid)
                self._first[pid] = cpu if first else 0.0  # born during the run: all of it counts
            self._last[pid] = cpu

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._poll(_children_of(self.postmaster))
        self._sampler_s = time.thread_time()

    def start(self) -> None:
        self._whole_start, children = self._whole()
        self._poll(children, first=True)
        self._thread = threading.Thread(target=self._loop, name="pg-cpu", daemon=True)
        self._thread.start()

    def stop(self) -> PostgresSplit:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        whole_end, children = self._whole()
        self._poll(children)
        by_kind = {"database": 0.0, "server": 0.0, "other": 0.0}
        for pid, kind in self._kind.items():
            by_kind[kind] += self._last[pid] - self._first[pid]
        return PostgresSplit(
            whole_server_s=whole_end - self._whole_start,
            database_s=by_kind["database"],
            server_processes_s=by_kind["server"],
            other_databases_s=by_kind["other"],
            sampler_s=self._sampler_s,
        )


def database_name(db_url: str) -> str:
    """The database a URL names (the backends' titles carry it)."""
    return urlsplit(db_url).path.lstrip("/")
