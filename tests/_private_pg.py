"""A private PostgreSQL instance that a test (or a benchmark) starts, restarts and stops itself.

The shared cluster at 127.0.0.1:5432 serves every other test running on the machine:
restarting it would break them. A fault test instead runs ``initdb`` into a temporary
folder and ``pg_ctl`` on a free port, with trust authentication, as the ``postgres``
user when run as root (PostgreSQL refuses to run as root). ``restart()`` is the same
fault as the issue's ``pg_ctlcluster --skip-systemctl-redirect <version> main restart``:
a fast shutdown (every connection closed by the server) and a new postmaster on the
same port and data.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["PrivatePostgres", "find_pg_bindir", "require_private_pg"]


def find_pg_bindir() -> Path | None:
    """``/usr/lib/postgresql/<version>/bin`` of the installed server (the version ``ls /etc/postgresql``
    gives, else the newest there), or None without the server binaries."""
    versions: list[str] = []
    if os.path.isdir("/etc/postgresql"):
        versions = sorted(
            os.listdir("/etc/postgresql"), key=lambda v: [int(p) for p in v.split(".") if p.isdigit()]
        )
    if not versions and os.path.isdir("/usr/lib/postgresql"):
        versions = sorted(os.listdir("/usr/lib/postgresql"))
    for version in reversed(versions):
        bindir = Path("/usr/lib/postgresql") / version / "bin"
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    return None


def require_private_pg() -> Path:
    """The server binaries' folder; the calling test is skipped without them (or without a
    ``postgres`` user to run them as, when root), and failed in CI."""
    import pytest

    bindir = find_pg_bindir()
    problem = None
    if bindir is None:
        problem = (
            "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql; install postgresql"
        )
    elif os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            problem = "running as root without a 'postgres' user to run a private PostgreSQL as"
    if problem is not None or bindir is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the PostgreSQL fault tests: {problem}")
        pytest.skip(problem or "")
    return bindir


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PrivatePostgres:
    """``with PrivatePostgres(bindir) as pg:`` a fresh cluster on 127.0.0.1:``pg.port``, trust auth."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = _free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="sg-private-pg-"))
        self.data = self.folder / "data"
        self.log_file = self.folder / "server.log"
        self._user: str | None = "postgres" if os.geteuid() == 0 else None

    def __repr__(self) -> str:
        return f"<PrivatePostgres 127.0.0.1:{self.port} {self.data}>"

    def url(self, database: str = "postgres", *, password: str | None = None) -> str:
        credentials = "postgres" if password is None else f"postgres:{password}"
        return f"postgresql://{credentials}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, timeout: float = 60.0) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=self.folder)
        if done.returncode != 0:
            log = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            raise RuntimeError(
                f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()}\n{log}"
            )

    def __enter__(self) -> PrivatePostgres:
        try:
            if self._user is not None:
                entry = pwd.getpwnam(self._user)
                os.chown(self.folder, entry.pw_uid, entry.pw_gid)
            self._run(
                "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"
            )
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.write(
                    f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.folder}'\n"
                    "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nshared_buffers = 32MB\n"
                    "max_connections = 50\n"
                )
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_file), "-w", "-t", "60", "start")

    def stop(self) -> None:
        """A fast shutdown: the server ends every session and exits."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def restart(self, *, down_for: float = 0.0) -> tuple[float, float]:
        """Stop (fast), stay down ``down_for`` seconds, start; returns (stopped_at, started_at), both
        ``time.time()`` (as log records' ``created``): when the stop and the start returned."""
        self.stop()
        stopped = time.time()
        if down_for:
            time.sleep(down_for)
        self.start()
        return stopped, time.time()
