"""The cloud sees what died (issue 27 item 5), on SQLite and on PostgreSQL.

``Store.set_node_state`` marks every live instance of a node and clears it; the change feed
carries each change of ``node_state`` (a node going down and coming back is two changes, in
order, seen by another process); the reconciler reports an instance Ganeti reads
``ERROR_nodedown`` / ``ERROR_nodeoffline`` as ``node_down`` (report-only, never an
``operstate`` drift, whatever fixes are on) and a pass alone marks the store and clears it;
an instance that vanished from Ganeti says so in its ``last_error`` and in the feed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest

from synnefo_ganeti import Change, RapiClient, RetryPolicy
from synnefo_ganeti.config import Settings
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.errors import InvalidError
from synnefo_ganeti.rapi import Instance
from synnefo_ganeti.reconcile import DbSnapshot, DriftKind, Fix, GanetiSnapshot, Reconciler, plan
from synnefo_ganeti.reconcile._fetch import I_NAME, I_OPER, I_STATUS
from synnefo_ganeti.store import InstanceStatus, Store, StoredInstance, record_observed
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.watch import QueueWatcher
from tests import helpers
from tests.helpers import WAIT, eventually

B = "athens"
QUICK = {"OP_INSTANCE_CREATE": 0.02, "OP_INSTANCE_REMOVE": 0.01, "OP_INSTANCE_SHUTDOWN": 0.01}
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


async def _instance(store: Store, name: str, pnode: str, *, backend: str = B, status: str = "STARTED") -> str:
    instance = await store.add_instance(backend, name, status=InstanceStatus(status))
    await record_observed(store, backend, {name: {"pnode": pnode}})
    return instance.id


async def _node_states(store: Store) -> dict[tuple[str, str], str | None]:
    return {(i.backend, i.name): i.node_state for i in await store.list_instances()}


# -- the store ---------------------------------------------------------------------------------------


async def test_set_node_state_marks_every_live_instance_of_the_node_and_clears_it(db_url: str) -> None:
    async with Store(db_url) as store:
        for name in ("vm1", "vm2"):
            await _instance(store, name, "node1")
        await _instance(store, "vm3", "node2")
        await _instance(store, "gone", "node1", status="DESTROYED")
        await _instance(store, "vm1", "node1", backend="sparta")  # same node name, another backend
        assert await store.set_node_state(B, "node1", "down", detail="no RPC answer") == 2
        assert await store.set_node_state(B, "node1", "down") == 0  # nothing changed: no write
        assert await _node_states(store) == {
            (B, "gone"): None, (B, "vm1"): "down", (B, "vm2"): "down", (B, "vm3"): None, ("sparta", "vm1"): None,
        }  # fmt: skip
        down = await store.get_instance(B, "vm1")
        assert down is not None and down.status is InstanceStatus.STARTED  # its status is left alone
        assert down.node_state_since is not None
        assert down.to_json()["node_state"] == "down" and "node_state_since" in down.to_json()
        # offline after down: still not up since the first sign
        assert await store.set_node_state(B, "node1", "offline") == 2
        offline = await store.get_instance(B, "vm1")
        assert offline is not None and offline.node_state == "offline"
        assert offline.node_state_since == down.node_state_since
        assert await store.set_node_state(B, "node1", None) == 2
        back = await store.get_instance(B, "vm1")
        assert back is not None and (back.node_state, back.node_state_since) == (None, None)
        with pytest.raises(InvalidError, match="'crashed' is not one of"):
            await store.set_node_state(B, "node1", "crashed")


async def test_a_node_down_and_back_is_two_changes_in_order_seen_by_another_process(db_url: str) -> None:
    poll = 0.05 if db_url.startswith("sqlite") else 60  # PostgreSQL: NOTIFY wakes the reader
    async with Store(db_url) as writer, Store(db_url, poll_interval=poll) as reader:
        instance_id = await _instance(writer, "vm1", "node1")
        start = await reader.last_change_id()
        async with contextlib.aclosing(reader.changes(since=start)) as changes:

            async def two() -> list[Change]:
                got = []
                async for change in changes:
                    got.append(change)
                    if len(got) == 2:
                        return got
                raise AssertionError("the feed ended")

            task = asyncio.create_task(two())
            await writer.set_node_state(B, "node1", "down")
            await writer.set_node_state(B, "node1", None)
            got = await asyncio.wait_for(task, WAIT)
        assert [(c.kind, c.key, c.status, c.node_state) for c in got] == [
            ("instance", instance_id, "STARTED", "down"),
            ("instance", instance_id, "STARTED", None),
        ]
        assert got[0].id < got[1].id
        assert got[0].to_json()["node_state"] == "down" and got[1].to_json()["node_state"] is None
        assert reader.stats.batches == 0  # it never wrote
        request, _ = await writer.add_request(helpers.spec("r1").model_dump(), name="r1")
        last = (await reader.list_changes(after=got[1].id))[-1]
        assert last.kind == "request" and "node_state" not in last.to_json()  # an instance's field only
        assert last.key == request.id


# -- the plan (pure) ---------------------------------------------------------------------------------


def _row(name: str, status: InstanceStatus, node_state: str | None = None) -> StoredInstance:
    return StoredInstance(
        id=f"id-{name}", backend=B, name=name, status=status, owned=True, os="noop", disk_template="diskless",
        beparams=None, nics=None, disks=None, tags=None, create_job_id=None, state_time=None,
        created_at=LONG_AGO, updated_at=LONG_AGO, pnode="node3", node_state=node_state,
    )  # fmt: skip


def _ganeti(name: str, status: str, *, admin: str = "up", running: bool | None = None) -> Instance:
    return Instance.model_validate(
        {"name": name, "admin_state": admin, "oper_state": running, "status": status, "pnode": "node3"}
    )


@pytest.mark.parametrize(
    ("status", "ganeti", "admin"),
    [
        (InstanceStatus.STARTED, "ERROR_nodedown", "up"),
        (InstanceStatus.STARTED, "ERROR_nodeoffline", "up"),
        (InstanceStatus.STOPPED, "ERROR_nodedown", "up"),  # oper_state unknown: not "running" either
        (InstanceStatus.STOPPED, "ERROR_nodeoffline", "down"),
        (InstanceStatus.ERROR, "ERROR_nodedown", "up"),
    ],
)
def test_an_instance_on_a_node_not_up_is_node_down_and_never_operstate(
    status: InstanceStatus, ganeti: str, admin: str
) -> None:
    db = DbSnapshot(B, {"vm1": _row("vm1", status)}, {}, taken_at=LONG_AGO.timestamp())
    gnt = GanetiSnapshot(B, {"vm1": _ganeti("vm1", ganeti, admin=admin)}, {}, owned=frozenset({"vm1"}))
    drifts = plan(db, gnt)
    assert [(d.kind, d.instance) for d in drifts] == [(DriftKind.NODE_DOWN, "vm1")]
    assert ganeti in drifts[0].detail and "node3" in drifts[0].detail and drifts[0].status is None
    assert drifts[0].to_json()["kind"] == "node_down"


def test_a_node_back_up_is_no_drift() -> None:
    db = DbSnapshot(
        B, {"vm1": _row("vm1", InstanceStatus.STARTED, "down")}, {}, taken_at=LONG_AGO.timestamp()
    )
    gnt = GanetiSnapshot(B, {"vm1": _ganeti("vm1", "running", running=True)}, {}, owned=frozenset({"vm1"}))
    assert plan(db, gnt) == []


# -- a reconcile pass against the fake -----------------------------------------------------------------


def _nodes_down(client: RapiClient, down: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Ganeti's query answers the instances of ``down`` (name -> status) as Ganeti 3.0 reads an
    instance whose node is down or offline: that status, and no live data (``oper_state``'s
    cell not RS_NORMAL). The fake's own node faults are not needed for this."""
    query = client.query_cells_into

    async def query_cells_into(what: str, fields: Any, into: Callable[..., Any], **kwargs: Any) -> Any:
        def wrapped(load: Callable[[], list[list[list[Any]]]]) -> Any:
            def changed() -> list[list[list[Any]]]:
                items = load()
                for cells in items:
                    status = down.get(cells[I_NAME][1])
                    if status is not None:
                        cells[I_STATUS], cells[I_OPER] = [0, status], [2, None]
                return items

            return into(changed)

        return await query(what, fields, wrapped, **kwargs)

    monkeypatch.setattr(client, "query_cells_into", query_cells_into)


