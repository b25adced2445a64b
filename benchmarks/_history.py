"""A database with a past: the rows an established cloud's store holds before a burst.

A scratch database starts empty, and PostgreSQL plans a prepared statement for the table sizes it
sees at its first runs, then keeps that plan: an empty table's plan reads the whole table, however
large the burst makes it. A deployment in service has tables of every past request and instance,
and (with autovacuum, which this machine's PostgreSQL runs without) their statistics: its plans
use the indexes. ``seed`` writes such a past (requests ended, instances destroyed, on the
benchmark's own backend), then ``ANALYZE``: what autovacuum would have done long before.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, select, text

CHUNK = 5000


async def seed(store: object, backend: str, count: int) -> None:
    """``count`` past requests (succeeded) and their instances (DESTROYED) on ``backend``."""
    if count <= 0:
        return
    from synnefo_ganeti.store.backends._backends import backends_t
    from synnefo_ganeti.store.instances._instances import instances_t
    from synnefo_ganeti.store.requests._requests import requests_t

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
    async with engine.begin() as conn:
        await conn.execute(text("ANALYZE"))
