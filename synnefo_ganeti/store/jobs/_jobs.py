"""Jobs: applying job-file versions in the writer's transaction, reading jobs back, pruning.

:func:`apply_versions` runs inside the writer's transaction: it reads what the
database holds of the batch's jobs, keeps each version that supersedes the stored one
(:meth:`synnefo_ganeti.jobs.JobSummary.supersedes`), stores the events between the
two, and writes the job rows and events with a few bulk statements built once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import orjson
from sqlalchemy import Row, Table, and_, bindparam, delete, exists, func, insert, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from synnefo_ganeti._serial import from_timestamp
from synnefo_ganeti.errors import InvalidError
from synnefo_ganeti.jobs import JobFile, JobStatus, JobSummary, job_events
from synnefo_ganeti.store.backends._backends import Backends, backends_t
from synnefo_ganeti.store.db._any import any_of
from synnefo_ganeti.store.db._commits import BatchResult
from synnefo_ganeti.store.db._copy import insert_rows
from synnefo_ganeti.store.db._engine import NOTIFY_CHANNEL, Database
from synnefo_ganeti.store.db._locks import job_key, jobs_key, lock_keys
from synnefo_ganeti.store.db._many import execute_many
from synnefo_ganeti.store.jobs._models import JobVersion, PruneResult, StoredJob, StoredOp
from synnefo_ganeti.store.jobs._rows import Job, JobEventRow

#: (connection, [(backend id, job id, final summary)], now): a batch's final jobs applied
OnFinal = Callable[[Connection, list[tuple[int, int, JobSummary]], datetime], object]

__all__ = ["Jobs", "OnFinal", "events_t", "jobs_query", "jobs_t", "read_jobs"]

log = logging.getLogger("synnefo_ganeti.store")

jobs_t = cast(Table, Job.__table__)
events_t = cast(Table, JobEventRow.__table__)

_FINAL = [status.value for status in JobStatus if status.is_final]


class Jobs:
    """The jobs repository: the writer's batches, and the readers of stored jobs."""

    def __init__(self, db: Database, backends: Backends, on_final: OnFinal) -> None:
        self.db = db
        self.backends = backends
        #: applies the ends of final jobs to what they ran against (the instances' concern,
        #: given by the facade: jobs know nothing of instances), in the writer's transaction
        self.on_final = on_final

    async def write_batch(self, batch: list[JobVersion]) -> BatchResult:
        """Apply ``batch`` in one write transaction (the writer's ``write_batch``)."""
        await self.backends.ensure_many((version.backend for version in batch), in_writer=True)
        apply = functools.partial(
            apply_versions,
            batch=batch,
            backends=self.backends,
            notify=self.db.dialect == "postgresql",
            on_final=self.on_final,
        )
        # the global lock shared: batches of other backends (another dispatcher's) go on beside
        # this one; apply_versions locks its backends' jobs (see lock_backends)
        return await self.db.run_transaction(apply, shared=True)

    async def list_jobs(
        self,
        *,
        backend: str | None = None,
        job_id: int | None = None,
        status: Iterable[JobStatus | str] | None = None,
        instance: str | None = None,
        limit: int | None = None,
    ) -> list[StoredJob]:
        async def run(conn: AsyncConnection) -> list[StoredJob]:
            query = jobs_query(backend=backend, job_id=job_id, status=status, instance=instance, limit=limit)
            return [_stored_job(row) for row in await conn.execute(query)]

        return await self.db.read(run)

    async def ended(self, backend: str, job_ids: Collection[int]) -> list[JobSummary]:
        """Of ``backend``'s jobs ``job_ids``, the summaries of those stored as final."""
        backend_id = await self.backends.id_of(backend)
        if backend_id is None or not job_ids:
            return []
        ids = list(job_ids)

        async def run(conn: AsyncConnection) -> list[JobSummary]:
            out: list[JobSummary] = []
            for start in range(0, len(ids), 500):
                params = {"b_backend_id": backend_id, "b_ids": ids[start : start + 500], "b_final": _FINAL}
                for row in await conn.execute(_ENDED_JOBS, params):
                    summary = row.summary
                    if isinstance(summary, str):  # (a driver that hands JSON back as text)
                        summary = orjson.loads(summary)
                    out.append(JobSummary.from_json(summary))
            return out

        return await self.db.read(run)

    async def archived_final_ids(self, backend: str) -> set[int]:
        async def run(conn: AsyncConnection) -> set[int]:
            query = (
                select(jobs_t.c.job_id)
                .join(backends_t, backends_t.c.id == jobs_t.c.backend_id)
                .where(backends_t.c.name == backend, jobs_t.c.archived, jobs_t.c.status.in_(_FINAL))
            )
            return {row.job_id for row in await conn.execute(query)}

        return await self.db.read(run)

    async def count(self, *, backend: str | None = None) -> int:
        async def run(conn: AsyncConnection) -> int:
            query = select(func.count()).select_from(jobs_t)
            if backend is not None:
                query = query.join(backends_t, backends_t.c.id == jobs_t.c.backend_id).where(
                    backends_t.c.name == backend
                )
            return int((await conn.execute(query)).scalar_one())

        return await self.db.read(run)

    async def prune(self, older_than: timedelta) -> PruneResult:
        if older_than < timedelta(0):
            raise InvalidError(f"older_than must not be negative (got {older_than}); give a duration to keep")
        cutoff = datetime.now(UTC) - older_than

        def run(conn: Connection) -> PruneResult:
            ended = and_(
                jobs_t.c.status.in_(_FINAL), jobs_t.c.ended_at < cutoff, jobs_t.c.updated_at < cutoff
            )
            job_count = len(conn.execute(select(jobs_t.c.backend_id, jobs_t.c.job_id).where(ended)).all())
            events_of_old = conn.execute(
                delete(events_t).where(
                    exists()
                    .where(jobs_t.c.backend_id == events_t.c.backend_id)
                    .where(jobs_t.c.job_id == events_t.c.job_id)
                    .where(jobs_t.c.status.in_(_FINAL), events_t.c.stored_at < cutoff)
                )
            ).rowcount
            conn.execute(delete(jobs_t).where(ended))
            return PruneResult(events=int(events_of_old or 0), jobs=job_count)

        # by the writer (in its thread on a SQLite file: a cancelled caller cannot leave the
        # write transaction open on a connection of the async engine, holding the write lock)
        return await self.backends.writer.call(run)


