"""The writer's group commit: callers' writes queued together share one transaction, each in a
savepoint of its own, so that one that fails is rolled back alone and the others are kept; a
batch alone in its transaction runs without one, and falls back call by call if it fails."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from sqlalchemy import insert, select
from sqlalchemy.engine import Connection

from synnefo_ganeti.errors import ConflictError, InvalidError
from synnefo_ganeti.jobs import parse_job_file
from synnefo_ganeti.store import JobVersion, Store
from synnefo_ganeti.store.backends._backends import backend_events_t
from synnefo_ganeti.store.db import _writer
from tests._watch import lifecycle
from tests.helpers import eventually


async def test_calls_queued_together_commit_together_and_fail_alone(db_url: str) -> None:
    async with Store(db_url) as store:
        backend_id = await store.ensure_backend("b1")

        def add(message: str) -> int:
            def run(conn: Connection) -> int:
                conn.execute(
                    insert(backend_events_t).values(
                        backend_id=backend_id, kind="note", message=message, at=_now()
                    )
                )
                return len(message)

            return run

        def refuse(conn: Connection) -> None:
            add("written, then rolled back with its savepoint")(conn)
            raise InvalidError("this call's own refusal")

        def duplicate(conn: Connection) -> None:
            add("also rolled back")(conn)
            conn.execute(
                insert(backend_events_t).values(id=1, backend_id=backend_id, kind="x", message="", at=_now())
            )
            conn.execute(
                insert(backend_events_t).values(id=1, backend_id=backend_id, kind="x", message="", at=_now())
            )

        grouped = store.stats.grouped
        calls = [store.call(add(f"m{i}")) for i in range(20)]
        calls.insert(5, store.call(refuse))
        calls.insert(12, store.call(duplicate))
        outcomes = await asyncio.gather(*calls, return_exceptions=True)

        assert isinstance(outcomes[5], InvalidError)
        assert isinstance(outcomes[12], ConflictError)
        assert [o for i, o in enumerate(outcomes) if i not in (5, 12)] == [2] * 10 + [3] * 10
        assert store.stats.grouped > grouped  # (queued while the writer was busy: together)

        def messages(conn: Connection) -> list[str]:
            return list(
                conn.execute(select(backend_events_t.c.message).order_by(backend_events_t.c.id)).scalars()
            )

        assert await store.call_read(messages) == [f"m{i}" for i in range(20)]


async def test_a_group_whose_transaction_fails_is_retried_call_by_call(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Database trouble in the group's transaction: nothing of it is kept, each call is then
    retried on its own, and every caller gets its own result."""
    from sqlalchemy.exc import OperationalError

    async with Store(db_url) as store:
        database = store._db
        run_group = database.run_group
        left = [1]

        async def flaky(
            fns: Sequence[Any], *, exclusive: bool = True, shared: bool = False, savepoints: bool = False
        ) -> Any:
            if left[0]:
                left[0] -= 1
                raise OperationalError("SELECT 1", {}, Exception("connection lost (injected)"))
            return await run_group(fns, exclusive=exclusive, shared=shared, savepoints=savepoints)

        monkeypatch.setattr(database, "run_group", flaky)
        names = [f"b{i}" for i in range(10)]
        ids = await asyncio.gather(*(store.ensure_backend(name) for name in names))
        assert left == [0]  # the group's transaction did fail once
        assert len(set(ids)) == 10
        assert set(names) <= set(await store.backends())


def _now() -> datetime:
    return datetime.now(UTC)


