"""The dispatcher's hot writes, set-based (store/requests/_requests_batch.py): requests added, placed and
submitted many at once when the writer finds them queued together, with the same outcome for
each caller as one by one, the cases off the fast path (a repeated id, a name taken, a request
not held, a job whose end is stored already) included."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import event, select

from synnefo_ganeti.errors import ConflictError
from synnefo_ganeti.store import InstanceStatus, RequestNotHeldError, RequestStatus, Store
from synnefo_ganeti.store.instances._instances import instances_t
from synnefo_ganeti.store.requests import _requests_repo
from tests.unit.test_requests import CREATE_BAD_OS, CREATE_OK, canceled, job

INSTANCE: dict[str, Any] = {"os": "noop", "disk_template": "diskless", "tags": [], "nics": [], "disks": []}


def spec(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "os": "noop",
        "disk_template": "diskless",
        "beparams": {"memory": 128},
        "tags": ["a", "b"],
        "osparams": {"nested": [{"x": 1, "y": None}]},
    }


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many items each set-based step took (only steps of two items or more run)."""
    seen: Counter[str] = Counter()
    for name in ("add_many", "place_many", "submitted_many"):
        real = getattr(_requests_repo, name)

        def counting(conn: Any, items: list[Any], real: Any = real, name: str = name) -> Any:
            seen[name] += len(items)
            return real(conn, items)

        monkeypatch.setattr(_requests_repo, name, counting)
    return seen


async def add(store: Store, name: str, request_id: str | None = None) -> Any:
    return await store.add_request(
        spec(name), name=name, backend=None, request_id=request_id, unique_names="global"
    )


async def test_a_burst_is_added_placed_and_submitted_in_batches(db_url: str, batches: Counter[str]) -> None:
    async with Store(db_url) as store:
        names = [f"vm{i}.example.com" for i in range(40)]
        added = await asyncio.gather(*(add(store, name) for name in names))
        assert all(new for _, new in added)
        assert batches["add_many"] >= 2
        # the requests handed back are the rows written (built from the values, not read back)
        assert [request for request, _ in added] == [await store.get_request(r.id) for r, _ in added]
        claimed = await store.claim_requests("d1", 100)
        assert len(claimed) == 40
        placed = await asyncio.gather(
            *(store.place_request(r.id, "d1", "b1", dict(INSTANCE), unique_names="global") for r in claimed)
        )
        assert all(r.backend == "b1" and r.attempts == 1 and r.instance_id for r in placed)
        assert placed == [await store.get_request(r.id) for r in placed]  # as written, not read back
        assert len({r.instance_id for r in placed}) == 40
        # placed: the create is in progress (task build) before its job is sent
        building = await store.list_instances(backend="b1")
        assert {(i.status, i.task, i.task_job_id) for i in building} == {
            (InstanceStatus.BUILD, "build", None)
        }
        submitted = await asyncio.gather(
            *(store.submitted_request(r.id, 100 + i, start=True) for i, r in enumerate(claimed))
        )
        assert {r.status for r in submitted} == {RequestStatus.SUBMITTED}
        assert submitted == [await store.get_request(r.id) for r in submitted]
        assert sorted(r.job_id for r in submitted) == list(range(100, 140))
        for request in submitted:
            instance = await store.get_instance("b1", request.instance)
            assert instance is not None and instance.id == request.instance_id
            assert instance.status is InstanceStatus.BUILD
            assert instance.task == "build" and instance.task_job_id == request.job_id
        # most went through the set-based steps (the first of each burst may go alone)
        assert batches["add_many"] >= 20 and batches["place_many"] >= 20 and batches["submitted_many"] >= 20
        # and their ends are applied as one by one
        for i in range(40):
            await store.record("b1", job(CREATE_OK, job_id=100 + i))
        ended = [await store.get_request(r.id) for r in submitted]
        assert {r.status for r in ended if r is not None} == {RequestStatus.SUCCEEDED}
        instances = await store.list_instances(backend="b1")
        assert {i.name for i in instances} == set(names)
        assert {i.status for i in instances} == {InstanceStatus.STARTED}