def jobs_query(
    *,
    backend: str | None = None,
    job_id: int | None = None,
    status: Iterable[JobStatus | str] | None = None,
    instance: str | None = None,
    limit: int | None = None,
) -> Any:
    """The select of :meth:`Jobs.list_jobs` (ordered by backend name and job id)."""
    query = (
        select(jobs_t, backends_t.c.name.label("backend"))
        .join(backends_t, backends_t.c.id == jobs_t.c.backend_id)
        .order_by(backends_t.c.name, jobs_t.c.job_id)
    )
    if backend is not None:
        query = query.where(backends_t.c.name == backend)
    if job_id is not None:
        query = query.where(jobs_t.c.job_id == job_id)
    if status is not None:
        query = query.where(jobs_t.c.status.in_([JobStatus(s).value for s in status]))
    if instance is not None:
        query = query.where(jobs_t.c.instance == instance)
    if limit is not None:
        query = query.limit(limit)
    return query


def read_jobs(conn: Connection, **filters: Any) -> list[StoredJob]:
    """:meth:`Jobs.list_jobs` on a synchronous connection (a read of a pinned snapshot)."""
    return [_stored_job(row) for row in conn.execute(jobs_query(**filters))]


def apply_versions(
    conn: Connection, *, batch: list[JobVersion], backends: Backends, notify: bool, on_final: OnFinal
) -> BatchResult:
    """Inside the writer's transaction: what the database holds of the batch's jobs, then
    the versions that supersede it and their events. Returns (applied, skipped, older, events)."""
    grouped: dict[int, dict[int, list[JobVersion]]] = {}
    for version in batch:
        per_job = grouped.setdefault(backends.ids[version.backend], {})
        per_job.setdefault(version.job.job_id, []).append(version)
    # the global lock is shared here (see Jobs.write_batch): two batches of one backend's jobs
    # (two dispatchers' watchers or followers) one at a time, each seeing what the other wrote;
    # and each job's own key, which a submit record takes too (store/requests/_requests_batch.py):
    # of a job's end and its record, the second to commit sees the first (one statement, sorted)
    lock_keys(
        conn,
        [jobs_key(backend_id) for backend_id in grouped]
        + [job_key(backend_id, job_id) for backend_id, jobs in grouped.items() for job_id in jobs],
    )

    now = datetime.now(UTC)
    inserts: list[dict[str, Any]] = []
    updates: list[dict[str, Any]] = []
    archive_only: list[dict[str, Any]] = []
    event_rows: list[tuple[Any, ...]] = []  # (in the order of _EVENT_COLUMNS)
    applied: list[tuple[str, JobSummary]] = []
    finals: list[tuple[int, int, JobSummary]] = []
    ended_before: list[tuple[str, JobSummary]] = []
    skipped = older = 0
    for backend_id, jobs in grouped.items():
        backend = backends.names[backend_id]
        stored: dict[int, Any] = {}
        ids = list(jobs)
        for start in range(0, len(ids), 500):
            rows = conn.execute(_STORED_JOBS, {"b_backend_id": backend_id, "b_ids": ids[start : start + 500]})
            stored.update((row.job_id, row) for row in rows)
        for job_id, versions in jobs.items():
            row = stored.get(job_id)
            summary = JobSummary.from_json(row.summary) if row is not None else None
            count = row.event_count if row is not None else 0
            was_archived = bool(row.archived) if row is not None else False
            archived = was_archived
            last: JobFile | None = None
            revisions = 0
            for version in versions:
                archived = archived or version.archived
                current = JobSummary.of(version.job)
                if not current.supersedes(summary):
                    skipped += 1
                    if summary is not None and current == summary and summary.status.is_final:
                        ended_before.append((backend, current))
                    if summary is not None and current != summary:
                        older += 1
                        log.debug("job %s/%s: an older version arrived late, ignored", backend, job_id)
                    continue
                for change in job_events(summary, version.job):
                    count += 1
                    event_rows.append(
                        (
                            backend_id,
                            job_id,
                            count,
                            change.kind.value,
                            change.status.value,
                            change.op_index,
                            change.op_id,
                            change.instance,
                            change.log_serial,
                            change.log_message,
                            from_timestamp(change.event_time),
                            now,
                        )
                    )
                summary = current
                last = version.job
                revisions += 1
                applied.append((backend, current))
            if last is not None and summary is not None:
                if summary.status.is_final:
                    finals.append((backend_id, job_id, summary))
                values = _job_values(summary, archived=archived, now=now)
                values["event_count"] = count
                if row is None:
                    values.update(backend_id=backend_id, job_id=job_id, revision=revisions, first_seen_at=now)
                    inserts.append(values)
                else:
                    values.update(b_backend_id=backend_id, b_job_id=job_id, revision=row.revision + revisions)
                    updates.append(values)
            elif archived and not was_archived and row is not None:
                archive_only.append({"b_backend_id": backend_id, "b_job_id": job_id, "archived": True})
    if inserts:
        execute_many(conn, _INSERT_JOB, inserts)
    if updates:
        execute_many(conn, _UPDATE_JOB, updates, key=("b_backend_id", "b_job_id"))
    if archive_only:
        execute_many(conn, _ARCHIVE_JOB, archive_only, key=("b_backend_id", "b_job_id"))
    if event_rows:
        insert_rows(conn, events_t, _EVENT_COLUMNS, event_rows)
        if notify:
            conn.execute(_NOTIFY, {"channel": NOTIFY_CHANNEL})
    if finals:
        # the instances these jobs were submitted for follow their end
        on_final(conn, finals, now)
    return applied, skipped, older, len(event_rows), ended_before


