from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import structlog

from synnefo_ganeti import RapiClient
from synnefo_ganeti.testing._queue import QueueDir

IN_CI = bool(os.environ.get("CI"))
#: the event loop the async tests run on: "asyncio" (the default) or "uvloop", the daemon's own
#: (``synnefo_ganeti/daemon/_loop.py``); tox's py312-fast env runs the fast tests on uvloop
TEST_LOOP = os.environ.get("SYNNEFO_GANETI_TEST_LOOP", "asyncio")
if TEST_LOOP not in ("asyncio", "uvloop"):
    raise pytest.UsageError(f"SYNNEFO_GANETI_TEST_LOOP={TEST_LOOP!r}: use asyncio or uvloop")
if TEST_LOOP == "uvloop":

    def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, object]:
        """Every async test's event loop is uvloop's (pytest-asyncio's hook, 1.4 and later)."""
        import uvloop

        return {"uvloop": uvloop.new_event_loop}


@pytest.fixture
def queue(tmp_path: Path) -> Path:
    """An empty queue directory as Ganeti leaves it (``version``, ``lock``, ``archive/``)."""
    path = tmp_path / "queue"
    QueueDir(path)
    return path


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Every test starts with the logging the session had: a CLI command run in-process sets the
    ``synnefo_ganeti`` logger's level (``demo`` to ERROR) and installs its handler, and a later
    test of the same worker that expects WARNING records in ``caplog`` saw none."""
    root = logging.getLogger()
    ours = logging.getLogger("synnefo_ganeti")
    root_level, our_level = root.level, ours.level
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if getattr(h, "_synnefo_ganeti_handler", False)]:
            root.removeHandler(handler)  # only ours: pytest's own capture handlers stay its business
            handler.close()
        root.setLevel(root_level)
        ours.setLevel(our_level)
        structlog.reset_defaults()


@dataclass(frozen=True)
class Testbed:
    """A real Ganeti cluster of scripts/ganeti-testbed, as ``env`` describes it (its version asked of it)."""

    __test__ = False  # not a test class, wherever it is imported

    url: str
    username: str
    password: str
    ca_file: str
    node: str
    version: str = ""  # GET /2/info software_version: "3.0.2", "3.1.0~rc2"

    @property
    def series(self) -> str:
        """``3.0`` or ``3.1``: the ``--version`` of scripts/ganeti-testbed for this cluster."""
        return ".".join(self.version.split(".")[:2])

    @property
    def domain(self) -> str:
        """The testbed's DNS domain, its node's: ``ganeti.test`` (3.0), ``g31.test`` (3.1 in a chroot)."""
        return self.node.partition(".")[2]

    @property
    def cluster(self) -> str:
        """The cluster's name as scripts/ganeti-testbed makes it: ``cluster.<domain>``."""
        return f"cluster.{self.domain}"


def _testbed_problem(url: str, ca_file: str) -> str | None:
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            pass
    except OSError as exc:
        return f"no Ganeti RAPI at {url} ({exc}); run 'sudo scripts/ganeti-testbed up' first"
    if not os.access(ca_file, os.R_OK):
        return f"cannot read the cluster CA file {ca_file}; run the tests as root"
    return None


def env_testbed(default_ca: str = "/var/lib/ganeti/rapi.pem") -> Testbed:
    """The testbed the ``SYNNEFO_GANETI_TEST_*`` variables name (``eval "$(scripts/ganeti-testbed env)"``)."""
    return Testbed(
        url=os.environ.get("SYNNEFO_GANETI_TEST_RAPI_URL", "https://127.0.0.1:5080"),
        username=os.environ.get("SYNNEFO_GANETI_TEST_RAPI_USER", "ci"),
        password=os.environ.get("SYNNEFO_GANETI_TEST_RAPI_PASSWORD", "ci"),
        ca_file=os.environ.get("SYNNEFO_GANETI_TEST_RAPI_CA", default_ca),
        node=os.environ.get("SYNNEFO_GANETI_TEST_NODE", "node1.ganeti.test"),
    )


async def _software_version(bed: Testbed) -> str:
    async with RapiClient(bed.url, username=bed.username, password=bed.password, ca_file=bed.ca_file) as rapi:
        return (await rapi.info()).software_version or ""


def with_version(bed: Testbed) -> Testbed:
    """``bed`` with the version its cluster tells (``GET /2/info`` ``software_version``)."""
    return dataclasses.replace(bed, version=asyncio.run(_software_version(bed)))


@pytest.fixture(scope="session")
def testbed() -> Testbed:
    """The real Ganeti cluster of scripts/ganeti-testbed (any version); skipped without it, failed in CI."""
    bed = env_testbed()
    problem = _testbed_problem(bed.url, bed.ca_file)
    if problem is not None:
        if IN_CI:
            pytest.fail(f"CI must run the real-Ganeti tests: {problem}")
        pytest.skip(problem)
    return with_version(bed)


@pytest.fixture
def project_root() -> Path:
    return Path(__file__).parent.parent


# -- databases ---------------------------------------------------------------------------------------

PG_ADMIN_URL = os.environ.get("SYNNEFO_GANETI_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_admin(statement: str) -> None:
    import asyncio

    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(PG_ADMIN_URL, timeout=5)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


@pytest.fixture(scope="session")
def postgres_available() -> None:
    """PostgreSQL at SYNNEFO_GANETI_TEST_PG (default: 127.0.0.1:5432, user postgres, trust)."""
    try:
        _pg_admin("SELECT 1")
    except (OSError, Exception) as exc:
        problem = (
            f"no PostgreSQL at {PG_ADMIN_URL.split('@')[-1]} ({type(exc).__name__}: {exc}); start it with "
            "'pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start'"
        )
        if IN_CI:
            pytest.fail(f"CI must run the PostgreSQL tests: {problem}")
        pytest.skip(problem)


@pytest.fixture
def make_pg_url(postgres_available: None):
    """Makes fresh, empty PostgreSQL databases (dropped after the test); returns their URLs."""
    import uuid

    made: list[str] = []

    def make() -> str:
        name = f"sg_test_{uuid.uuid4().hex[:12]}"
        _pg_admin(f'CREATE DATABASE "{name}"')
        made.append(name)
        return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"

    yield make
    for name in made:
        _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of each kind: SQLite in a temporary file, and PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    make = request.getfixturevalue("make_pg_url")
    url: str = make()
    return url


@pytest.fixture
def pg_url(make_pg_url) -> str:
    """A fresh, empty PostgreSQL database, for tests specific to PostgreSQL (made outside the event loop);
    skipped with a reason where none runs, failed in CI."""
    url: str = make_pg_url()
    return url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite database in a temporary file, for tests that do not depend on the database."""
    return f"sqlite:///{tmp_path / 'store.db'}"
