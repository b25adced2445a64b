"""The database under fault, and the secrets scan: the figures of docs/reliability.md.

    python benchmarks/db_faults.py                  # every case once
    python benchmarks/db_faults.py --creates 100    # a smaller PostgreSQL-restart run

Prints ONE JSON object:

* ``pg_restart``: ``--creates`` instance creates at ``--rate`` per second on a fake
  Ganeti, its queue stored by a QueueWatcher into a PostgreSQL database; ``--restart-after``
  seconds in, the server is stopped (fast shutdown) for ``--down-for`` seconds and
  started again. The server is a private instance this script starts itself
  (``initdb`` + ``pg_ctl`` from ``/usr/lib/postgresql/<version>/bin``, a free port): the
  same fault as ``pg_ctlcluster --skip-systemctl-redirect <version> main restart``,
  without disturbing the shared cluster. ``versions``/``jobs``: what the fake wrote;
  ``events_stored``: events the database holds; ``events_expected_min``: the fewest the
  jobs' final versions alone give (``..._max``: every version read one by one);
  ``lost``: jobs missing, at another status, short of events or of a log line;
  ``retries``: the writer's; ``outage_s``: the server down (stop returned .. start
  returned); ``recovered_after_s``: start returned .. the writer's "is back" line.
* ``sqlite_locked``: another process holds ``BEGIN EXCLUSIVE`` on the SQLite file;
  ``waited_s``: how long a store call waited (busy_timeout ``busy_timeout_s``) before
  its ``error``; ``held``: job versions queued meanwhile; ``lost``: those not stored
  once the lock was released.
* ``security``: a full run (dispatcher daemon, submit, requests/backends/jobs list,
  reconcile, a wrong RAPI password, a database that is down, the objects' reprs) with
  known secrets; ``lines_scanned`` and ``secrets_found`` (each secret as written,
  URL-encoded and as a Basic authorization header). Needs the shared PostgreSQL
  (``SYNNEFO_GANETI_BENCH_PG``, default 127.0.0.1:5432) for a scratch database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE.parent), str(ROOT)]

from tests._fault_runs import pg_restart_run, security_run, sqlite_locked_run  # noqa: E402
from tests._private_pg import PrivatePostgres, find_pg_bindir  # noqa: E402

from _databases import database  # noqa: E402  (benchmarks/, the script's folder)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    bindir = find_pg_bindir()
    if bindir is None:
        raise SystemExit("no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="db-faults-") as folder:
        base = Path(folder)
        (base / "pg").mkdir()
        (base / "sqlite").mkdir()
        (base / "security").mkdir()
        with PrivatePostgres(bindir) as pg:
            started = time.monotonic()
            restart = await pg_restart_run(
                pg, base / "pg", creates=args.creates, rate=args.rate,
                restart_after=args.restart_after, down_for=args.down_for,
            )  # fmt: skip
            out["pg_restart"] = restart.figures() | {
                "creates_per_s": args.rate,
                "run_s": round(time.monotonic() - started, 2),
            }
            if restart.problems:
                out["pg_restart"]["problems"] = restart.problems[:20]
        locked = await sqlite_locked_run(base / "sqlite", busy_timeout=args.busy_timeout)
        out["sqlite_locked"] = locked.figures()
        async with database("postgresql", folder) as url:
            security = await security_run(base / "security", url)
        out["security"] = security.figures()
        if security.found:
            out["security"]["where"] = [text[:300] for _, text in security.found[:10]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--creates", type=int, default=200, help="instance creates in the restart run")
    parser.add_argument("--rate", type=float, default=50.0, help="creates per second")
    parser.add_argument("--restart-after", type=float, default=1.5, help="seconds into the run")
    parser.add_argument("--down-for", type=float, default=1.0, help="seconds the server stays down")
    parser.add_argument("--busy-timeout", type=float, default=0.5, help="the SQLite store's busy_timeout")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