# The writer's statements, built once: built per transaction, their construction and
# cache keys cost as much as running them.
_STORED_JOBS = select(
    jobs_t.c.job_id, jobs_t.c.summary, jobs_t.c.revision, jobs_t.c.event_count, jobs_t.c.archived
).where(
    jobs_t.c.backend_id == bindparam("b_backend_id"),
    any_of(jobs_t.c.job_id, "b_ids"),
)
_ENDED_JOBS = select(jobs_t.c.summary).where(
    jobs_t.c.backend_id == bindparam("b_backend_id"),
    any_of(jobs_t.c.job_id, "b_ids"),
    any_of(jobs_t.c.status, "b_final"),
)
_INSERT_JOB = insert(jobs_t)
_EVENT_COLUMNS = (
    "backend_id", "job_id", "seq", "kind", "status", "op_index", "op_id", "instance", "log_serial",
    "log_message", "event_time", "stored_at",
)  # fmt: skip
_NOTIFY = text("SELECT pg_notify(:channel, '')")

_UPDATE_JOB = (
    update(jobs_t)
    .where(jobs_t.c.backend_id == bindparam("b_backend_id"), jobs_t.c.job_id == bindparam("b_job_id"))
    .values(
        status=bindparam("status"),
        instance=bindparam("instance"),
        ops=bindparam("ops"),
        summary=bindparam("summary"),
        received_at=bindparam("received_at"),
        started_at=bindparam("started_at"),
        ended_at=bindparam("ended_at"),
        archived=bindparam("archived"),
        revision=bindparam("revision"),
        event_count=bindparam("event_count"),
        updated_at=bindparam("updated_at"),
    )
)

