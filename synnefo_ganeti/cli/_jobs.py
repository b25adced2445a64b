"""``synnefo-ganeti jobs list|show``: jobs and job events as the watcher stored them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from synnefo_ganeti.cli._main import main
from synnefo_ganeti.cli._options import database_options, database_url, json_option, with_store
from synnefo_ganeti.cli._output import empty, fail, print_json, stdout, styled, when
from synnefo_ganeti.store import Store, StoredJob

__all__ = ["jobs"]

_JOB_STATUSES = ["queued", "waiting", "canceling", "running", "canceled", "success", "error"]
_TIME = "%H:%M:%S.%f"


@main.group()
def jobs() -> None:
    """Jobs and job events as the watcher stored them."""


def _ops_text(job: StoredJob) -> str:
    return ", ".join(f"{op.op_id}:{op.status.value}" for op in job.ops)


def _moment(job: StoredJob) -> str:
    return when(job.ended_at or job.started_at or job.received_at)


@jobs.command("list")
@database_options
@click.option("--backend", help="Only this backend's jobs.")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(_JOB_STATUSES),
    help="Only jobs in this status (repeat for several).",
)
@click.option("--instance", help="Only jobs about this instance.")
@click.option("--limit", type=click.IntRange(min=1), help="At most N jobs (all of them by default).")
@json_option
def jobs_list(
    config_file: Path | None,
    db_url: str | None,
    backend: str | None,
    statuses: tuple[str, ...],
    instance: str | None,
    limit: int | None,
    as_json: bool,
) -> None:
    """Stored jobs, ordered by backend and job id."""
    url = database_url(config_file, db_url)
    found = with_store(
        url,
        lambda store: store.list_jobs(
            backend=backend, status=statuses or None, instance=instance, limit=limit
        ),
    )
    if as_json:
        print_json([job.to_json() for job in found])
        return
    if not found:
        empty("no jobs stored" + (" matching the filters" if backend or statuses or instance else ""))
        return
    table = Table("backend", "job", "status", "ops", "instance", "when")
    for job in found:
        table.add_row(
            job.backend, str(job.job_id), job.status.value, _ops_text(job), job.instance or "", _moment(job)
        )
    stdout().print(table)


@jobs.command("show")
@click.argument("backend")
@click.argument("job_id", type=click.IntRange(min=0))
@database_options
@json_option
def jobs_show(backend: str, job_id: int, config_file: Path | None, db_url: str | None, as_json: bool) -> None:
    """One stored job with its ops and events."""
    url = database_url(config_file, db_url)

    async def read(store: Store) -> tuple[StoredJob | None, list[Any]]:
        job = await store.get_job(backend, job_id)
        if job is None:
            return None, []
        return job, await store.list_events(backend=backend, job_id=job_id, limit=None)

    job, events = with_store(url, read)
    if job is None:
        fail(
            f"job {job_id} of backend {backend!r} is not in the database "
            "(is a watcher storing that backend's queue?)",
            1,
        )
    if as_json:
        print_json({**job.to_json(), "events": [event.to_json() for event in events]})
        return
    out = stdout()
    out.print(
        styled(
            f"job {job.job_id} on {job.backend}: ",
            (job.status.value, "bold"),
            (f" (instance {job.instance})" if job.instance else "") + (" archived" if job.archived else ""),
        )
    )
    ops = Table("#", "op", "status", "start", "end", "error")
    for op in job.ops:
        ops.add_row(
            str(op.index),
            op.op_id,
            op.status.value,
            when(op.start_time, _TIME)[:-3],
            when(op.end_time, _TIME)[:-3],
            op.error or "",
        )
    out.print(ops)
    table = Table("seq", "time", "kind", "op", "status", "log")
    for event in events:
        table.add_row(
            str(event.seq),
            when(event.event_time, _TIME)[:-3],
            event.kind.value,
            "" if event.op_index is None else f"{event.op_index}:{event.op_id}",
            event.status.value,
            "" if event.log_serial is None else f"{event.log_serial}: {event.log_message}",
        )
    out.print(table)
