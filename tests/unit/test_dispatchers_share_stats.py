"""Several dispatchers on one PostgreSQL database read each backend's whole node stats and its
health once (issue 31 item 2): the holder of its follow lease reads Ganeti and stores them; the
others take what it stored while fresh, and read Ganeti themselves once it is not."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

from synnefo_ganeti import ControlPlane, RapiClient
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.dispatch._liveness import DispatcherLock
from synnefo_ganeti.dispatch._stats import NodeStats
from synnefo_ganeti.rapi import ClusterInfo, Network, Node
from synnefo_ganeti.store import RequestStatus, Store
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import fakes, finished, running
from tests.unit.test_dispatchers_share import holders, options

#: the RAPI calls of a whole node stats read (``/2/networks`` is read by nothing else here) and
#: of a health probe (``/version``)
COUNTED = ("list_networks", "list_nodes", "info", "version")


def counting_client(fake: FakeGaneti, calls: Counter[str]) -> RapiClient:
    """A client of ``fake`` that counts the calls of :data:`COUNTED` in ``calls``."""
    client = RapiClient(fake.url, username=fake.username, password=fake.password)
    for method in COUNTED:
        call = getattr(client, method)

        async def counted(*args: Any, _call: Any = call, _method: str = method, **kwargs: Any) -> Any:
            calls[_method] += 1
            return await _call(*args, **kwargs)

        setattr(client, method, counted)
    return client


def shared_options(pg_url: str, fake: FakeGaneti, **dispatcher: Any) -> Any:
    settings = options(pg_url, fake)
    # intervals long enough that the holder's next read always comes before the stored ones are
    # 2 x old, on a loaded machine too: its stats come every interval plus up to 1 s (the stats
    # loop's tick) plus the read and the store's write. CI saw 0.5 s health rounds and 2 s stats
    # rounds late by more than that slack: the other dispatcher then rightly read Ganeti itself
    update = {"stats_interval": 4.0, "health_interval": 2.0} | dispatcher
    return settings.model_copy(update={"dispatcher": settings.dispatcher.model_copy(update=update)})


def test_node_stats_go_to_json_and_back() -> None:
    stats = NodeStats(
        nodes=[Node.model_validate({"name": "n1", "mfree": 512, "group.uuid": "g1", "extra": [1]})],
        info=ClusterInfo(name="c", enabled_disk_templates=["plain"], ipolicy={"std": {"memory-size": 128}}),
        oses=frozenset({"noop", "debootstrap"}),
        networks=[Network(name="net1", network="10.0.0.0/24")],
    )
    assert NodeStats.from_json(stats.to_json()) == stats
    bare = NodeStats(nodes=[], info=ClusterInfo(name="c"), oses=None, networks=None)
    assert NodeStats.from_json(bare.to_json()) == bare


async def test_the_lease_holder_reads_stats_and_health_and_the_other_takes_them(pg_url: str) -> None:
    async with fakes(1, nodes=3) as (fake,):
        settings = shared_options(pg_url, fake)
        calls = {"one": Counter[str](), "two": Counter[str]()}
        clients = {d: counting_client(fake, calls[d]) for d in calls}
        async with (
            clients["one"],
            clients["two"],
            Store(pg_url) as store,
            ControlPlane(settings, store=store) as cp,
        ):
            d1 = Dispatcher(
                settings, dispatcher_id="one", status_server=False, clients={"f1": clients["one"]}
            )
            d2 = Dispatcher(
                settings, dispatcher_id="two", status_server=False, clients={"f1": clients["two"]}
            )
            async with running(d1), running(d2):
                held = await eventually(lambda: holders(d1, d2).get("f1"), what="the lease taken", timeout=20)
                holder, other = (d1, d2) if held == ["one"] else (d2, d1)
                # from the holder's first stored stats on ...
                await eventually(lambda: store.backend_stats("f1"), what="stats stored")
                for counter in calls.values():
                    counter.clear()
                # ... a node made full in Ganeti is full in the other's view, read by the holder
                full = sorted(fake.cluster.nodes)[0]
                node = fake.cluster.nodes[full]
                node.mtotal = node.mnode
                await eventually(
                    lambda: {n.name: n.mfree for n in other.allocator.view("f1").nodes}.get(full) == 0,
                    what="the full node in the other dispatcher's stats",
                    timeout=40,
                )
                # a few stats intervals: the holder reads the stats and probes, the other neither
                await eventually(
                    lambda: calls[holder.id]["list_networks"] >= 3 and calls[holder.id]["version"] >= 3,
                    what="the holder's reads",
                    timeout=60,
                )
                assert calls[other.id]["list_networks"] == 0, calls
                assert calls[other.id]["version"] == 0 and calls[other.id]["info"] == 0, calls
                assert other.health is not None and other.health.tracker.is_up("f1")
                # both place creates; none goes to the full node
                ids = [await cp.request_instance(spec(f"s{i}.example", memory=128)) for i in range(6)]
                done = [await finished(cp, rid, timeout=30) for rid in ids]
                assert all(r.status is RequestStatus.SUCCEEDED for r in done), [r.error for r in done]
                pnodes = {fake.cluster.instances[f"s{i}.example"].pnode for i in range(6)}
                assert full not in pnodes, pnodes
                assert calls[other.id]["list_networks"] == 0, calls


async def test_stale_stored_stats_and_health_are_read_from_ganeti(pg_url: str) -> None:
    async with fakes(1) as (fake,):
        settings = shared_options(pg_url, fake)
        calls: Counter[str] = Counter()
        async with counting_client(fake, calls) as client, Store(pg_url) as store:
            # the lease held by a holder that reads nothing (a stuck one): its stats and its
            # verdict stored long ago
            ghost = DispatcherLock(store, "ghost")
            await ghost.acquire()
            assert await ghost.try_lease("f1")
            old = datetime.now(UTC) - timedelta(minutes=5)
            stale = NodeStats(nodes=[], info=ClusterInfo(name="gone"), oses=None, networks=None)
            await store.set_backend_stats("f1", stale.to_json(), read_at=old)
            await store.set_backend_health("f1", False, detail="long ago")
            await store.call(
                lambda conn: conn.execute(
                    text("UPDATE backends SET health_at = :at WHERE name = 'f1'"), {"at": old}
                )
            )
            d = Dispatcher(settings, dispatcher_id="solo", status_server=False, clients={"f1": client})
            try:
                async with running(d):
                    # its own reads of Ganeti, every stats interval, not the stale stats
                    await eventually(lambda: calls["list_networks"] >= 2, what="stats read here", timeout=40)
                    assert d.leases is not None and not d.leases.holds("f1")
                    assert len(d.allocator.view("f1").nodes) == len(fake.cluster.nodes)
                    # and its own probes, not the stale verdict
                    await eventually(lambda: calls["version"] >= 2, what="probes of its own")
                    assert d.health is not None and d.health.tracker.is_up("f1")
                    found = await store.backend_stats("f1")  # a fallback read stores nothing
                    assert found is not None and found[1] == old
            finally:
                await ghost.release()
