"""What the reconciler reads (issue 15 part 4): Ganeti's compared fields by ``/2/query/instance``,
the database's compared columns by one select; the fast path (``QueriedInstance.settles``) finds
exactly what the full comparison finds; the fake answers the query as Ganeti 3.0 does."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from synnefo_ganeti import RapiClient
from synnefo_ganeti.errors import RapiError
from synnefo_ganeti.rapi import Instance
from synnefo_ganeti.reconcile import DbSnapshot, GanetiSnapshot, plan
from synnefo_ganeti.reconcile._fetch import INSTANCE_FIELDS, QueriedInstance, query_instances, read_db
from synnefo_ganeti.reconcile._observe import observed_changes, observed_values
from synnefo_ganeti.store import InstanceStatus, Store, StoredInstance
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.testing._cluster import FakeInstance, instance_view
from synnefo_ganeti.testing._query import _INSTANCE_FIELDS

B = "athens"
NS = "synnefo-ganeti:"
ROOT = Path(__file__).parents[2]
LONG_AGO = datetime.now(UTC) - timedelta(hours=1)


def fake_instance(**changes: Any) -> FakeInstance:
    values: dict[str, Any] = {
        "name": "vm1", "pnode": "node1.fake.test", "os": "noop", "disk_template": "file", "hypervisor": "fake",
        "beparams": {"maxmem": 512, "minmem": 512, "vcpus": 1, "auto_balance": True, "always_failover": False,
                     "spindle_use": 1, "memory": 512},
        "custom_beparams": {"maxmem": 512, "minmem": 512},
        "nics": [{"mac": "aa:00:00:00:00:01", "uuid": "n1", "mode": "bridged", "link": "gntbr0", "ip": None}],
        "disks": [{"size": 1024, "uuid": "d1"}],
        "tags": [f"{NS}owned", "ops:backup"],
    } | changes  # fmt: skip
    return FakeInstance(**values)


def queried(inst: FakeInstance, link: str = "gntbr0") -> QueriedInstance:
    """What the reconciler makes of the fake's answer to its query."""
    return QueriedInstance([_INSTANCE_FIELDS[name](inst, link) for name in INSTANCE_FIELDS])


def bulk(inst: FakeInstance, link: str = "gntbr0") -> Instance:
    """What the reconciler made of ``GET /2/instances?bulk=1`` before."""
    return Instance.model_validate(instance_view(inst, link))


def stored(
    inst: FakeInstance, status: InstanceStatus = InstanceStatus.STARTED, **changes: Any
) -> StoredInstance:
    """The row of ``inst`` after the dispatcher's observer recorded what Ganeti made."""
    values = observed_values(bulk(inst)) | {
        "beparams": {"maxmem": 512, "minmem": 512, "vcpus": 1},
        "tags": [f"{NS}owned"],
    }  # fmt: skip
    return StoredInstance(
        id="id", backend=B, name=inst.name, status=status, owned=True, disk_template=inst.disk_template,
        create_job_id=None, state_time=None, created_at=LONG_AGO, updated_at=LONG_AGO, **(values | changes),
    )  # fmt: skip


def outcome(row: StoredInstance, instance: Any) -> tuple[list[tuple[str, str, dict[str, Any]]], Any]:
    """The plan's drifts and what a pass would record, for one row and Ganeti's instance."""
    db = DbSnapshot(B, {row.name: row}, {}, taken_at=0.0)
    gnt = GanetiSnapshot(B, {instance.name: instance}, {}, {}, frozenset({instance.name}), 1.0, NS)
    drifts = [(d.kind.value, d.detail, d.values) for d in plan(db, gnt)]
    return drifts, observed_changes(db.instances, gnt.instances)


# -- the fast path finds what the full comparison finds --------------------------------------------