async def test_a_batch_of_new_requests_is_one_insert_on_postgresql(
    pg_url: str, batches: Counter[str]
) -> None:
    """Not one execution a row (an ``executemany``: PostgreSQL binds, plans and runs each): the
    rows unnested into one statement (db/_many.py), the values the same."""
    inserts: list[tuple[str, bool]] = []

    def seen(_conn: Any, _cursor: Any, statement: str, _params: Any, _context: Any, many: bool) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO REQUESTS"):
            inserts.append((statement, many))

    async with Store(pg_url) as store:
        engine = store._db.engine.sync_engine
        event.listen(engine, "before_cursor_execute", seen)
        try:
            names = [f"one{i}.example.com" for i in range(20)]
            added = await asyncio.gather(*(add(store, name) for name in names))
        finally:
            event.remove(engine, "before_cursor_execute", seen)
        assert batches["add_many"] >= 1 and all(new for _, new in added)
        assert inserts and not any(many for _, many in inserts), inserts
        assert any("unnest" in statement for statement, _ in inserts)
        assert len(inserts) < len(names)  # (the first call may go alone; the rest together)
        stored = [await store.get_request(request.id) for request, _ in added]
        assert [request for request, _ in added] == stored
        assert sorted(r.instance for r in stored if r is not None) == sorted(names)


async def test_in_one_batch_a_repeat_or_a_clash_is_told_as_one_by_one(
    db_url: str, batches: Counter[str]
) -> None:
    async with Store(db_url) as store:
        results = await asyncio.gather(
            add(store, "a.example.com", "r-a"),
            add(store, "a.example.com", "r-a"),  # the same request again: the first one back
            add(store, "b.example.com"),
            add(store, "b.example.com"),  # another request for a name held: refused
            add(store, "c.example.com"),
            return_exceptions=True,
        )
        assert batches["add_many"] >= 2
        first, again, b1, b2, c = results
        assert not isinstance(first, BaseException) and not isinstance(again, BaseException)
        assert first[0].id == again[0].id == "r-a" and first[1] and not again[1]
        assert [isinstance(x, ConflictError) for x in (b1, b2)].count(True) == 1
        assert not isinstance(c, BaseException) and c[1]
        with pytest.raises(ConflictError, match="already exists with another"):
            await store.add_request(
                {**spec("a.example.com"), "os": "other"}, name="a.example.com", backend=None,
                request_id="r-a", unique_names="global",
            )  # fmt: skip


async def test_in_one_batch_a_request_not_held_or_a_name_taken_fails_alone(
    db_url: str, batches: Counter[str]
) -> None:
    async with Store(db_url) as store:
        ok = [(await add(store, f"ok{i}.example.com"))[0] for i in range(3)]
        other = (await add(store, "other.example.com"))[0]
        for request in await store.claim_requests("d1", 10):
            assert request.id in {r.id for r in [*ok, other]}
        # "other" is given back and taken by another dispatcher
        await store.release_requests("d1")
        assert {r.id for r in await store.claim_requests("d2", 1)} <= {r.id for r in [*ok, other]}
        held_by_d1 = {r.id for r in await store.claim_requests("d1", 10)}
        not_ours = next(r for r in [*ok, other] if r.id not in held_by_d1)
        results = await asyncio.gather(
            *(
                store.place_request(r.id, "d1", "b1", dict(INSTANCE), unique_names="global")
                for r in [*ok, other]
            ),
            return_exceptions=True,
        )
        assert batches["place_many"] >= 2
        for request, result in zip([*ok, other], results, strict=True):
            if request.id == not_ours.id:
                assert isinstance(result, RequestNotHeldError)
            else:
                assert not isinstance(result, BaseException) and result.backend == "b1"