@asynccontextmanager
async def world(db_url: str) -> AsyncIterator[tuple[FakeGaneti, Store, RapiClient, Settings]]:
    async with FakeGaneti(tls=False, op_times=QUICK) as fake, Store(db_url) as store:
        client = RapiClient(
            fake.url, username=fake.username, password=fake.password, retry=RetryPolicy(attempts=1)
        )
        backends = [{"name": B, "url": fake.url, "username": fake.username, "password": fake.password}]
        async with client:
            yield fake, store, client, Settings(database={"url": db_url}, backends=backends)


async def _started(fake: FakeGaneti, store: Store, cp: ControlPlane, client: RapiClient, *names: str) -> None:
    assert fake.queue_dir is not None
    watcher = QueueWatcher(fake.queue_dir, store, B)
    task = asyncio.create_task(watcher.run())
    try:
        for name in names:
            _, job_id = await cp.create_instance(helpers.spec(name), backend=B)
            await client.wait_for_job(job_id)

        async def all_started() -> bool:
            rows = {i.name: i.status for i in await store.list_instances(backend=B)}
            return all(rows.get(name) is InstanceStatus.STARTED for name in names)

        await eventually(all_started, what="every instance started")
    finally:
        watcher.stop()
        await task


async def test_a_pass_marks_what_died_reports_it_fixes_nothing_and_clears_it(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(db_url) as (fake, store, client, settings):
        cp = ControlPlane(settings, store=store, clients={B: client})
        async with cp, Reconciler(settings, store=store, clients={B: client}) as reconciler:
            await _started(fake, store, cp, client, "vm-a", "vm-b", "vm-c")
            assert (await reconciler.run_once()).clean
            start = await store.last_change_id()
            down = {"vm-a": "ERROR_nodedown", "vm-b": "ERROR_nodeoffline"}
            _nodes_down(client, down, monkeypatch)
            for _ in range(2):  # the second pass: marked rows never settle by their cells
                report = await reconciler.run_once(fixes=set(Fix))
                drifts = sorted((d.kind.value, d.instance, d.fixed) for d in report.drifts)
                assert drifts == [("node_down", "vm-a", False), ("node_down", "vm-b", False)]
            rows = {i.name: i for i in await store.list_instances(backend=B)}
            assert {n: (r.status, r.node_state) for n, r in rows.items()} == {
                "vm-a": (InstanceStatus.STARTED, "down"),
                "vm-b": (InstanceStatus.STARTED, "offline"),
                "vm-c": (InstanceStatus.STARTED, None),
            }
            assert rows["vm-a"].node_state_since is not None
            monkeypatch.undo()  # the nodes are back: Ganeti reads the instances normally again
            report = await reconciler.run_once()
            assert report.clean, report.summary()
            assert all(i.node_state is None for i in await store.list_instances(backend=B))
            assert (await reconciler.run_once()).backends[0].settled == 3  # the fast path again
        changes = [c for c in await store.list_changes(after=start) if c.kind == "instance"]
        by_name = {rows[n].id: n for n in rows}
        assert [(by_name[c.key], c.status, c.node_state) for c in changes] == [
            ("vm-a", "STARTED", "down"),
            ("vm-b", "STARTED", "offline"),
            ("vm-a", "STARTED", None),
            ("vm-b", "STARTED", None),
        ]


async def test_an_instance_that_vanished_from_ganeti_says_so(db_url: str) -> None:
    async with world(db_url) as (fake, store, client, settings):
        cp = ControlPlane(settings, store=store, clients={B: client})
        async with cp, Reconciler(settings, store=store, clients={B: client}) as reconciler:
            await _started(fake, store, cp, client, "vm-lost")
            del fake.cluster.instances["vm-lost"]  # a cluster restored from an older backup
            start = await store.last_change_id()
            report = await reconciler.run_once(fixes={Fix.STALE})
            assert [(d.kind.value, d.fixed) for d in report.drifts] == [("stale", True)]
        lost = await store.get_instance(B, "vm-lost")
        assert lost is not None and lost.status is InstanceStatus.DESTROYED
        message = f"instance vm-lost vanished from backend {B}: Ganeti no longer has it"
        assert lost.last_error is not None
        assert (lost.last_error["action"], lost.last_error["message"]) == ("reconcile", message)
        changes = await store.list_changes(after=start)
        assert [(c.key, c.status, c.error) for c in changes] == [(lost.id, "DESTROYED", message)]