Case = tuple[str, Callable[[FakeInstance], None], dict[str, Any]]
CASES: list[Case] = [
    ("clean", lambda i: None, {}),
    ("stopped in Ganeti", lambda i: setattr(i, "admin_state", "down"), {}),
    ("not running", lambda i: setattr(i, "oper_state", False), {}),
    ("node unreachable", lambda i: setattr(i, "oper_state", None), {}),
    ("stopped row", lambda i: None, {"status": InstanceStatus.STOPPED}),
    ("error row", lambda i: None, {"status": InstanceStatus.ERROR}),
    ("maxmem", lambda i: i.beparams.update(maxmem=1024), {}),
    ("vcpus", lambda i: i.beparams.update(vcpus=2), {}),
    ("minmem only", lambda i: i.beparams.update(minmem=256), {}),
    ("beparam not compared", lambda i: i.beparams.update(spindle_use=2), {}),
    ("beparam Ganeti lacks", lambda i: i.beparams.pop("vcpus"), {}),
    ("expects an odd key", lambda i: None, {"beparams": {"nosuch": 1}}),
    ("link", lambda i: i.nics[0].update(link="gntbr1"), {}),
    ("mac", lambda i: i.nics[0].update(mac="aa:00:00:00:00:02"), {}),
    ("ip", lambda i: i.nics[0].update(ip="10.0.0.2"), {}),
    ("network", lambda i: i.nics[0].update(network="net1", network_uuid="u1"), {}),
    ("second nic", lambda i: i.nics.append({"mac": "aa:00:00:00:00:03", "uuid": "n2"}), {}),
    ("no nic", lambda i: i.nics.clear(), {}),
    ("expected nics as asked", lambda i: None, {"nics": [{"mode": "bridged", "link": "gntbr0"}]}),
    ("nic with a name", lambda i: None, {"nics": [{"mac": "aa:00:00:00:00:01", "name": "eth0"}]}),
    ("no nics stored", lambda i: None, {"nics": None}),
    ("disk size", lambda i: i.disks[0].update(size=2048), {}),
    ("disk uuid", lambda i: i.disks[0].update(uuid="d2"), {}),
    ("second disk", lambda i: i.disks.append({"size": 10, "uuid": "d3"}), {}),
    ("disks as asked", lambda i: None, {"disks": [{"size": 1024}]}),
    ("our tag added", lambda i: i.tags.append(f"{NS}extra"), {}),
    ("their tag removed", lambda i: i.tags.remove("ops:backup"), {}),
    ("our tag removed", lambda i: i.tags.remove(f"{NS}owned"), {}),
    ("no tags stored", lambda i: None, {"tags": None}),
    ("os", lambda i: setattr(i, "os", "debian"), {}),
    ("pnode", lambda i: setattr(i, "pnode", "node2.fake.test"), {}),
    ("memory not stored", lambda i: None, {"memory": None, "vcpus": None, "pnode": None}),
]


