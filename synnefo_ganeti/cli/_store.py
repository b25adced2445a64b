"""``synnefo-ganeti db ...``, ``watch`` and ``jobs ...``: the database and the queue watcher."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.table import Table

from synnefo_ganeti.cli._main import _print_json, _run, _stdout, json_option, main, stderr
from synnefo_ganeti.daemon import StatusServer, SystemdNotifier
from synnefo_ganeti.errors import StoreError
from synnefo_ganeti.store import Store, StoredJob, display_url, head_revision, normalize_url, upgrade_database
from synnefo_ganeti.watch import QueueWatcher

T = TypeVar("T")

log = logging.getLogger("synnefo_ganeti.cli")

db_option = click.option(
    "--db",
    "db_url",
    envvar="SYNNEFO_GANETI_DB",
    required=True,
    metavar="URL",
    help="Database: sqlite:///PATH or postgresql://USER@HOST/DB (else $SYNNEFO_GANETI_DB).",
)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (or combined: ``1d12h``)."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([smhdw])", text.strip().lower())
    if not parts or re.sub(r"(\d+(?:\.\d+)?)\s*([smhdw])", "", text.strip().lower()).strip():
        raise click.BadParameter(f"{text!r} is not a duration; write it like 30d, 12h, 90m or 1w")
    return timedelta(seconds=sum(float(number) * _UNITS[unit] for number, unit in parts))


class _Duration(click.ParamType):  # type: ignore[type-arg]
    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(str(value))
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


def _human(span: timedelta) -> str:
    seconds = span.total_seconds()
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} seconds"


def _existing(url: str) -> str:
    """Refuse to read a SQLite file that does not exist (opening it would create an empty one)."""
    normalized = normalize_url(url)
    if normalized.drivername.startswith("sqlite") and normalized.database not in (None, "", ":memory:"):
        path = Path(normalized.database or "").expanduser()
        if not path.exists():
            raise StoreError(
                f"database file {path} does not exist; create it with 'synnefo-ganeti db upgrade --db {url}' "
                "or point --db at the watcher's database",
                url=display_url(url),
            )
    return url


def _with_store(url: str, call: Callable[[Store], Awaitable[T]], *, create: bool = False) -> T:
    async def run() -> T:
        async with Store(url if create else _existing(url), create=create) as store:
            return await call(store)

    return _run(run())


# ---------------------------------------------------------------------- db


@main.group()
def db() -> None:
    """Create, upgrade and prune the database."""


@db.command("upgrade")
@db_option
@json_option
def db_upgrade(db_url: str, as_json: bool) -> None:
    """Create the tables, or bring them to this version's schema (safe to run again)."""

    async def run() -> dict[str, Any]:
        database, before, after = await upgrade_database(db_url)
        return {"database": database, "from": before, "to": after, "head": head_revision()}

    result = _run(run())
    if as_json:
        _print_json(result)
    elif result["from"] == result["to"]:
        _stdout().print(f"{result['database']} is at the latest revision ({result['to']})", highlight=False)
    else:
        _stdout().print(
            f"{result['database']} upgraded from {result['from'] or 'empty'} to {result['to']}",
            highlight=False,
        )


@db.command("prune")
@db_option
@click.option(
    "--older-than",
    type=_Duration(),
    required=True,
    help="Age, like 30d, 12h or 2w: jobs that ended before then go, with their events.",
)
@json_option
def db_prune(db_url: str, older_than: timedelta, as_json: bool) -> None:
    """Delete the events and the jobs that ended longer ago than --older-than.

    Unfinished jobs, their events and anything younger stay.
    """
    result = _with_store(db_url, lambda store: store.prune(older_than))
    if as_json:
        _print_json(
            {"events": result.events, "jobs": result.jobs, "older_than_s": older_than.total_seconds()}
        )
    else:
        _stdout().print(
            f"deleted {result.events} events and {result.jobs} jobs that ended more than {_human(older_than)} ago",
            highlight=False,
        )


# ---------------------------------------------------------------------- watch


@main.command()
@click.option(
    "--queue-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/lib/ganeti/queue"),
    show_default=True,
    help="Ganeti's job-queue directory on this (master) node.",
)
@db_option
@click.option("--backend", required=True, help="Name of this Ganeti cluster in the database.")
@click.option(
    "--retry-interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between attempts when the queue directory is missing or unreadable.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    help="Serve /metrics, /healthz and /readyz on this port (0: any free one).",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address for --metrics-port.")
