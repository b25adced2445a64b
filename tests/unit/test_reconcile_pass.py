"""One reconcile pass (issue 15 part 4): one database snapshot for every backend, pinned before any
backend is asked; an instance settled by comparing its cells whole with those its row expects, only
when the full comparison would find nothing; each answer decoded when it can be used."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from synnefo_ganeti import RapiClient
from synnefo_ganeti.config import Settings
from synnefo_ganeti.errors import RapiError, StoreError
from synnefo_ganeti.rapi import cell_values
from synnefo_ganeti.reconcile import Reconciler, _fetch
from synnefo_ganeti.reconcile._fetch import (
    I_IPS,
    I_SIZES,
    INSTANCE_FIELDS,
    live_rows,
    live_rows_plain,
    live_rows_raw,
    snapshot_row,
)
from synnefo_ganeti.reconcile._pass import ANY, PassReads, PassRows, _TextRows, expected_cells, settle
from synnefo_ganeti.store import InstanceStatus, Store, StoredInstance
from synnefo_ganeti.testing import FakeGaneti, FakeInstance
from synnefo_ganeti.testing import _query as fake_query
from synnefo_ganeti.testing._query import _INSTANCE_FIELDS
from tests import helpers
from tests.unit.test_reconcile import QUICK
from tests.unit.test_reconcile_query import CASES, NS, fake_instance, outcome, queried, stored

B = "athens"


def cells_of(inst: FakeInstance, link: str = "gntbr0") -> list[list[Any]]:
    """The fake's answer for ``inst``, as Ganeti sends it: ``[status, value]`` cells."""
    return [[0, _INSTANCE_FIELDS[name](inst, link)] for name in INSTANCE_FIELDS]


def row_tuple(row: StoredInstance) -> tuple[Any, ...]:
    """``row`` as :func:`live_rows` reads it."""
    return (
        row.name, row.status.value, row.owned, row.create_job_id, row.updated_at, row.os, row.beparams,
        row.nics, row.disks, row.tags, row.memory, row.vcpus, row.pnode,
    )  # fmt: skip


def ours_only(inst: FakeInstance) -> FakeInstance:
    inst.tags.remove("ops:backup")
    return inst


# -- the cells a row expects ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "row_changes", "their_tag"),
    [
        (change, row_changes, their_tag)
        for name, change, row_changes in CASES
        for their_tag in (True, False)
        if their_tag or name != "their tag removed"
    ],
    ids=[
        f"{name}, {'their tag too' if their_tag else 'our tags only'}"
        for name, _, _ in CASES
        for their_tag in (True, False)
        if their_tag or name != "their tag removed"
    ],
)
def test_equal_cells_settle_only_what_the_full_comparison_settles(
    change: Callable[[FakeInstance], None], row_changes: dict[str, Any], their_tag: bool
) -> None:
    inst = fake_instance() if their_tag else ours_only(fake_instance())
    row = stored(inst, **row_changes)
    change(inst)
    want = expected_cells(row_tuple(row))
    fast = want is not None and want == cells_of(inst)
    full = outcome(row, queried(inst)) == ([], {})  # no drift, nothing to record
    assert not fast or full
    if not their_tag and full and row.status is InstanceStatus.STARTED and inst.oper_state:
        assert fast  # the usual case takes the fast path
    if their_tag and row.tags is not None and inst.tags != row.tags:
        assert not fast  # an operator's tag: the long way (it settles there, not a drift)


def test_the_cells_a_started_and_a_stopped_row_expect() -> None:
    inst = ours_only(fake_instance())
    started = expected_cells(row_tuple(stored(inst)))
    assert started is not None and started == cells_of(inst)
    assert started[1:4] == [[0, "up"], [0, True], ANY]
    inst.admin_state, inst.oper_state = "down", False
    stopped = expected_cells(row_tuple(stored(inst, status=InstanceStatus.STOPPED)))
    assert stopped is not None and stopped == cells_of(inst) and started != cells_of(inst)
    assert repr(ANY) == "ANY" and ANY == 1 and (ANY != [0, 1]) is False


CANNOT_SETTLE: list[dict[str, Any]] = [
    {"status": InstanceStatus.BUILD},
    {"status": InstanceStatus.ERROR},
    {"nics": None},
    {"disks": None},
    {"nics": [{"mac": "aa:00:00:00:00:01"}]},  # as asked, not as Ganeti made it
    {"disks": [{"size": 1024}]},
    {"beparams": {"nosuch": 1}},
    {"beparams": {"maxmem": 1024}},  # against memory 512: never settles
    {"beparams": {"maxmem": [512]}},
]
CANNOT_SETTLE_IDS = ["build", "error", "no nics", "no disks", "nics as asked", "disks as asked",
                     "unknown beparam", "maxmem against memory", "beparam not a scalar"]  # fmt: skip