@pytest.mark.parametrize(("change", "row_changes"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_the_query_path_finds_what_the_bulk_path_finds(
    change: Callable[[FakeInstance], None], row_changes: dict[str, Any]
) -> None:
    inst = fake_instance()
    row = stored(inst, **row_changes)
    change(inst)
    assert outcome(row, queried(inst)) == outcome(row, bulk(inst))


def test_a_settled_instance_is_checked_once() -> None:
    inst = fake_instance()
    row, seen = stored(inst), queried(inst)
    assert seen.settles(row, NS) and seen.settles(row, NS, tags=False)
    inst.os = "debian"  # the values it settled with are its own: a new answer is a new object
    assert not queried(inst).settles(row, NS)
    assert repr(seen) == "<QueriedInstance vm1 running>"


# -- the fake answers the fields as Ganeti 3.0 -----------------------------------------------------


def test_every_field_asked_for_is_a_ganeti_3_0_instance_field() -> None:
    recorded = json.loads((ROOT / "synnefo_ganeti/testing/data/query_fields.json").read_text())
    known = {field["name"] for field in recorded["instance"]}  # GET /2/query/instance/fields, Ganeti 3.0.2
    assert set(INSTANCE_FIELDS) <= known
    assert {"name", "admin_state", "oper_state", "tags"} <= set(INSTANCE_FIELDS)


@pytest.mark.parametrize(
    "inst",
    [
        fake_instance(),
        fake_instance(admin_state="down", oper_state=False, tags=[]),
        fake_instance(oper_state=True, admin_state="down"),
        fake_instance(
            nics=[{"mac": "m", "uuid": "u", "network": "net", "network_uuid": "nu", "ip": "10.0.0.1"}]
        ),
        fake_instance(disks=[], nics=[]),
    ],
    ids=["running", "stopped", "error-up", "network", "bare"],
)
def test_the_fakes_query_values_are_its_bulk_views(inst: FakeInstance) -> None:
    view = instance_view(inst, "gntbr0")
    for name, get in _INSTANCE_FIELDS.items():
        if name in view and name != "beparams":
            assert get(inst, "gntbr0") == view[name], name
    # the filled parameters without the memory only GET /2/instances adds (rlib2._UpdateBeparams)
    assert _INSTANCE_FIELDS["beparams"](inst, "gntbr0") == {
        k: v for k, v in view["beparams"].items() if k != "memory"
    }
    assert _INSTANCE_FIELDS["be/maxmem"](inst, "gntbr0") == 512
    assert _INSTANCE_FIELDS["be/memory"](inst, "gntbr0") is None  # query._GetInstBeParam: not filled


async def test_the_reconciler_reads_the_query_not_the_bulk_listing() -> None:
    async with FakeGaneti(tls=False) as fake:
        fake.cluster.instances["vm1"] = fake_instance()
        fake.cluster.instances["vm2"] = fake_instance(name="vm2", admin_state="down", oper_state=False)
        async with RapiClient(fake.url, username=fake.username, password=fake.password) as client:
            found = await query_instances(client)
            rows = await client.query_rows("instance", ["name", "nosuch", "be/maxmem"])
            filtered = await client.query_rows("instance", ["name"], qfilter=["=", "admin_state", "down"])
            raw = await client.query("instance", list(INSTANCE_FIELDS))
    assert sorted(found) == ["vm1", "vm2"]
    assert found["vm2"].admin_state == "down" and found["vm2"].oper_state is False
    assert found["vm1"].beparams == {"maxmem": 512, "minmem": 512, "vcpus": 1, "auto_balance": True,
                                     "always_failover": False, "spindle_use": 1}  # fmt: skip
    assert found["vm1"].nic_links == ["gntbr0"] and found["vm1"].disk_uuids == ["d1"]
    assert rows == [["vm1", None, 512], ["vm2", None, 512]]  # an unknown field: RS_UNKNOWN, None
    assert filtered == [["vm2"]]
    assert all(status == 0 for row in raw.data for status, _ in row)  # every field known to the fake


@pytest.mark.parametrize("data", [[[1, 2]], [[[0, "vm1"], [0, 1]]], None, [[[0, "vm1", 3]]]])
async def test_an_answer_of_another_shape_is_a_rapi_error(data: Any) -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.json_response({"fields": [], "data": data})

    app = web.Application()
    app.router.add_put("/2/query/instance", answer)
    async with (
        TestServer(app) as server,
        RapiClient(str(server.make_url("")).rstrip("/"), username="u", password="p") as client,
    ):
        with pytest.raises(RapiError, match="unexpected shape"):
            await client.query_rows("instance", ["name"])


# -- the database's side ---------------------------------------------------------------------------


async def test_the_snapshot_reads_a_names_current_row(db_url: str) -> None:
    async with Store(db_url) as store:
        for name, status in [("vm1", "DESTROYED"), ("vm1", "STARTED"), ("vm2", "DESTROYED"),
                             ("vm2", "DESTROYED"), ("vm3", "BUILD")]:  # fmt: skip
            await store.add_instance(
                B, name, status=InstanceStatus(status), beparams={"maxmem": 512}, nics=[{"link": "br"}],
                disks=[{"size": 1}], tags=[f"{NS}owned", name],
            )  # fmt: skip
        rows, taken_at = await read_db(store, B)
        listed = {row.name: row for row in reversed(await store.list_instances(backend=B))}
    assert taken_at > 0 and sorted(rows) == ["vm1", "vm2", "vm3"]
    for name, row in rows.items():
        full = listed[name]  # the store's own choice of a name's current row
        assert (row.status, row.owned, row.beparams, row.nics, row.disks, row.tags) == (
            full.status, full.owned, full.beparams, full.nics, full.disks, full.tags,
        )  # fmt: skip
    assert rows["vm1"].status is InstanceStatus.STARTED and rows["vm1"].updated_at is None
    assert rows["vm3"].updated_at == listed["vm3"].updated_at  # only BUILD rows' age counts
    assert repr(rows["vm3"]) == f"<SnapshotRow {B}/vm3 BUILD>"


async def test_the_live_rows_alone_then_the_destroyed_ones_asked_for(db_url: str) -> None:
    """The reconciler reads the live rows by the partial index, and DESTROYED rows only of the
    names Ganeti has and the live rows lack (the orphans' candidates)."""
    async with Store(db_url) as store:
        for name, status in [
            ("vm1", "DESTROYED"),
            ("vm1", "STARTED"),
            ("vm2", "DESTROYED"),
            ("vm3", "DESTROYED"),
        ]:
            await store.add_instance(B, name, status=InstanceStatus(status))
        live, _ = await read_db(store, B, destroyed=False)
        asked, _ = await read_db(store, B, live=False, destroyed=["vm2", "nosuch"])
        everything, _ = await read_db(store, B)
    assert {name: row.status for name, row in live.items()} == {"vm1": InstanceStatus.STARTED}
    assert {name: row.status for name, row in asked.items()} == {"vm2": InstanceStatus.DESTROYED}
    assert sorted(everything) == ["vm1", "vm2", "vm3"] and everything["vm1"].status is InstanceStatus.STARTED
