"""The migrations in alembic/ and the model in synnefo_ganeti.store.db._schema agree, on both databases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Connection, MetaData, String, event, inspect
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from synnefo_ganeti.store import Store, current_revision, head_revision, normalize_url, upgrade
from synnefo_ganeti.store.db._migrate import alembic_config
from synnefo_ganeti.store.db._schema import metadata

# SQLite's reflection cannot read an index of an expression (migrations 0012 and 0017: lower(name)): it
# says so, and the comparison leaves that index out there (PostgreSQL compares it)
pytestmark = pytest.mark.filterwarnings(
    "ignore:Skipped unsupported reflection of expression-based index ix_(instances|requests)_name_lower",
    "ignore:autogenerate skipping metadata-specified expression-based index 'ix_(instances|requests)_name_lower'",
)

TABLES = {
    "backends",
    "backend_events",
    "backend_nodes",
    "backend_stats",
    "instances",
    "instance_jobs",
    "jobs",
    "job_events",
    "requests",
    "changes",
    "feed_cursors",
    "networks",
    "network_backends",
    "dispatchers",
    "audit_log",
    "incidents",
    "maintenance_runs",
}


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(normalize_url(db_url))
    try:
        yield engine
    finally:
        await engine.dispose()


def _diff(connection: Connection, target: MetaData = metadata) -> list[Any]:
    return list(compare_metadata(MigrationContext.configure(connection), target))


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


def _command(connection: Connection, name: str, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    getattr(command, name)(config, revision)


async def _run(engine: AsyncEngine, fn: Any, *args: Any) -> Any:
    async with engine.begin() as connection:
        return await connection.run_sync(fn, *args)


async def test_upgrade_creates_exactly_the_model(engine: AsyncEngine) -> None:
    assert await current_revision(engine) is None
    await upgrade(engine)
    assert await current_revision(engine) == head_revision()
    assert await _run(engine, _tables) == TABLES | {"alembic_version"}
    assert await _run(engine, _diff) == []


async def test_downgrade_to_base_and_upgrade_again(engine: AsyncEngine) -> None:
    await upgrade(engine)
    await _run(engine, _command, "downgrade", "base")
    assert await current_revision(engine) is None
    assert await _run(engine, _tables) & TABLES == set()

    await _run(engine, _command, "upgrade", "head")
    assert await current_revision(engine) == head_revision()
    assert await _run(engine, _tables) >= TABLES
    assert await _run(engine, _diff) == []


async def test_a_database_upgraded_by_hand_opens_without_create(db_url: str, engine: AsyncEngine) -> None:
    await upgrade(engine)
    async with Store(db_url, create=False) as store:
        assert await store.list_jobs() == []
        assert await current_revision(store.engine) == head_revision()


async def test_store_creates_the_head_revision_in_an_empty_database(db_url: str, engine: AsyncEngine) -> None:
    async with Store(db_url):
        pass
    assert await current_revision(engine) == head_revision()
    assert await _run(engine, _diff) == []


async def test_the_comparison_sees_a_model_change(engine: AsyncEngine) -> None:
    """The check above is not vacuous: a column the migrations lack shows up as a difference."""
    await upgrade(engine)
    changed = MetaData(naming_convention=metadata.naming_convention)
    for table in metadata.sorted_tables:
        table.to_metadata(changed)
    changed.tables["jobs"].append_column(Column("color", String(8), nullable=True))
    diff = await _run(engine, _diff, changed)
    assert [(d[0], d[3].name) for d in diff] == [("add_column", "color")]


async def test_0002_keeps_the_rows_of_0001(db_url: str, engine: AsyncEngine) -> None:
    """Upgrading a database with instances and jobs in it: rows stay, new columns get defaults."""
    from sqlalchemy import text

    await _run(engine, _command, "upgrade", "0001")

    def fill(connection: Connection) -> None:
        connection.execute(
            text("INSERT INTO backends (id, name, created_at) VALUES (1, 'b1', CURRENT_TIMESTAMP)")
        )
        connection.execute(
            text(
                "INSERT INTO instances (id, backend_id, name, status, created_at, updated_at) "
                "VALUES (1, 1, 'vm1', 'STARTED', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )
        )

    await _run(engine, fill)
    await _run(engine, _command, "upgrade", "head")

    def read(connection: Connection) -> list[Any]:
        return list(connection.execute(text("SELECT name, status, owned, beparams FROM instances")).all())

    (row,) = await _run(engine, read)
    assert (row.name, row.status, bool(row.owned), row.beparams) == ("vm1", "STARTED", True, None)
    async with Store(db_url, create=False) as store:
        (instance,) = await store.list_instances()
        assert instance.name == "vm1" and instance.owned and instance.backend == "b1"


async def test_0005_gives_each_instance_a_uuid_and_its_triggers_feed_the_changes(
    db_url: str, engine: AsyncEngine
) -> None:
    """Rows of 0004 get a UUID each; from then on, the triggers write a change for each insert
    and each change of status/error (requests) or status/task/last error (instances), and
    none for an update that changes none of those."""
    from sqlalchemy import text

    await _run(engine, _command, "upgrade", "0004")

    def fill(connection: Connection) -> None:
        connection.execute(
            text("INSERT INTO backends (id, name, created_at) VALUES (1, 'b1', CURRENT_TIMESTAMP)")
        )
        for row_id in (1, 2):
            connection.execute(
                text(
                    "INSERT INTO instances (id, backend_id, name, status, owned, created_at, updated_at) "
                    f"VALUES ({row_id}, 1, 'vm{row_id}', 'STARTED', true, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )

    await _run(engine, fill)
    await _run(engine, _command, "upgrade", "head")

    def changes(connection: Connection) -> list[tuple[Any, ...]]:
        rows = connection.execute(text("SELECT kind, key, status, task, error FROM changes ORDER BY id"))
        return [tuple(row) for row in rows]

    assert await _run(engine, changes) == []  # the upgrade itself is no change
    async with Store(db_url, create=False) as store:
        first, second = sorted(await store.list_instances(), key=lambda i: i.name)
        uuids = {str(first.id), str(second.id)}
        assert len(uuids) == 2 and all(len(u) == 36 for u in uuids)

    def act(connection: Connection) -> str:
        uuid = connection.execute(text("SELECT uuid FROM instances WHERE id = 1")).scalar_one()
        connection.execute(text("UPDATE instances SET task = 'stop' WHERE id = 1"))
        connection.execute(text("UPDATE instances SET tags = NULL WHERE id = 1"))  # no change
        connection.execute(
            text("UPDATE instances SET status = 'STOPPED', task = NULL, last_error = :e WHERE id = 1"),
            {"e": '{"action": "stop", "message": "it failed"}'},
        )
        return str(uuid)

    uuid = await _run(engine, act)
    assert await _run(engine, changes) == [
        ("instance", uuid, "STARTED", "stop", None),
        ("instance", uuid, "STOPPED", None, "it failed"),
    ]


@pytest.mark.timeout(60)
async def test_stores_opened_together_on_a_fresh_database_create_the_schema_once(db_url: str) -> None:
    """A dispatcher and a CLI command started together on a new database: both open, one schema."""
    import asyncio

    stores = [Store(db_url) for _ in range(3)]
    try:
        await asyncio.gather(*(store.open() for store in stores))
        for store in stores:
            assert await current_revision(store.engine) == head_revision()
        await stores[0].add_request({"name": "x"}, name="x")
        assert len(await stores[2].list_requests()) == 1
    finally:
        for store in stores:
            await store.close()


async def test_0005_downgrade_keeps_one_row_per_name(db_url: str, engine: AsyncEngine) -> None:
    """At head a name has one live row and any number of DESTROYED ones; going back to 0004
    (one row per backend and name) keeps the live row, else the newest."""
    from sqlalchemy import text

    async with Store(db_url) as store:
        for name in ("vm1", "vm2"):
            for _ in range(2):
                await store.add_instance("b1", name)
                await store.update_instance("b1", name, status="DESTROYED")
        live = await store.add_instance("b1", "vm1")
        newest = (await store.list_instances(name="vm2"))[0]
        assert len(await store.list_instances()) == 5 and newest.status == "DESTROYED"

    def row_ids(connection: Connection) -> list[int]:
        query = text("SELECT id FROM instances WHERE uuid IN (:a, :b) ORDER BY name")
        return [int(row.id) for row in connection.execute(query, {"a": live.id, "b": newest.id})]

    expected = await _run(engine, row_ids)
    await _run(engine, _command, "downgrade", "0004")

    def rows(connection: Connection) -> list[tuple[Any, ...]]:
        query = text("SELECT id, name, status FROM instances ORDER BY name")
        return [tuple(row) for row in connection.execute(query)]

    assert await _run(engine, rows) == [
        (expected[0], "vm1", "BUILD"),
        (expected[1], "vm2", "DESTROYED"),
    ]


async def test_0007_indexes_only_the_jobs_whose_end_is_not_applied(db_url: str, engine: AsyncEngine) -> None:
    """The followers of recorded jobs ask for ``applied_at IS NULL``: a partial index answers it
    (SQLite's plan searches it rather than scanning the table); 0006 has no such index."""
    from sqlalchemy import text

    await upgrade(engine)

    def indexes(connection: Connection) -> dict[str, Any]:
        return {ix["name"]: ix for ix in inspect(connection).get_indexes("instance_jobs")}

    found = (await _run(engine, indexes))["ix_instance_jobs_unapplied"]
    assert found["column_names"] == ["backend_id", "job_id"]
    if engine.dialect.name == "sqlite":

        def plan(connection: Connection) -> str:
            query = "EXPLAIN QUERY PLAN SELECT job_id FROM instance_jobs WHERE backend_id = 1 AND applied_at IS NULL"
            return " ".join(str(row[-1]) for row in connection.execute(text(query)))

        used = await _run(engine, plan)
        assert "SEARCH instance_jobs USING" in used and "ix_instance_jobs_unapplied" in used, used
    else:

        def definition(connection: Connection) -> str:
            query = "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_instance_jobs_unapplied'"
            return str(connection.execute(text(query)).scalar_one())

        assert "WHERE (applied_at IS NULL)" in await _run(engine, definition)
    await _run(engine, _command, "downgrade", "0006")
    assert "ix_instance_jobs_unapplied" not in await _run(engine, indexes)


async def test_0008_indexes_the_renames_in_progress(db_url: str, engine: AsyncEngine) -> None:
    """Every name check asks for the renames in progress (``store/requests/_names.py``'s ``renaming_to``):
    a partial index of the unapplied ``rename`` jobs answers it; SQLite's plan for that very query
    uses it (its condition spelled as the index's); 0007 has no such index."""
    from sqlalchemy import text

    from synnefo_ganeti.store.requests._names import renaming_to

    await upgrade(engine)

    def indexes(connection: Connection) -> dict[str, Any]:
        return {ix["name"]: ix for ix in inspect(connection).get_indexes("instance_jobs")}

    found = (await _run(engine, indexes))["ix_instance_jobs_renaming"]
    assert found["column_names"] == ["backend_id", "job_id"]
    assert await _run(engine, renaming_to) == {}
    if engine.dialect.name == "sqlite":
        seen: list[str] = []

        def plan(connection: Connection) -> str:
            def capture(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
                if "instance_jobs" in statement and not statement.startswith("EXPLAIN"):
                    seen.append(statement)

            event.listen(connection, "before_cursor_execute", capture)
            try:
                renaming_to(connection, {"vm1"})
            finally:
                event.remove(connection, "before_cursor_execute", capture)
            return " ".join(
                str(row[-1]) for row in connection.execute(text("EXPLAIN QUERY PLAN " + seen[-1]))
            )

        used = await _run(engine, plan)
        assert "ix_instance_jobs_renaming" in used, used
    else:

        def definition(connection: Connection) -> str:
            query = "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_instance_jobs_renaming'"
            return str(connection.execute(text(query)).scalar_one())

        assert "WHERE ((applied_at IS NULL) AND ((action)::text = 'rename'::text))" in await _run(
            engine, definition
        )
    await _run(engine, _command, "downgrade", "0007")
    assert "ix_instance_jobs_renaming" not in await _run(engine, indexes)


def _instance_plans(connection: Connection, fn: Any) -> list[str]:
    """SQLite's plan of each statement on ``instances`` that ``fn(connection)`` runs."""
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if "FROM instances" in statement and not statement.startswith("EXPLAIN"):
            seen.append((statement, parameters))

    event.listen(connection, "before_cursor_execute", capture)
    try:
        fn(connection)
    finally:
        event.remove(connection, "before_cursor_execute", capture)
    assert seen, "no statement on instances ran"
    return [
        " ".join(
            str(row[-1]) for row in connection.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)
        )
        for statement, parameters in seen
    ]


async def test_0009_indexes_the_instances_by_name(db_url: str, engine: AsyncEngine) -> None:
    """The looks by name that the partial unique index of the live rows cannot serve: a name
    whatever its status (``current_row``), the DESTROYED rows of the names the reconciler finds
    orphaned, a name checked across backends; on SQLite each plan searches ix_instances_name
    instead of scanning the table (a second of CPU a reconcile pass at 100,000 rows); 0008 has
    no such index."""
    from sqlalchemy import text

    from synnefo_ganeti.reconcile._fetch import read_rows
    from synnefo_ganeti.store.instances._instances import current_row
    from synnefo_ganeti.store.requests._names import check_name_free

    await upgrade(engine)

    def indexes(connection: Connection) -> dict[str, Any]:
        return {ix["name"]: ix for ix in inspect(connection).get_indexes("instances")}

    found = (await _run(engine, indexes))["ix_instances_name"]
    assert found["column_names"] == ["name"] and not found["unique"]
    if engine.dialect.name == "sqlite":
        looks = {
            "current_row": lambda c: current_row(c, 1, "vm1"),
            "read_rows": lambda c: read_rows(c, "b1", live=False, destroyed=["vm1", "vm2"]),
            "check_name_free": lambda c: check_name_free(c, "vm1", backend=None, unique_names="global"),
        }
        for look, fn in looks.items():
            plans = await _run(engine, _instance_plans, fn)
            assert all("USING INDEX ix_instances_name" in plan for plan in plans), (look, plans)
    else:

        def definition(connection: Connection) -> str:
            query = "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_instances_name'"
            return str(connection.execute(text(query)).scalar_one())

        assert (await _run(engine, definition)).endswith("USING btree (name)")
    await _run(engine, _command, "downgrade", "0008")
    assert "ix_instances_name" not in await _run(engine, indexes)


async def test_0019_names_the_feed_sequence_once_and_the_feed_works_both_ways(pg_url: str) -> None:
    """0019's change-id trigger and horizon name the sequence as the migration found it (no
    ``pg_get_serial_sequence`` or ``EXECUTE`` a call); the ids and the horizon are the same before
    and after, and again after its downgrade. PostgreSQL only (SQLite has neither function)."""
    from sqlalchemy import text

    engine = create_async_engine(normalize_url(pg_url))
    try:
        await _feed_functions_both_ways(engine, text)
    finally:
        await engine.dispose()


async def _feed_functions_both_ways(engine: AsyncEngine, text: Any) -> None:
    await upgrade(engine)

    def bodies(connection: Connection) -> str:
        query = (
            "SELECT string_agg(prosrc, ' ') FROM pg_proc WHERE proname IN "
            "('synnefo_ganeti_change_id', 'synnefo_ganeti_feed_horizon')"
        )
        return str(connection.execute(text(query)).scalar_one())

    def write_and_read(connection: Connection) -> tuple[int, int, list[str]]:
        connection.execute(
            text("INSERT INTO changes (kind, key, status, at) VALUES ('request', 'r', 'pending', 0)")
        )
        new = connection.execute(text("SELECT max(id) FROM changes")).scalar_one()
        last_id, writers = connection.execute(
            text("SELECT last_id, writers FROM synnefo_ganeti_feed_horizon()")
        ).one()
        return int(new), int(last_id), list(writers)

    for step in (None, "downgrade", "upgrade"):
        if step == "downgrade":
            await _run(engine, _command, "downgrade", "0018")
        elif step == "upgrade":
            await _run(engine, _command, "upgrade", "head")
        body = await _run(engine, bodies)
        assert ("pg_get_serial_sequence" in body) is (step == "downgrade"), body
        new, last_id, writers = await _run(engine, write_and_read)
        # this transaction wrote a change: it holds the feed writers' lock, its id is the last
        assert last_id == new and len(writers) == 1
        async with engine.connect() as other:  # another session: no writer now
            row = (
                await other.execute(text("SELECT last_id, writers FROM synnefo_ganeti_feed_horizon()"))
            ).one()
            assert (row.last_id, list(row.writers)) == (new, [])


async def test_0021_locks_each_writers_first_id_and_reads_the_horizon_from_them_both_ways(
    pg_url: str,
) -> None:
    """0021's trigger locks a transaction's first change id, and ``synnefo_ganeti_feed_safe_id()``
    reads the horizon below it; its downgrade takes both back (0015's horizon, which stays, works
    throughout). PostgreSQL only."""
    from sqlalchemy import text

    def functions(connection: Connection) -> tuple[bool, bool]:
        body = connection.execute(
            text("SELECT prosrc FROM pg_proc WHERE proname = 'synnefo_ganeti_change_id'")
        ).scalar_one()
        safe = connection.execute(
            text("SELECT count(*) FROM pg_proc WHERE proname = 'synnefo_ganeti_feed_safe_id'")
        ).scalar_one()
        return "first_change" in str(body), bool(safe)

    def write_two(connection: Connection) -> tuple[list[int], list[int], tuple[int, int]]:
        insert = text(
            "INSERT INTO changes (kind, key, status, at) VALUES ('request', 'r', 'pending', 0) RETURNING id"
        )
        ids = [int(connection.execute(insert).scalar_one()) for _ in range(2)]
        locked = connection.execute(
            text(
                "SELECT coalesce(array_agg((classid::bigint << 32) | objid::bigint), '{}') FROM pg_locks "
                "WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid()"
            )
        ).scalar_one()
        old = connection.execute(text("SELECT last_id, writers FROM synnefo_ganeti_feed_horizon()")).one()
        return ids, list(locked), (int(old.last_id), len(old.writers))

    engine = create_async_engine(normalize_url(pg_url))
    try:
        await upgrade(engine)
        for step in (None, "downgrade", "upgrade"):
            if step is not None:
                await _run(engine, _command, step, "0020" if step == "downgrade" else "head")
            upgraded = step != "downgrade"
            assert await _run(engine, functions) == (upgraded, upgraded)
            ids, locked, old = await _run(engine, write_two)
            assert locked == (ids[:1] if upgraded else [])  # the first id, once
            assert old == (ids[1], 1)  # 0015's horizon: this transaction a writer, its ids the last
            if upgraded:
                async with engine.connect() as other:  # another session: no writer now
                    row = (
                        await other.execute(
                            text("SELECT safe_id, waiting FROM synnefo_ganeti_feed_safe_id()")
                        )
                    ).one()
                    assert (row.safe_id, list(row.waiting)) == (ids[1], [])
    finally:
        await engine.dispose()