async def test_a_name_back_to_life_and_a_job_ended_before_it_was_recorded(
    db_url: str, batches: Counter[str]
) -> None:
    """Off the fast path, in a batch: a name whose earlier life is DESTROYED gets a new row (the
    old stays); a create job whose end was stored before its submission is applied at once."""
    async with Store(db_url) as store:
        first = (await add(store, "again.example.com"))[0]
        await store.claim_requests("d1", 10)
        await store.place_request(first.id, "d1", "b1", dict(INSTANCE), unique_names="global")
        await store.submitted_request(first.id, 7, start=True)
        await store.record("b1", job(canceled(CREATE_OK), job_id=7))
        assert (await store.get_request(first.id)).status is RequestStatus.CANCELED  # type: ignore[union-attr]
        old = await store.get_instance("b1", "again.example.com")
        assert old is not None
        assert old.status is InstanceStatus.DESTROYED
        # a new request for the name, with two others, placed together
        new = [
            (await add(store, name))[0] for name in ("again.example.com", "x.example.com", "y.example.com")
        ]
        await store.claim_requests("d1", 10)
        placed = await asyncio.gather(
            *(store.place_request(r.id, "d1", "b1", dict(INSTANCE), unique_names="global") for r in new)
        )
        assert placed[0].instance_id != old.id
        # the job of "x" ends before the dispatcher records it
        await store.record("b1", job(CREATE_OK, job_id=21))
        submitted = await asyncio.gather(
            *(store.submitted_request(r.id, 20 + i, start=True) for i, r in enumerate(new))
        )
        assert [r.status for r in submitted] == [
            RequestStatus.SUBMITTED, RequestStatus.SUCCEEDED, RequestStatus.SUBMITTED,
        ]  # fmt: skip
        assert batches["submitted_many"] >= 2

        def lives(conn: Any) -> list[str]:
            query = select(instances_t.c.status).where(instances_t.c.name == "again.example.com")
            return sorted(conn.execute(query).scalars())

        assert await store.call_read(lives) == ["BUILD", "DESTROYED"]


async def test_a_failed_create_whose_end_was_stored_before_its_submission(db_url: str) -> None:
    """A create that fails at once can have its end stored (by the watcher, or by the dispatcher
    that reads the queue folder) before its submitter records the job: recording it then applies
    the end, which takes the BUILD row away; nothing raises, and the request goes back to be
    placed again (the OS is missing on that backend: another may have it)."""
    async with Store(db_url) as store:
        request = (await add(store, "quick.example.com"))[0]
        await store.claim_requests("d1", 10)
        await store.place_request(request.id, "d1", "b1", dict(INSTANCE), unique_names="global")
        await store.record("b1", job(CREATE_BAD_OS, job_id=31))
        await store.flush()
        recorded = await store.submitted_request(request.id, 31, start=True)
        assert recorded.status is RequestStatus.PENDING and recorded.job_id is None
        assert recorded.attempt_errors is not None
        assert "doesnotexist" in recorded.attempt_errors[-1]["error"]
        assert await store.get_instance("b1", "quick.example.com") is None  # its attempt made nothing


async def test_placed_alone_the_build_is_in_progress_and_a_refused_create_ends_it(db_url: str) -> None:
    """One by one (no batch), the same: task build from placement; a create Ganeti refused
    ends the request and leaves its instance ERROR with nothing in progress."""
    async with Store(db_url) as store:
        request = (await add(store, "alone.example.com"))[0]
        await store.claim_requests("d1", 10)
        placed = await store.place_request(request.id, "d1", "b1", dict(INSTANCE), unique_names="global")
        instance = await store.get_instance("b1", "alone.example.com")
        assert instance is not None and instance.id == placed.instance_id
        assert (instance.status, instance.task) == (InstanceStatus.BUILD, "build")
        await store.finish_request(
            request.id,
            RequestStatus.FAILED,
            error="refused",
            dispatcher="d1",
            instance_status=InstanceStatus.ERROR,
        )
        after = await store.get_instance("b1", "alone.example.com")
        assert after is not None and (after.status, after.task, after.task_job_id) == (
            InstanceStatus.ERROR,
            None,
            None,
        )