@pytest.mark.parametrize("row_changes", CANNOT_SETTLE, ids=CANNOT_SETTLE_IDS)
def test_rows_that_cannot_settle_by_their_cells_expect_none(row_changes: dict[str, Any]) -> None:
    assert expected_cells(row_tuple(stored(fake_instance(), **row_changes))) is None


def test_a_row_not_ours_expects_none() -> None:
    row = row_tuple(stored(fake_instance()))
    assert expected_cells(row) is not None
    assert expected_cells((*row[:2], False, *row[3:])) is None


def test_equal_rows_share_their_cells() -> None:
    made: dict[Any, list[Any]] = {}
    one = expected_cells(row_tuple(stored(fake_instance(name="vm1"))), made)
    two = expected_cells(row_tuple(stored(fake_instance(name="vm2"))), made)
    assert one is not None and two is not None
    assert one[4] is two[4] and one[-1] is two[-1]  # os, tags: one cell
    assert one[0] != two[0]


def as_texts(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """``row`` as SQLite's cursor gives it: the JSON columns texts, ``owned`` 0 or 1."""
    name, status, owned, job, updated, os_, be, nics, disks, tags, memory, vcpus, pnode = row
    be, nics, disks, tags = (orjson.dumps(value).decode() for value in (be, nics, disks, tags))
    return (name, status, int(owned), job, updated, os_, be, nics, disks, tags, memory, vcpus, pnode)


@pytest.mark.parametrize(
    "row_changes",
    [changes for _, _, changes in CASES] + CANNOT_SETTLE + [{"tags": None}, {"beparams": None}, {"nics": []}],
    ids=[name for name, _, _ in CASES] + CANNOT_SETTLE_IDS + ["no tags", "no beparams", "no nic"],
)
def test_the_cells_made_from_texts_are_those_of_the_decoded_row(row_changes: dict[str, Any]) -> None:
    """SQLite's rows are read as the cursor's tuples and their cells made from the texts, the
    common part once per distinct texts (``_TextRows``): the same cells as :func:`expected_cells`
    of the decoded row, compared by their reprs (``ANY`` equals anything); a row not ours too."""
    texts = _TextRows({})
    for their_tag in (True, False):
        inst = fake_instance() if their_tag else ours_only(fake_instance())
        for owned in (True, False):
            row = row_tuple(stored(inst, **row_changes))
            row = (*row[:2], owned, *row[3:])
            assert texts.texts(as_texts(row))
            for _ in range(2):  # made, then from the cache of common cells
                assert repr(texts.cells(as_texts(row))) == repr(expected_cells(row))
    assert not texts.texts((*as_texts(row)[:6], None, *as_texts(row)[7:]))  # a NULL column


def test_rows_of_equal_nics_and_disks_share_those_cells() -> None:
    texts = _TextRows({})
    one, two = (texts.cells(as_texts(row_tuple(stored(fake_instance(name=n))))) for n in ("vm1", "vm2"))
    assert one is not None and two is not None and one[0] != two[0]
    assert all(one[i] is two[i] for i in range(I_IPS, I_SIZES + 1))


async def test_plain_rows_are_sqlalchemys_once_processed(db_url: str) -> None:
    """``live_rows_plain`` in a pinned read: on a SQLite file one JSON text that SQLite made,
    whose rows are the cursor's own tuples' values (texts with quotes, backslashes and
    non-ASCII, integers, NULLs), which ``process`` makes SQLAlchemy's rows (``owned`` a bool,
    ``updated_at`` a datetime); elsewhere SQLAlchemy's rows."""
    inst = ours_only(fake_instance())
    row = stored(inst)
    async with Store(db_url) as store:
        await store.add_instance(
            B, "vm1", status=InstanceStatus.STARTED, owned=True, os='debian "é" \\ 🐧', beparams=row.beparams,
            nics=row.nics, disks=row.disks, tags=row.tags,
        )  # fmt: skip
        await store.add_instance(B, "vm2", status=InstanceStatus.BUILD, owned=False)

        def both(conn: Any) -> tuple[list[Any], list[Any], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
            rows, process = live_rows_plain(conn, B)
            plain = list(rows())
            cursor = (
                conn.execute(_fetch._live_select(B)).cursor.fetchall() if db_url.startswith("sqlite") else []
            )
            return (
                plain,
                [process(raw) for raw in plain],
                [tuple(raw) for raw in live_rows_raw(conn, B)],
                cursor,
            )

        async with store.pinned_read() as read:
            plain, processed, rows, cursor = await read.call(both)
    assert sorted(processed) == sorted(rows) and len(rows) == 2
    building = next(r for r in rows if r[0] == "vm2")
    assert building[2] is False and building[4] is not None and building[4].year >= 2026
    assert next(r for r in rows if r[0] == "vm1")[5] == 'debian "é" \\ 🐧'
    if db_url.startswith("sqlite"):
        assert sorted(tuple(raw) for raw in plain) == sorted(cursor)
        assert all(
            type(a) is type(b)
            for raw, tup in zip(sorted(map(tuple, plain)), sorted(cursor), strict=True)
            for a, b in zip(raw, tup, strict=True)
        )
        assert next(raw for raw in plain if raw[0] == "vm2")[2] == 0


# -- settle: an answer against the rows -------------------------------------------------------------


def test_settle_leaves_what_differs_and_what_only_one_side_has() -> None:
    same, other, building = (ours_only(fake_instance(name=n)) for n in ("vm1", "vm2", "vm3"))
    rows = {
        "vm1": row_tuple(stored(same)),
        "vm2": row_tuple(stored(other)),
        "vm3": row_tuple(stored(building, status=InstanceStatus.BUILD)),
        "gone": row_tuple(stored(fake_instance(name="gone"))),
    }
    expected = {name: cells for name, row in rows.items() if (cells := expected_cells(row)) is not None}
    other.os = "debian"
    orphan = ours_only(fake_instance(name="vm4"))
    items = [cells_of(i) for i in (same, other, building, orphan)]
    left_rows, left_instances, count = settle(B, PassRows(rows, expected, {}, 0.0), items, "athens")
    assert count == 1
    assert sorted(left_rows) == ["gone", "vm2", "vm3"]
    assert sorted(left_instances) == ["vm2", "vm3", "vm4"]
    assert left_rows["vm2"].status is InstanceStatus.STARTED and left_instances["vm2"].os == "debian"


def test_an_item_of_another_shape_is_a_rapi_error() -> None:
    with pytest.raises(RapiError, match="athens: PUT /2/query/instance answered an item"):
        settle(B, PassRows({}, {}, {}, 0.0), [[[0, "vm1"], 5, *([[0, None]] * 18)]], "athens")


# -- the pinned snapshot ----------------------------------------------------------------------------


async def test_a_pinned_read_sees_the_database_as_it_was_when_it_began(db_url: str) -> None:
    inst = ours_only(fake_instance())
    async with Store(db_url) as store:
        await store.add_instance(B, "vm1", status=InstanceStatus.STARTED, owned=True)
        async with store.pinned_read() as read:
            assert read.pinned and "pinned=True" in repr(read)
            await store.update_instance(B, "vm1", status=InstanceStatus.STOPPED, os=inst.os)
            seen = await read.call(lambda conn: live_rows(conn, B))
        after = await store.call_read(lambda conn: live_rows(conn, B))
    assert seen["vm1"][1] == "STARTED" and seen["vm1"][5] is None
    assert after["vm1"][1] == "STOPPED" and after["vm1"][5] == "noop"


async def test_an_in_memory_database_holds_no_snapshot() -> None:
    async with Store("sqlite://") as store, store.pinned_read() as read:
        assert not read.pinned
        await store.add_instance(B, "vm1", status=InstanceStatus.STARTED, owned=True)
        assert list(await read.call(lambda conn: live_rows(conn, B))) == ["vm1"]


async def test_the_pass_reads_hand_each_backends_rows_over_once(db_url: str) -> None:
    async with Store(db_url) as store:
        for backend in ("a", "b"):
            await store.add_instance(backend, f"vm-{backend}", status=InstanceStatus.STARTED, owned=True)
        async with PassReads(store, ["a", "b"]) as reads:
            assert await reads.pinned()
            b = await reads.rows("b")
            a = await reads.rows("a")
            assert list(a.rows) == ["vm-a"] and list(b.rows) == ["vm-b"] and a.taken_at == b.taken_at
            assert reads.ready("a") is None
            with pytest.raises(RuntimeError, match="handed over already"):
                await reads.rows("a")


async def test_the_orphans_destroyed_rows_are_read_in_the_pass_snapshot(db_url: str) -> None:
    """``PassReads.destroyed`` reads in the pass's snapshot, on its connection, while the pass
    holds it (a row destroyed after the snapshot is not seen); once the pass is over, or with
    no snapshot held, in a read of its own (seen)."""
    async with Store(db_url) as store:
        await store.add_instance("a", "vm-old", status=InstanceStatus.DESTROYED, owned=True)
        await store.add_instance("a", "vm-late", status=InstanceStatus.STARTED, owned=True)
        async with PassReads(store, ["a"]) as reads:
            assert await reads.pinned()
            assert list((await reads.rows("a")).rows) == ["vm-late"]
            await store.update_instance("a", "vm-late", status=InstanceStatus.DESTROYED)
            found = await reads.destroyed("a", ["vm-old", "vm-late", "nosuch"])
            assert {name: row.status for name, row in found.items()} == {"vm-old": InstanceStatus.DESTROYED}
        after = await reads.destroyed("a", ["vm-old", "vm-late"])
        assert sorted(after) == ["vm-late", "vm-old"]
    async with Store("sqlite://") as store:
        await store.add_instance("a", "vm-old", status=InstanceStatus.DESTROYED, owned=True)
        async with PassReads(store, ["a"]) as reads:
            assert not await reads.pinned()
            assert list((await reads.rows("a")).rows) == []  # read first, then asked: then this
            assert list(await reads.destroyed("a", ["vm-old"])) == ["vm-old"]


async def test_a_database_that_fails_fails_every_backends_rows(tmp_path: Any) -> None:
    async with Store(f"sqlite:///{tmp_path / 's.db'}") as store:

        class Broken:
            async def __aenter__(self) -> Any:
                raise StoreError("cannot read from database s.db: disk I/O error")

            async def __aexit__(self, *exc_info: object) -> None:
                return None

        store.pinned_read = Broken  # type: ignore[method-assign]
        async with PassReads(store, ["a", "b"]) as reads:
            for call in (reads.pinned(), reads.rows("a"), reads.rows("b")):
                with pytest.raises(StoreError, match="disk I/O error"):
                    await call


async def test_the_snapshot_is_taken_before_any_backend_is_asked(tmp_path: Any) -> None:
    """The order plan() relies on: the database's snapshot, then Ganeti's (a job that ends in
    between is seen ended by Ganeti only, and left alone)."""
    events: list[str] = []
    async with (
        FakeGaneti(tls=False, op_times=QUICK) as fake,
        Store(f"sqlite:///{tmp_path / 's.db'}") as store,
    ):
        pin = store.pinned_read

        @contextlib.asynccontextmanager
        async def recorded() -> AsyncIterator[Any]:
            async with pin() as read:
                events.append("pinned")
                yield read

        def latency() -> float:
            events.append("asked")
            return 0.0

        store.pinned_read = recorded  # type: ignore[method-assign]
        fake.latency = latency
        backend = {"name": B, "url": fake.url, "username": fake.username, "password": fake.password}
        settings = Settings(database={"url": f"sqlite:///{tmp_path / 's.db'}"}, backends=[backend])
        async with Reconciler(settings, store=store) as reconciler:
            report = await reconciler.run_once()
    assert report.ok and events[0] == "pinned" and events.count("pinned") == 1 and "asked" in events


@contextlib.asynccontextmanager
async def open_fake() -> AsyncIterator[tuple[FakeGaneti, RapiClient]]:
    """A fake with one running instance, ``vm1``, and a client of it."""
    async with (
        FakeGaneti(tls=False, op_times=QUICK) as fake,
        RapiClient(fake.url, username=fake.username, password=fake.password) as client,
    ):
        await client.wait_for_job(await client.create_instance(helpers.spec("vm1")))
        yield fake, client


# -- each answer decoded when it can be used --------------------------------------------------------


async def test_an_answer_is_decoded_when_its_load_is_called() -> None:
    async with open_fake() as (_fake, client):
        loads: list[Callable[[], Any]] = []

        def keep(load: Callable[[], Any]) -> int:
            loads.append(load)
            return len(loads)

        assert await client.query_cells_into("instance", ["name", "admin_state"], keep) == 1
        assert loads[0]() == [[[0, "vm1"], [0, "up"]]]
        assert await client.query_cells("instance", ["name"]) == [[[0, "vm1"]]]
        assert [cell_values(item) for item in await client.query_cells("instance", ["name"])] == [["vm1"]]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"<html>", "not JSON"),
        (b'{"data": [[1, 2]]}', "unexpected shape"),
        (b'{"data": 5}', "unexpected shape"),
    ],
)
async def test_an_answer_that_is_not_cells_is_a_rapi_error_when_loaded(body: bytes, error: str) -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_put("/2/query/instance", answer)
    async with (
        TestServer(app) as server,
        RapiClient(str(server.make_url("")).rstrip("/"), username="u", password="p") as client,
    ):
        load = await client.query_cells_into("instance", ["name"], lambda load: load)
        with pytest.raises(RapiError, match=error):
            load()


