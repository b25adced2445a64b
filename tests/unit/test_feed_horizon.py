"""The change feed without the writers' global lock (issue 31 item 1, migration 0015).

Writers take no common lock any more, so change ids can commit out of order. The feed stays
gap-free for its readers: a read delivers only ids up to the horizon (``store/changes/_horizon.py``),
below the first id of every writer still running (migration 0021), without waiting for them.
Proven here: an id that commits later holds back the ids above it, not those below (and one
rolled back holds back nothing); a writer locks its first id once, and again after a savepoint
took it back; a writer between its id and that lock is waited for; writers in several processes
at once, each committing one to three rows at random moments, some after a savepoint rolled back,
and a reader whose cursor only moves forward never skips one; and a new request, a name checked
and all, goes in while another transaction holds the old global lock.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import asyncpg

from synnefo_ganeti.store import Store
from synnefo_ganeti.store.changes._horizon import FEED_LOCK_KEY

#: the old writers' global lock ("sgwr"), which new requests no longer take
WRITE_LOCK_KEY = int.from_bytes(b"sgwr", "big")

INSERT = (
    "INSERT INTO changes (kind, key, status, task, error, at) "
    "VALUES ('request', $1, 'pending', NULL, NULL, extract(epoch FROM clock_timestamp())) RETURNING id"
)


def asyncpg_url(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def test_an_id_that_commits_later_holds_back_the_ids_above_it(pg_url: str) -> None:
    async with Store(pg_url) as store:
        early = await asyncpg.connect(asyncpg_url(pg_url))
        late = await asyncpg.connect(asyncpg_url(pg_url))
        try:
            async with late.transaction():
                zero = await late.fetchval(INSERT, "zero")
            slow = early.transaction()
            await slow.start()
            first = await early.fetchval(INSERT, "first")
            async with late.transaction():
                second = await late.fetchval(INSERT, "second")
            assert zero < first < second
            # the second is committed, yet delivering it now would move a reader past the first;
            # what came before the first is delivered at once (migration 0021: no wait for writers)
            assert [c.key for c in await store.list_changes(after=0)] == ["zero"]
            # the newest change below the horizon (first - 1 is an id no change has: the column's
            # default takes one before the trigger takes the row's, after the feed lock)
            assert await store.last_change_id() == zero
            await slow.commit()
            assert [c.key for c in await store.list_changes(after=0)] == ["zero", "first", "second"]
            assert await store.last_change_id() == second

            # one rolled back leaves a gap that holds nothing back once it is gone
            slow = early.transaction()
            await slow.start()
            await early.fetchval(INSERT, "rolled back")
            async with late.transaction():
                third = await late.fetchval(INSERT, "third")
            assert await store.list_changes(after=second) == []
            assert await store.last_change_id() == second
            await slow.rollback()
            assert [c.key for c in await store.list_changes(after=second)] == ["third"]
            assert await store.last_change_id() == third
        finally:
            await early.close()
            await late.close()


async def test_a_writer_locks_its_first_id_once_and_again_after_a_savepoint_took_it_back(
    pg_url: str,
) -> None:
    """The trigger locks a transaction's first change id (the one-``bigint`` advisory lock), and
    no later one; a savepoint rolled back takes the lock back with its id, and the next change
    row locks its own."""
    own_ids = (
        "SELECT array_agg((classid::bigint << 32) | objid::bigint ORDER BY objid) FROM pg_locks "
        "WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND pid = pg_backend_pid()"
    )
    async with Store(pg_url):
        pass  # (the schema)
    conn = await asyncpg.connect(asyncpg_url(pg_url))
    try:
        async with conn.transaction():
            ids = [await conn.fetchval(INSERT, f"row-{n}") for n in range(3)]
            assert await conn.fetchval(own_ids) == [ids[0]]
        async with conn.transaction():
            savepoint = conn.transaction()
            await savepoint.start()
            gone = await conn.fetchval(INSERT, "gone")
            assert await conn.fetchval(own_ids) == [gone]
            await savepoint.rollback()
            assert await conn.fetchval(own_ids) is None
            kept = [await conn.fetchval(INSERT, f"kept-{n}") for n in range(2)]
            assert await conn.fetchval(own_ids) == [kept[0]]
        assert await conn.fetchval(own_ids) is None  # (the transaction's end lets it go)
    finally:
        await conn.close()


async def test_a_writer_between_its_id_and_the_ids_lock_is_waited_for(pg_url: str) -> None:
    """A transaction that holds the feed writers' lock and no id's lock may hold an id below the
    sequence's last value (it is inside the trigger, between ``nextval`` and the lock): a read
    waits for it, and gives [] after ``patience`` (read again later)."""
    async with Store(pg_url) as store:
        writer = await asyncpg.connect(asyncpg_url(pg_url))
        holder = await asyncpg.connect(asyncpg_url(pg_url))
        try:
            async with writer.transaction():
                await writer.fetchval(INSERT, "before")
            store.feed.patience = 0.05
            tx = holder.transaction()
            await tx.start()
            await holder.execute(
                "SELECT pg_advisory_xact_lock_shared(hashtext(current_database()), $1)", FEED_LOCK_KEY
            )
            assert await store.list_changes(after=0) == []
            await tx.rollback()
            assert [c.key for c in await store.list_changes(after=0)] == ["before"]
        finally:
            await writer.close()
            await holder.close()


WRITER = textwrap.dedent(
    """
    import asyncio, random, sys
    import asyncpg

    INSERT = {insert!r}

    async def main(url: str, name: str, count: int) -> None:
        conn = await asyncpg.connect(url)
        rng = random.Random(name)
        for n in range(count):
            tx = conn.transaction()
            await tx.start()
            if rng.random() < 0.2:  # a first id taken back by a savepoint, its lock with it
                savepoint = conn.transaction()
                await savepoint.start()
                await conn.fetchval(INSERT, f"{{name}}-{{n}}-gone")
                await savepoint.rollback()
            for k in range(rng.randint(1, 3)):  # one change row or several
                await conn.fetchval(INSERT, f"{{name}}-{{n}}-{{k}}")
                await asyncio.sleep(rng.random() * 0.002)  # commit at a random moment after the id
            if rng.random() < 0.1:
                await tx.rollback()
            else:
                await tx.commit()
        await conn.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
).format(insert=INSERT)