def watch(
    queue_dir: Path,
    db_url: str,
    backend: str,
    retry_interval: float,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Store every job-file change of Ganeti's queue as job events, until SIGINT/SIGTERM.

    Catches up at start (a full scan), rescans after an inotify overflow, skips bad
    files (logged once), and on SIGINT/SIGTERM stores what it has read and exits 0.
    Under systemd (Type=notify) it sends READY=1 once the first scan is queued,
    WATCHDOG=1 when asked for, and STOPPING=1 on the way out.
    """
    if not backend.strip():
        raise click.BadParameter("must not be empty", param_hint="--backend")

    async def run() -> tuple[Any, Any, float]:
        notifier = SystemdNotifier()
        async with contextlib.AsyncExitStack() as stack:
            store = await stack.enter_async_context(Store(db_url))
            watcher = QueueWatcher(queue_dir, store, backend, retry_interval=retry_interval)
            where = ""
            if metrics_port is not None:

                async def scanned() -> str | None:
                    return None if watcher.stats.scans else f"queue directory {queue_dir} not scanned yet"

                async def database() -> str | None:
                    await store.count_jobs(backend=backend)
                    return None

                server = await stack.enter_async_context(
                    StatusServer(
                        host=metrics_host, port=metrics_port, checks={"queue": scanned, "database": database}
                    )
                )
                where = f"; metrics on {server.url}/metrics"
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, watcher.stop)
            started = time.monotonic()
            stderr.print(
                f"watching {queue_dir} as backend {backend!r} into {store.display_url}{where} (Ctrl-C to stop)",
                highlight=False,
            )
            keepalive = asyncio.create_task(_tell_systemd(notifier, watcher, backend))
            try:
                await watcher.run()
            finally:
                keepalive.cancel()
                notifier.stopping()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
            await store.flush()
            return watcher.stats, store.stats, time.monotonic() - started

    watched, written, seconds = _run(run())
    stderr.print(
        f"stopped after {seconds:.1f} s: read {watched.versions} job-file versions "
        f"({watched.bad_files} bad files skipped, {watched.scans} scans), stored {written.applied} "
        f"changes as {written.events} events",
        highlight=False,
    )


async def _tell_systemd(notifier: SystemdNotifier, watcher: QueueWatcher, backend: str) -> None:
    """READY=1 once the first scan is queued, then WATCHDOG=1 as often as systemd asks."""
    if not notifier.enabled:
        return
    await watcher.ready.wait()
    notifier.ready(f"watching backend {backend}")
    interval = notifier.watchdog_interval()
    while interval:
        await asyncio.sleep(interval)
        notifier.watchdog()


# ---------------------------------------------------------------------- jobs


@main.group()
def jobs() -> None:
    """Jobs and job events as the watcher stored them."""


def _ops_text(job: StoredJob) -> str:
    return ", ".join(f"{op.op_id}:{op.status.value}" for op in job.ops)


def _when(job: StoredJob) -> str:
    moment = job.ended_at or job.started_at or job.received_at
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else ""


@jobs.command("list")
@db_option
@click.option("--backend", help="Only this backend's jobs.")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(["queued", "waiting", "canceling", "running", "canceled", "success", "error"]),
    help="Only jobs in this status (repeat for several).",
)
@click.option("--instance", help="Only jobs about this instance.")
@click.option("--limit", type=click.IntRange(min=1), help="At most N jobs (all of them by default).")
@json_option
def jobs_list(
    db_url: str,
    backend: str | None,
    statuses: tuple[str, ...],
    instance: str | None,
    limit: int | None,
    as_json: bool,
) -> None:
    """Stored jobs, ordered by backend and job id."""
    found = _with_store(
        db_url,
        lambda store: store.list_jobs(
            backend=backend, status=statuses or None, instance=instance, limit=limit
        ),
    )
    if as_json:
        _print_json([job.to_json() for job in found])
        return
    table = Table("backend", "job", "status", "ops", "instance", "when")
    for job in found:
        table.add_row(
            job.backend, str(job.job_id), job.status.value, _ops_text(job), job.instance or "", _when(job)
        )
    _stdout().print(table)
    if not found:
        stderr.print("no jobs stored" + (" matching the filters" if backend or statuses or instance else ""))


@jobs.command("show")
@click.argument("backend")
@click.argument("job_id", type=click.IntRange(min=0))
@db_option
@json_option
def jobs_show(backend: str, job_id: int, db_url: str, as_json: bool) -> None:
    """One stored job with its ops and events."""

    async def read(store: Store) -> tuple[StoredJob | None, list[Any]]:
        job = await store.get_job(backend, job_id)
        if job is None:
            return None, []
        return job, await store.list_events(backend=backend, job_id=job_id, limit=None)

    job, events = _with_store(db_url, read)
    if job is None:
        stderr.print(
            f"[bold red]error:[/] job {job_id} of backend {backend!r} is not in the database "
            "(is a watcher storing that backend's queue?)",
            highlight=False,
        )
        raise SystemExit(1)
    if as_json:
        _print_json({**job.to_json(), "events": [event.to_json() for event in events]})
        return
    out = _stdout()
    out.print(
        f"job {job.job_id} on {job.backend}: [bold]{job.status.value}[/]"
        + (f" (instance {job.instance})" if job.instance else "")
        + (" archived" if job.archived else ""),
        highlight=False,
    )
    ops = Table("#", "op", "status", "start", "end", "error")
    for op in job.ops:
        ops.add_row(
            str(op.index),
            op.op_id,
            op.status.value,
            op.start_time.strftime("%H:%M:%S.%f")[:-3] if op.start_time else "",
            op.end_time.strftime("%H:%M:%S.%f")[:-3] if op.end_time else "",
            op.error or "",
        )
    out.print(ops)
    table = Table("seq", "time", "kind", "op", "status", "log")
    for event in events:
        table.add_row(
            str(event.seq),
            event.event_time.strftime("%H:%M:%S.%f")[:-3] if event.event_time else "",
            event.kind.value,
            "" if event.op_index is None else f"{event.op_index}:{event.op_id}",
            event.status.value,
            "" if event.log_serial is None else f"{event.log_serial}: {event.log_message}",
        )
    out.print(table)


__all__ = ["db", "jobs", "parse_duration", "watch"]