# -- the fake's side --------------------------------------------------------------------------------


async def test_the_fake_builds_a_query_answer_with_the_collector_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[bool] = []
    fields = dict(fake_query._INSTANCE_FIELDS)

    def name(inst: FakeInstance, _link: str) -> str:
        seen.append(gc.isenabled())
        return inst.name

    fields["name"] = name
    monkeypatch.setattr(fake_query, "_INSTANCE_FIELDS", fields)
    async with open_fake() as (_fake, client):
        assert gc.isenabled()
        assert await client.query_rows("instance", ["name"]) == [["vm1"]]
    assert seen == [False] and gc.isenabled()


async def test_the_fake_lets_a_query_answer_go_before_the_collector_goes_again() -> None:
    """The answer's JSON text is what ``query`` answers, and its lists (500 instances: ~14,000)
    are let go while the collector is paused: none is left counted for its next collection."""
    async with FakeGaneti(tls=False) as fake:
        for index in range(500):
            inst = fake_instance(name=f"vm{index}")
            fake.cluster.instances[inst.name] = inst
        fields = list(INSTANCE_FIELDS)
        gc.collect()
        before = gc.get_count()[0]
        body = fake_query.query_json(fake.cluster, "instance", fields)
        after = gc.get_count()[0]
        assert gc.isenabled() and after - before < 1_000  # not ~14,000
        answer = orjson.loads(body)
        assert answer == fake_query.query(fake.cluster, "instance", fields) and len(answer["data"]) == 500


