"""A database with a past: the rows an established cloud's store holds before a burst.

A scratch database starts empty, and PostgreSQL plans a prepared statement for the table sizes it
sees at its first runs, then keeps that plan: an empty table's plan reads the whole table, however
large the burst makes it. A deployment in service has tables of every past request and instance,
and (with autovacuum, which this machine's PostgreSQL runs without) their statistics: its plans
use the indexes. ``seed`` writes such a past (requests ended, instances destroyed, on the
benchmark's own backend), each with the create job that made it (its ``jobs`` row, its
``job_events`` as a create's are stored, its ``instance_jobs`` row, applied), then ``ANALYZE``: what
autovacuum would have done long before.

The past jobs matter as much as the requests: with ``jobs`` empty when a dispatcher's connection
first checks a job event's foreign key, PostgreSQL plans that check (kept for the connection's
life) as a read of the whole ``jobs`` table, and every event of the burst then reads the table the
burst is filling (measured: 11 ms of PostgreSQL's CPU for a batch of ~240 events, 0.5 ms a
request, against 1.4 ms a batch with the index). The past jobs' ids are 1..count on the
benchmark's backend: the fake's job ids go on after them (``queue_serial``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import DateTime, bindparam, insert, select, text

CHUNK = 5000
#: a past create's events, as the dispatcher stores a create's (kind, status, op index, log line)
_EVENTS = [
    ("op_status", "queued", 0, None), ("job_status", "queued", None, None),
    ("op_status", "running", 0, None), ("job_status", "running", None, None),
    ("log", "running", 0, "* creating instance disks..."),
    ("log", "running", 0, "adding instance {name} to cluster config"),
    ("log", "running", 0, "adding disks to cluster config"),
    ("log", "running", 0, "* starting instance..."),
    ("op_status", "success", 0, None), ("job_status", "success", None, None),
]  # fmt: skip
_EVENT_COLUMNS = (
    "backend_id", "job_id", "seq", "kind", "status", "op_index", "op_id", "instance", "log_serial",
    "log_message", "event_time", "stored_at",
)  # fmt: skip


def queue_serial(count: int) -> int:
    """The last job id of the past ``seed(..., count)`` writes: the fake's queue starts after it."""
    return max(0, count)


async def seed(store: object, backend: str, count: int) -> None:
    """``count`` past requests (succeeded) and their instances (DESTROYED) on ``backend``."""
    if count <= 0:
        return
    from synnefo_ganeti.store.backends._backends import backends_t
    from synnefo_ganeti.store.db._copy import insert_rows
    from synnefo_ganeti.store.instances._instances import instances_t
    from synnefo_ganeti.store.jobs._jobs import jobs_t
    from synnefo_ganeti.store.jobs._rows import JobEventRow
    from synnefo_ganeti.store.requests._requests import requests_t

    events_t = JobEventRow.__table__

    await store.ensure_backend(backend)  # type: ignore[attr-defined]
    engine = store.engine  # type: ignore[attr-defined]
    when = datetime.now(UTC) - timedelta(days=30)
    async with engine.begin() as conn:
        backend_id = (
            await conn.execute(select(backends_t.c.id).where(backends_t.c.name == backend))
        ).scalar_one()
        for start in range(0, count, CHUNK):
            requests, instances = [], []
            for number in range(start, min(count, start + CHUNK)):
                name, request_id, instance_id = (
                    f"past-{number:06d}.fake.test",
                    str(uuid.uuid4()),
                    str(uuid.uuid4()),
                )
                requests.append({
                    "id": request_id, "status": "succeeded", "name": name, "spec": {"name": name},
                    "attempts": 1, "cancel_requested": False, "instance_uuid": instance_id,
                    "backend_id": backend_id, "job_id": number + 1, "created_at": when,
                    "updated_at": when, "submitted_at": when, "finished_at": when,
                })  # fmt: skip
                instances.append({
                    "uuid": instance_id, "backend_id": backend_id, "name": name, "status": "DESTROYED",
                    "owned": True, "request_id": request_id, "created_at": when, "updated_at": when,
                })  # fmt: skip
            await conn.execute(insert(requests_t), requests)
            await conn.execute(insert(instances_t), instances)
            jobs, events = [], []
            for number in range(start, min(count, start + CHUNK)):
                job_id, name = number + 1, f"past-{number:06d}.fake.test"
                jobs.append({
                    "backend_id": backend_id, "job_id": job_id, "status": "success", "instance": name,
                    "ops": [], "summary": {"job_id": job_id, "ops": [{"index": 0, "op_id": "OP_INSTANCE_CREATE",
                    "status": "success", "instance": name, "last_serial": 4, "error": None}]},
                    "received_at": when, "started_at": when, "ended_at": when, "archived": True,
                    "revision": 4, "event_count": len(_EVENTS), "first_seen_at": when, "updated_at": when,
                })  # fmt: skip
                serial = 0
                for seq, (kind, status, op_index, message) in enumerate(_EVENTS, 1):
                    serial += message is not None
                    events.append((
                        backend_id, job_id, seq, kind, status, op_index,
                        None if op_index is None else "OP_INSTANCE_CREATE", name,
                        serial if message is not None else None,
                        None if message is None else message.format(name=name), when, when,
                    ))  # fmt: skip
            await conn.execute(insert(jobs_t), jobs)
            await conn.run_sync(lambda sync, rows=events: insert_rows(sync, events_t, _EVENT_COLUMNS, rows))
            first = start + 1
            await conn.execute(
                text(
                    "INSERT INTO instance_jobs (backend_id, job_id, instance_id, action, start, recorded_at,"
                    " applied_at, result) SELECT i.backend_id, r.job_id, i.id, 'create', true, :when, :when,"
                    " 'success' FROM requests r JOIN instances i ON i.request_id = r.id"
                    " WHERE r.backend_id = :backend AND r.job_id BETWEEN :first AND :last"
                ).bindparams(
                    bindparam("when", type_=DateTime(timezone=True))
                ),  # (SQLite: the type's own form)
                {"when": when, "backend": backend_id, "first": first, "last": min(count, start + CHUNK)},
            )
    async with engine.begin() as conn:
        await conn.execute(text("ANALYZE"))