async def test_writers_in_several_processes_and_a_reader_that_never_skips(
    pg_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    url = asyncpg_url(pg_url)
    async with Store(pg_url) as store:
        writers = [
            await asyncio.create_subprocess_exec(sys.executable, str(script), url, f"w{i}", "150")
            for i in range(4)
        ]
        seen: list[int] = []
        cursor = 0

        async def read_once() -> None:
            nonlocal cursor
            for change in await store.list_changes(after=cursor, limit=37):
                assert change.id > cursor, (change.id, cursor)
                cursor = change.id
                seen.append(change.id)

        ended = asyncio.ensure_future(asyncio.gather(*(w.wait() for w in writers)))
        while not ended.done():
            await read_once()
            await asyncio.sleep(0)  # (the reader reads as fast as it can, racing the writers)
        assert await ended == [0, 0, 0, 0]
        before = -1
        while before != len(seen):
            before = len(seen)
            await read_once()
        conn = await asyncpg.connect(url)
        try:
            committed = [row["id"] for row in await conn.fetch("SELECT id FROM changes ORDER BY id")]
        finally:
            await conn.close()
    assert len(committed) > 900  # 600 transactions of 1-3 rows, about 10 % rolled back
    assert seen == committed  # every committed change, once, in id order: none skipped


async def test_a_new_request_goes_in_while_the_old_global_lock_is_held(pg_url: str) -> None:
    async with Store(pg_url) as store:
        holder = await asyncpg.connect(asyncpg_url(pg_url))
        try:
            tx = holder.transaction()
            await tx.start()
            await holder.execute(
                "SELECT pg_advisory_xact_lock(hashtext(current_database()), $1)", WRITE_LOCK_KEY
            )
            # (before issue 31 this waited for the holder: every request took that lock)
            request, new = await asyncio.wait_for(
                store.add_request({"os": "noop"}, name="free.example", unique_names="global"), timeout=60
            )
            assert new and request.instance == "free.example"
            await tx.rollback()
        finally:
            await holder.close()


async def test_one_name_wanted_by_many_processes_at_once_goes_to_one(pg_url: str, tmp_path: Path) -> None:
    """Names are checked under a lock per name now: eight processes adding requests for the same
    ten names at once, each name ends up with exactly one request."""
    script = tmp_path / "adder.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio, sys
            from synnefo_ganeti.errors import ConflictError
            from synnefo_ganeti.store import Store

            async def main(url: str, who: str) -> None:
                async with Store(url) as store:
                    async def one(n: int) -> None:
                        try:
                            await store.add_request({"os": "noop"}, name=f"n{n}.example", unique_names="global")
                        except ConflictError:
                            pass
                    await asyncio.gather(*(one(n) for n in range(10)))

            asyncio.run(main(sys.argv[1], sys.argv[2]))
            """
        )
    )
    async with Store(pg_url):
        pass  # the schema, before the processes race for it
    procs = [
        await asyncio.create_subprocess_exec(sys.executable, str(script), pg_url, f"p{i}") for i in range(8)
    ]
    assert [await p.wait() for p in procs] == [0] * 8
    async with Store(pg_url) as store:
        requests = await store.list_requests()
    names = sorted(r.instance for r in requests)
    assert names == sorted(f"n{n}.example" for n in range(10))


async def test_sqlite_reads_are_unchanged(sqlite_url: str) -> None:
    """SQLite's writes are serial: a read delivers every committed change at once."""
    async with Store(sqlite_url) as store:
        await store.add_request({"os": "noop"}, name="a.example", unique_names="global")
        assert [c.kind for c in await store.list_changes(after=0)] == ["request"]
        assert await store.last_change_id() == (await store.list_changes(after=0))[-1].id