def test_the_fast_path_is_the_one_the_reconciler_takes() -> None:
    """The reconciler's own namespace (``NS``) is the tests' one: a row stored by the observer
    with only our tags settles by its cells."""
    inst = ours_only(fake_instance())
    row = stored(inst)
    assert row.tags == [f"{NS}owned"]
    read = PassRows({inst.name: row_tuple(row)}, {inst.name: expected_cells(row_tuple(row)) or []}, {}, 0.0)
    rows, instances, count = settle(B, read, [cells_of(inst)], B)
    assert (rows, instances, count) == ({}, {}, 1)
    assert snapshot_row(B, row_tuple(row)).status is InstanceStatus.STARTED
    assert asyncio.iscoroutinefunction(RapiClient.query_cells_into)


async def test_a_second_pass_settles_what_the_first_recorded(db_url: str) -> None:
    """The first pass records what Ganeti made (NICs, disks, memory...); the next settles
    those instances by their cells, and finds nothing."""
    async with open_fake() as (fake, client), Store(db_url) as store:
        await client.wait_for_job(await client.create_instance(helpers.spec("vm2")))
        for instance in ("vm1", "vm2"):
            await store.add_instance(B, instance, status=InstanceStatus.STARTED, os="noop")
        backend = {"name": B, "url": fake.url, "username": fake.username, "password": fake.password}
        # (the fake's instances carry no ownership mark: none configured, none is "not ours")
        settings = Settings(database={"url": db_url}, backends=[backend], ownership={"tag": ""})
        async with Reconciler(settings, store=store) as reconciler:
            first = await reconciler.run_once()
            second = await reconciler.run_once()
    assert first.clean and second.clean, (first.summary(), second.summary())
    assert (first.backends[0].settled, first.backends[0].observed) == (0, 2)
    assert (second.backends[0].settled, second.backends[0].observed) == (2, 0)


async def test_a_backend_named_twice_is_checked_once(tmp_path: Any) -> None:
    async with open_fake() as (fake, _client), Store(f"sqlite:///{tmp_path / 's.db'}") as store:
        backend = {"name": B, "url": fake.url, "username": fake.username, "password": fake.password}
        settings = Settings(database={"url": f"sqlite:///{tmp_path / 's.db'}"}, backends=[backend])
        async with Reconciler(settings, store=store) as reconciler:
            report = await reconciler.run_once(backends=[B, B])
    assert [b.name for b in report.backends] == [B] and report.ok