async def test_batch_steps_run_without_savepoints_and_fall_back_to_them_then_call_by_call(
    db_url: str,
) -> None:
    """Batch steps run without a savepoint (two round trips fewer a step), beside calls of their
    own in savepoints. A step that fails (here: it writes, then raises) takes the transaction
    with it, and the calls run again with a savepoint around each step; a step that fails
    there too is rolled back alone and its calls run one by one. Nothing of a failed step is
    kept, and each caller gets its own result."""
    from sqlalchemy import event

    from synnefo_ganeti.store.db._batch import Batched

    async with Store(db_url) as store:
        backend_id = await store.ensure_backend("b1")
        steps: list[int] = []
        failing = [0]  # how many of the next steps fail
        savepoints: list[str] = []
        engines = [e for e in (store._db.engine.sync_engine, store._db.sync_engine) if e is not None]

        def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if statement.upper().startswith("SAVEPOINT"):
                savepoints.append(statement)

        for engine in engines:
            event.listen(engine, "before_cursor_execute", seen)

        def add(message: str) -> Any:
            def run(conn: Connection) -> str:
                conn.execute(
                    insert(backend_events_t).values(
                        backend_id=backend_id, kind="note", message=message, at=_now()
                    )
                )
                return f"alone {message}"

            return run

        def many(conn: Connection, messages: list[str]) -> list[Any]:
            steps.append(len(messages))
            add("the step's own write, rolled back with it")(conn)
            if failing[0]:
                failing[0] -= 1
                raise RuntimeError("the step fails (injected)")
            for message in messages:
                add(message)(conn)
            return [(True, f"batched {message}") for message in messages]

        def other(conn: Connection, messages: list[str]) -> list[Any]:
            for message in messages:
                add(message)(conn)
            return [(True, f"other {message}") for message in messages]

        def call(message: str, kind: Any = many) -> Any:
            return store._writer.call(add(message), batch=Batched(kind, message))

        def messages(conn: Connection) -> list[str]:
            return list(
                conn.execute(select(backend_events_t.c.message).order_by(backend_events_t.c.id)).scalars()
            )

        # two kinds and a call of its own, queued together: the steps have no savepoint
        outcomes = await asyncio.gather(
            *(call(f"a{i}") for i in range(3)),
            *(call(f"o{i}", other) for i in range(2)),
            store._writer.call(add("c")),
        )
        assert outcomes == [*(f"batched a{i}" for i in range(3)), "other o0", "other o1", "alone c"]
        assert len(savepoints) == 1, savepoints  # (the call of its own's)

        # a step that fails once: all again, the steps in savepoints; the second try succeeds
        failing[0], steps[:] = 1, []
        outcomes = await asyncio.gather(*(call(f"m{i}") for i in range(6)))
        assert len(steps) == 2 and steps[0] >= 2, steps  # (queued together: one step for all, twice)
        assert outcomes == [f"batched m{i}" for i in range(6)]

        # a step that fails in both tries: rolled back alone, and each call on its own
        failing[0], steps[:] = 2, []
        outcomes = await asyncio.gather(*(call(f"n{i}") for i in range(6)))
        assert len(steps) == 2, steps
        assert outcomes == [f"alone n{i}" for i in range(6)]
        for engine in engines:
            event.remove(engine, "before_cursor_execute", seen)
        written = await store.call_read(messages)
        own = "the step's own write, rolled back with it"
        assert written.count(own) == 2, written  # the steps that succeeded: the first two rounds'
        assert [m for m in written if m != own] == [
            *(f"a{i}" for i in range(3)),
            "o0",
            "o1",
            "c",
            *(f"m{i}" for i in range(6)),
            *(f"n{i}" for i in range(6)),
        ], written


async def test_calls_with_and_without_the_writers_lock_share_one_transaction(db_url: str) -> None:
    """Calls that take the writers' lock and calls that need none, queued together, commit in one
    transaction (the lock taken once, if one of them needs it), each with its own result."""
    from sqlalchemy import event

    async with Store(db_url) as store:
        backend_id = await store.ensure_backend("b1")
        commits: list[str] = []
        engines = [e for e in (store._db.engine.sync_engine, store._db.sync_engine) if e is not None]
        for engine in engines:
            event.listen(engine, "commit", lambda _conn: commits.append("commit"))

        def add(message: str) -> Any:
            def run(conn: Connection) -> str:
                conn.execute(
                    insert(backend_events_t).values(
                        backend_id=backend_id, kind="note", message=message, at=_now()
                    )
                )
                return message

            return run

        # all queued before the writer's task runs again (asyncio runs the tasks in the order
        # they were made, and the writer's wake-up comes after them): one round of the writer
        calls = [
            asyncio.ensure_future(store._writer.call(add(f"m{i}"), exclusive=i % 2 == 0)) for i in range(6)
        ]
        assert await asyncio.gather(*calls) == [f"m{i}" for i in range(6)]
        assert commits == ["commit"], commits

        def messages(conn: Connection) -> list[str]:
            return list(
                conn.execute(select(backend_events_t.c.message).order_by(backend_events_t.c.id)).scalars()
            )

        assert await store.call_read(messages) == [f"m{i}" for i in range(6)]