async def test_in_one_batch_names_taken_by_an_instance_a_request_or_a_rename_fail_alone(
    db_url: str, batches: Counter[str]
) -> None:
    """A batch of new requests reads what it checks in one statement (store/requests/_requests_batch.py
    ``_ADD_CHECKS``): a name an instance holds, an open request holds or a rename in progress takes,
    whatever its case, is refused to that request alone; the free names are added."""
    from datetime import UTC, datetime

    from sqlalchemy import Connection, insert

    from synnefo_ganeti.store.instances._instances import instance_jobs_t

    async with Store(db_url) as store:
        await add(store, "held.example.com")
        backend_id = await store.ensure_backend("b1")

        def seed(conn: Connection) -> None:
            now = datetime.now(UTC)
            for name, status in (("live.example.com", "STARTED"), ("gone.example.com", "DESTROYED")):
                conn.execute(
                    insert(instances_t).values(
                        backend_id=backend_id, name=name, status=status, created_at=now, updated_at=now
                    )
                )
            row = conn.execute(
                select(instances_t.c.id).where(instances_t.c.name == "live.example.com")
            ).scalar()
            conn.execute(
                insert(instance_jobs_t).values(
                    backend_id=backend_id,
                    job_id=77,
                    instance_id=row,
                    action="rename",
                    params={"new_name": "Renamed.example.com"},
                    recorded_at=now,
                )
            )

        await store._writer.call(seed)
        names = [
            "LIVE.example.com",
            "held.EXAMPLE.com",
            "renamed.example.com",
            "gone.example.com",
            "free.example.com",
        ]
        results = await asyncio.gather(*(add(store, name) for name in names), return_exceptions=True)
        assert batches["add_many"] >= 2  # (queued together: one step)
        live, held, renamed, gone, free = results
        assert isinstance(live, ConflictError) and "live.example.com" in str(live)
        assert isinstance(held, ConflictError)
        assert isinstance(renamed, ConflictError) and "rename in progress" in str(renamed)
        for ok in (gone, free):  # (a DESTROYED instance's name is free)
            assert not isinstance(ok, BaseException) and ok[1], ok


async def test_two_apis_adding_the_same_names_at_once_one_request_each_name(pg_url: str) -> None:
    """Two stores on one PostgreSQL database (two API processes), each a batch of the same five
    names at once, twenty rounds: one request a name, the other told it is taken. The batch locks
    its names in the checks' own function (migration 0020), and the checks read after the locks:
    a commit made while one waited is seen."""
    async with Store(pg_url) as first, Store(pg_url) as second:
        for round_ in range(20):
            names = [f"r{round_}-{i}.example.com" for i in range(5)]
            results = await asyncio.gather(
                *(add(store, name) for name in names for store in (first, second)), return_exceptions=True
            )
            for index, name in enumerate(names):
                pair = results[2 * index : 2 * index + 2]
                assert [isinstance(x, ConflictError) for x in pair].count(True) == 1, (name, pair)
                assert not [
                    x for x in pair if isinstance(x, BaseException) and not isinstance(x, ConflictError)
                ]
        open_requests = [r for r in await first.list_requests() if r.status is RequestStatus.PENDING]
        assert len(open_requests) == 100 == len({r.instance for r in open_requests})


async def test_the_checks_function_holds_the_batch_locks_until_the_transaction_ends(pg_url: str) -> None:
    import asyncpg

    async with Store(pg_url):  # the schema, by the migrations
        pass
    url = pg_url.replace("postgresql+asyncpg://", "postgresql://")
    holder, other = await asyncpg.connect(url), await asyncpg.connect(url)
    probe = "SELECT pg_try_advisory_xact_lock(hashtext(current_database()), hashtext($1))"
    try:
        async with holder.transaction():
            rows = await holder.fetch(
                "SELECT * FROM synnefo_ganeti_add_checks_locking($1::text[], $2::text[], $3::text[])",
                ["r-1"], ["a.example.com"], ["name:a.example.com", "request:r-1"],
            )  # fmt: skip
            assert rows == []
            async with other.transaction():
                assert await other.fetchval(probe, "name:a.example.com") is False
                assert await other.fetchval(probe, "request:r-1") is False
                assert await other.fetchval(probe, "name:b.example.com") is True
        async with other.transaction():  # the holder's transaction ended: its locks with it
            assert await other.fetchval(probe, "name:a.example.com") is True
    finally:
        await holder.close()
        await other.close()