_ARCHIVE_JOB = (
    update(jobs_t)
    .where(jobs_t.c.backend_id == bindparam("b_backend_id"), jobs_t.c.job_id == bindparam("b_job_id"))
    .values(archived=bindparam("archived"))
)


def _job_values(summary: JobSummary, *, archived: bool, now: datetime) -> dict[str, Any]:
    return {
        "status": summary.status.value,
        "instance": summary.instance,
        # the ops live in ``summary`` (they were written twice until issue 31: rows of older
        # versions still have them here; _stored_job reads either)
        "ops": [],
        # the dataclass itself: the engine's JSON serializer (orjson) writes it, faster than a dict
        "summary": summary,
        "received_at": from_timestamp(summary.received_time),
        "started_at": from_timestamp(summary.start_time),
        "ended_at": from_timestamp(summary.end_time),
        "archived": archived,
        "updated_at": now,
    }


def _stored_ops(row: Row[Any]) -> list[dict[str, Any]]:
    """The ops of a stored job: from its summary (or, rows written before issue 31, ``ops``)."""
    if row.ops:
        return list(row.ops)
    summary = row.summary
    if isinstance(summary, str):  # (a driver that hands JSON back as text)
        summary = orjson.loads(summary)
    return list((summary or {}).get("ops") or ())


def _stored_job(row: Row[Any]) -> StoredJob:
    return StoredJob(
        backend=row.backend,
        job_id=row.job_id,
        status=JobStatus(row.status),
        instance=row.instance,
        ops=tuple(
            StoredOp(
                index=op["index"],
                op_id=op["op_id"],
                status=JobStatus(op["status"]),
                instance=op.get("instance"),
                start_time=from_timestamp(op.get("start_time")),
                exec_time=from_timestamp(op.get("exec_time")),
                end_time=from_timestamp(op.get("end_time")),
                error=op.get("error"),
            )
            for op in _stored_ops(row)
        ),
        received_at=row.received_at,
        started_at=row.started_at,
        ended_at=row.ended_at,
        archived=bool(row.archived),
        revision=row.revision,
        event_count=row.event_count,
        first_seen_at=row.first_seen_at,
        updated_at=row.updated_at,
    )