async def test_the_writer_lingers_for_more_callers_only_while_they_come_together(db_url: str) -> None:
    """Group commit (``Writer.linger``): a hot write (here new requests) waits a moment for
    others before its transaction once callers have come together, never for a caller alone."""

    def spec(name: str) -> dict[str, Any]:
        return {"name": name, "os": "noop", "disk_template": "diskless", "beparams": {"memory": 128}}

    async def add(name: str) -> None:
        await store.add_request(spec(name), name=name, backend=None, request_id=None, unique_names="global")

    async with Store(db_url) as store:
        for n in range(10):  # one at a time: no wait
            await add(f"alone{n}.example.com")
        assert store.stats.lingers == 0
        await asyncio.gather(*(add(f"first{n}.example.com") for n in range(10)))
        await asyncio.gather(*(add(f"second{n}.example.com") for n in range(10)))
        lingered = store.stats.lingers
        assert lingered >= 1  # the second wave, after a group of several
        for n in range(10):  # alone again: at most the first waits (its group follows several)
            await add(f"again{n}.example.com")
        assert store.stats.lingers <= lingered + 1
        assert len(await store.list_requests(limit=None)) == 40

        store._writer.linger = 0  # off: never
        before = store.stats.lingers
        await asyncio.gather(*(add(f"third{n}.example.com") for n in range(10)))
        await asyncio.gather(*(add(f"fourth{n}.example.com") for n in range(10)))
        assert store.stats.lingers == before


async def test_the_writer_lingers_again_while_callers_keep_coming_up_to_its_steps(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each wait that brought another caller is followed by another, ``LINGER_STEPS`` at most:
    one transaction for the callers of a busy moment however slowly each comes (several
    dispatchers share a burst: each one's callers come half as often)."""

    def spec(name: str) -> dict[str, Any]:
        return {"name": name, "os": "noop", "disk_template": "diskless", "beparams": {"memory": 128}}

    async def add(name: str) -> None:
        await store.add_request(spec(name), name=name, backend=None, request_id=None, unique_names="global")

    async with Store(db_url) as store:
        writer = store._writer
        await asyncio.gather(*(add(f"warm{n}.example.com") for n in range(6)))  # callers together
        late: list[asyncio.Task[None]] = []
        pauses: list[float] = []

        async def pause(seconds: float) -> None:  # a caller comes during each wait
            pauses.append(seconds)
            if len(pauses) > _writer.LINGER_STEPS:
                return
            queued = writer.pending
            late.append(asyncio.create_task(add(f"late{len(pauses)}.example.com")))
            await eventually(lambda: writer.pending > queued, what="the late caller queued")

        monkeypatch.setattr(_writer, "_pause", pause)
        grouped, groups = store.stats.grouped, store.stats.groups
        await asyncio.gather(*(add(f"wave{n}.example.com") for n in range(3)))
        await asyncio.gather(*late)
        # the steps, then one transaction for all (a second group would have waited again)
        assert pauses == [_writer.LINGER] * _writer.LINGER_STEPS
        assert store.stats.grouped - grouped == 3 + _writer.LINGER_STEPS
        assert store.stats.groups - groups == 1
        assert len(await store.list_requests(limit=None)) == 6 + 3 + _writer.LINGER_STEPS


def version(job_id: int) -> JobVersion:
    """A queued version of a one-op job (``tests/_watch.py``'s lifecycle)."""
    return JobVersion("versions", parse_job_file(orjson.dumps(lifecycle(job_id)[0])))


async def test_after_a_burst_of_versions_the_writer_waits_for_more_while_they_come(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of job versions after one of ``LINGER_VERSIONS`` or more waits ``LINGER`` for
    more, again while each wait brings some; after a small batch, none waits."""
    async with Store(db_url) as store:
        for job_id in range(1, _writer.LINGER_VERSIONS + 1):  # no yield between: one batch
            await store.put(version(job_id))
        await store.flush()
        batches = store.stats.batches
        later = [version(101), version(102)]
        pauses: list[float] = []

        async def pause(seconds: float) -> None:  # a version comes during each wait, while any
            pauses.append(seconds)
            if later:
                await store.put(later.pop(0))

        monkeypatch.setattr(_writer, "_pause", pause)
        await store.put(version(100))
        await store.flush()
        assert pauses == [_writer.LINGER] * 3  # two brought one each, the third none: written
        assert store.stats.batches == batches + 1
        assert len(await store.list_jobs(backend="versions")) == _writer.LINGER_VERSIONS + 3

        pauses.clear()  # the last batch was small (3): the next one does not wait
        await store.put(version(200))
        await store.flush()
        assert pauses == [] and store.stats.batches == batches + 2
