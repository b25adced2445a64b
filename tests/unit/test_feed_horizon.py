"""The change feed without the writers' global lock (issue 31 item 1, migration 0015).

Writers take no common lock any more, so change ids can commit out of order. The feed stays
gap-free for its readers: a read delivers only ids up to the horizon (``store/changes/_horizon.py``).
Proven here three ways: an id that commits later holds back the ids above it (and one rolled
back does not); writers in several processes at once, each committing at random moments, and a
reader whose cursor only moves forward never skips one; and a new request, a name checked and
all, goes in while another transaction holds the old global lock.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import asyncpg

from synnefo_ganeti.store import Store

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
        store.feed.patience = 0.05  # the read gives up quickly while the early writer runs
        early = await asyncpg.connect(asyncpg_url(pg_url))
        late = await asyncpg.connect(asyncpg_url(pg_url))
        try:
            slow = early.transaction()
            await slow.start()
            first = await early.fetchval(INSERT, "first")
            async with late.transaction():
                second = await late.fetchval(INSERT, "second")
            assert first < second
            # the second is committed, yet delivering it now would move a reader past the first
            assert await store.list_changes(after=0) == []
            await slow.commit()
            assert [c.key for c in await store.list_changes(after=0)] == ["first", "second"]
            assert await store.last_change_id() >= second

            # one rolled back leaves a gap that holds nothing back once it is gone
            slow = early.transaction()
            await slow.start()
            await early.fetchval(INSERT, "rolled back")
            async with late.transaction():
                await late.fetchval(INSERT, "third")
            assert await store.list_changes(after=second) == []
            await slow.rollback()
            assert [c.key for c in await store.list_changes(after=second)] == ["third"]
        finally:
            await early.close()
            await late.close()


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
            await conn.fetchval(INSERT, f"{{name}}-{{n}}")
            await asyncio.sleep(rng.random() * 0.004)  # commit at a random moment after the id
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
    assert len(committed) > 450  # 600 written, about 10 % rolled back
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
