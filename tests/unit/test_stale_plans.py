"""Statements that find their rows by key keep doing so when a burst has outrun PostgreSQL's
statistics (store/db/_checked.py): their status is only checked on the rows found.

The store is analyzed while it holds only a past (every request ended, every instance DESTROYED),
then a burst adds requests and places them (pending requests, live instances the statistics do not
know of). The dispatcher's hot statements are run as it runs them, captured, and explained with
their own parameters: a batch of submit records, its check of live names, a batch of ends.
Without :func:`~synnefo_ganeti.store.db._checked.checked` PostgreSQL read every pending request, every
live instance and every submitted request for them (seen in ``benchmarks/burst.py``)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import Connection

from synnefo_ganeti.store import RequestStatus, Store
from synnefo_ganeti.store.db._many import execute_many
from synnefo_ganeti.store.requests._requests_batch import SubmittedArgs, submitted_many
from synnefo_ganeti.store.requests._settle import _ENDED
from tests.unit.test_requests_batch import INSTANCE, add

PAST = 300
BURST = 200


def indexes(plan: Any) -> set[str]:
    """The indexes a plan (EXPLAIN's JSON) reads, at any depth."""
    found: set[str] = set()
    if isinstance(plan, dict):
        if "Index Name" in plan:
            found.add(plan["Index Name"])
        for value in plan.values():
            found |= indexes(value)
    elif isinstance(plan, list):
        for value in plan:
            found |= indexes(value)
    return found


async def placed(store: Store, prefix: str, count: int) -> list[Any]:
    requests = [
        r for r, _ in await asyncio.gather(*(add(store, f"{prefix}{i}.example.com") for i in range(count)))
    ]
    await store.claim_requests("d1", count)
    return list(
        await asyncio.gather(
            *(store.place_request(r.id, "d1", "b1", dict(INSTANCE), unique_names="global") for r in requests)
        )
    )


async def test_the_hot_statements_find_their_rows_by_key_whatever_the_statistics(pg_url: str) -> None:
    async with Store(pg_url) as store:
        await placed(store, "past", PAST)

        def the_past_ends(conn: Connection) -> None:
            conn.execute(text("UPDATE requests SET status = 'succeeded', claimed_by = NULL"))
            conn.execute(text("UPDATE instances SET status = 'DESTROYED', task = NULL"))

        await store.call(the_past_ends)
        await store.call_read(lambda conn: conn.execute(text("ANALYZE")))
        burst = await placed(store, "new", BURST)

        engine = store._db.engine.sync_engine
        seen: list[tuple[str, Any]] = []

        def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_args: Any) -> None:
            seen.append((statement, parameters))

        event.listen(engine, "before_cursor_execute", capture)
        try:
            await store.call(
                lambda conn: submitted_many(
                    conn, [SubmittedArgs(r.id, 500 + i, True) for i, r in enumerate(burst[:3])]
                ),
                exclusive=False,
            )
            now = datetime.now(UTC)
            ends = [{"b_id": r.id, "b_status": "succeeded", "b_error": None, "b_now": now} for r in burst[:3]]
            await store.call(lambda conn: execute_many(conn, _ENDED, ends, key=("b_id",)))
        finally:
            event.remove(engine, "before_cursor_execute", capture)
        assert [(await store.get_request(r.id)).status for r in burst[:4]] == [  # type: ignore[union-attr]
            RequestStatus.SUCCEEDED, RequestStatus.SUCCEEDED, RequestStatus.SUCCEEDED, RequestStatus.PENDING,
        ]  # fmt: skip

        def plans(conn: Connection) -> dict[str, set[str]]:
            wanted = {
                "submit records": "UPDATE requests SET status=",
                "checks": "SELECT 'live' AS kind",  # the live names, the jobs' records and ends
                "ends": "UPDATE requests SET status=v.b_status",
            }
            out: dict[str, set[str]] = {}
            for what, start in wanted.items():
                statement, parameters = next((s, p) for s, p in seen if s.lstrip().startswith(start))
                explained = conn.exec_driver_sql(
                    f"EXPLAIN (FORMAT JSON) {statement}", parameters
                ).scalar_one()
                out[what] = indexes(json.loads(explained) if isinstance(explained, str) else explained)
            return out

        found = await store.call_read(plans)
    assert found["submit records"] == {"pk_requests"}, found
    assert found["ends"] == {"pk_requests"}, found
    assert found["checks"] == {"ix_instances_name"}, found
