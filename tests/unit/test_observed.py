"""What Ganeti made, stored: NICs, disks, memory, vCPUs, OS and node as Ganeti reports them,
after a create or modify ends (the dispatcher's observer) and on each reconcile pass."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import ControlPlane
from synnefo_ganeti.config import Settings
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.rapi import Instance
from synnefo_ganeti.reconcile import Reconciler
from synnefo_ganeti.reconcile._observe import observed_changes, observed_values
from synnefo_ganeti.store import InstanceStatus, RequestStatus, Store, StoredInstance, record_observed
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import RAPI_FIXTURES, eventually, fake_client, spec
from tests.unit.test_dispatcher import backend, fakes, finished, running, settings_for

MAC = re.compile(r"^aa:00:00(:[0-9a-f]{2}){3}$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def ganeti_values(fake: FakeGaneti, name: str) -> dict[str, Any]:
    """What the fake's Ganeti holds of ``name``, in the stored form."""
    inst = fake.cluster.instances[name]
    return {
        "nics": [
            {
                "mac": n["mac"],
                "ip": n.get("ip"),
                "network": n.get("network"),
                "mode": n["mode"],
                "link": n["link"],
            }
            for n in inst.nics
        ],
        "disks": [{"size": d["size"], "uuid": d["uuid"]} for d in inst.disks],
        "memory": inst.beparams["maxmem"],
        "vcpus": inst.beparams["vcpus"],
        "os": inst.os,
        "pnode": inst.pnode,
    }


def stored_values(instance: StoredInstance) -> dict[str, Any]:
    return {key: getattr(instance, key) for key in ("nics", "disks", "memory", "vcpus", "os", "pnode")}


async def holds(store: Store, backend_name: str, name: str, wanted: dict[str, Any]) -> StoredInstance | None:
    instance = await store.get_instance(backend_name, name)
    return instance if instance is not None and stored_values(instance) == wanted else None


def file_spec(name: str, *, mac: str | None = None, **kwargs: Any) -> Any:
    """A file instance with a NIC of a given MAC: its own for each name (Ganeti, and the fake,
    refuse a MAC in use: "MAC address ... already in use in cluster")."""
    if mac is None:
        mac = "AA:00:00:" + ":".join(f"{b:02X}" for b in hashlib.sha256(name.encode()).digest()[:3])
    return spec(
        name,
        disk_template="file",
        beparams={"memory": 512, "vcpus": 2},
        disks=[{"size": 1024}, {"size": 2048}],
        nics=[{}, {"mac": mac, "ip": "192.0.2.7"}],
        **kwargs,
    )


# -- from Ganeti's answers -----------------------------------------------------------------------------


def test_values_of_a_recorded_ganeti_answer() -> None:
    raw = json.loads((RAPI_FIXTURES / "instance_stopped_file.json").read_text())
    assert observed_values(Instance.model_validate(raw)) == {
        "nics": [
            {"mac": "aa:00:00:4a:2f:70", "ip": None, "network": None, "mode": "bridged", "link": "gntbr0"}
        ],
        "disks": [{"size": 1024, "uuid": "68c38100-ce3a-425b-a541-31b63f35a053"}],
        "memory": 256,
        "vcpus": 1,
        "os": "noop",
        "pnode": "node1.ganeti.test",
    }
    older = {**raw, "beparams": {"memory": 384, "vcpus": 2}}  # an answer with no maxmem
    values = observed_values(Instance.model_validate(older))
    assert (values["memory"], values["vcpus"]) == (384, 2)


async def test_the_fake_answers_nics_and_disks_as_ganeti_does() -> None:
    async with fakes(1) as (f1,), fake_client(f1) as client:
        job_id = await client.create_instance(file_spec("fid.example", mac="AA:00:00:12:34:56"))
        await client.wait_for_job(job_id, timeout=10)
        answer = await client.get_instance("fid.example")
    macs = answer.nic_macs
    assert MAC.match(macs[0]) and macs[1] == "aa:00:00:12:34:56", macs
    assert answer.nic_ips == [None, "192.0.2.7"] and answer.nic_modes == ["bridged", "bridged"]
    assert answer.disk_sizes == [1024, 2048] and all(UUID.match(str(u)) for u in answer.disk_uuids)
    assert answer.beparams["maxmem"] == 512 and answer.beparams["vcpus"] == 2


# -- the store -------------------------------------------------------------------------------------


async def test_only_changed_rows_newer_than_the_answer_are_written(db_url: str) -> None:
    async with Store(db_url) as store:
        await store.add_instance("b1", "a.example", nics=[{}], status=InstanceStatus.STARTED)
        await store.add_instance("b1", "gone.example", status=InstanceStatus.DESTROYED)
        await store.update_instance("b1", "a.example", state_time=100.0)
        values = {"nics": [], "disks": [], "memory": 128, "vcpus": 1, "os": "noop", "pnode": "n1"}
        seen = {"a.example": values, "gone.example": values, "unknown.example": values}
        assert await record_observed(store, "b1", seen, taken_at=50.0) == 0  # older than the last job end
        assert await record_observed(store, "b1", seen, taken_at=200.0) == 1
        assert await record_observed(store, "b1", seen, taken_at=300.0) == 0  # nothing differs now
        held = await store.get_instance("b1", "a.example")
        assert held is not None and stored_values(held) == values
        destroyed = await store.get_instance("b1", "gone.example")
        assert destroyed is not None and destroyed.memory is None  # DESTROYED rows are not touched
        assert observed_changes({"a.example": held}, {}) == {}


# -- after a create or modify ends -------------------------------------------------------------------


async def test_a_request_created_by_the_dispatcher_holds_ganetis_values(db_url: str) -> None:
    async with fakes(1) as (f1,):  # no queue_dir: the dispatcher follows its jobs through RAPI
        settings = settings_for(db_url, [backend("f1", f1)])
        async with (
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
            rid = await cp.request_instance(file_spec("req.example"))
            request = await finished(cp, rid)
            assert request.status is RequestStatus.SUCCEEDED, request.error
            wanted = ganeti_values(f1, "req.example")
            instance = await eventually(
                lambda: holds(store, "f1", "req.example", wanted), what="Ganeti's values stored"
            )
            assert d.observer is not None and "stored" in repr(d.observer)
    assert instance.nics is not None and instance.nics[0] != {}
    assert MAC.match(instance.nics[0]["mac"]) and instance.nics[1]["ip"] == "192.0.2.7"
    assert instance.disks is not None and [disk["size"] for disk in instance.disks] == [1024, 2048]
    assert (instance.memory, instance.vcpus, instance.os) == (512, 2, "noop")
    assert instance.pnode in f1.cluster.nodes


async def test_create_and_modify_through_the_control_plane_store_ganetis_values(
    db_url: str, tmp_path: Path
) -> None:
    queue = tmp_path / "queue"
    async with fakes(1, queue_dir=queue) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1, queue_dir=str(queue))])
        async with (
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)),
        ):
            await cp.create_instance(file_spec("cp.example"), backend="f1")
            await eventually(
                lambda: (
                    f1.cluster.instances.get("cp.example") is not None
                    and f1.cluster.instances["cp.example"].oper_state
                ),
                what="the create to end in Ganeti",
            )
            created = await eventually(
                lambda: holds(store, "f1", "cp.example", ganeti_values(f1, "cp.example")),
                what="Ganeti's values after the create",
            )
            assert created.memory == 512 and created.status is InstanceStatus.STARTED
            await cp.modify_instance("cp.example", backend="f1", beparams={"memory": 1024})
            modified = await eventually(
                lambda: holds(store, "f1", "cp.example", ganeti_values(f1, "cp.example") | {"memory": 1024}),
                what="the memory after the modify",
            )
    assert modified.memory == 1024 and modified.nics == created.nics and modified.disks == created.disks


# -- on each reconcile pass ----------------------------------------------------------------------------


async def test_a_reconcile_pass_stores_what_changed_behind_our_back(db_url: str) -> None:
    async with fakes(1, nodes=2) as (f1,):
        settings = Settings(database={"url": db_url}, backends=[backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            await cp.create_instance(file_spec("rec.example"), backend="f1")
            await eventually(
                lambda: (
                    "rec.example" in f1.cluster.instances and f1.cluster.instances["rec.example"].oper_state
                ),
                what="the create to end in Ganeti",
            )
            async with Reconciler(settings, store=store) as reconciler:
                first = await reconciler.run_once()
                assert first.ok and first.backends[0].observed == 1
                assert await holds(store, "f1", "rec.example", ganeti_values(f1, "rec.example"))

                inst = f1.cluster.instances["rec.example"]  # an operator's changes, not ours
                inst.beparams.update(maxmem=2048, memory=2048, vcpus=4)
                inst.nics[0]["ip"] = "198.51.100.9"
                inst.disks[0]["size"] = 4096
                inst.pnode = next(node for node in f1.cluster.nodes if node != inst.pnode)
                second = await reconciler.run_once()
                assert second.ok and second.backends[0].observed == 1
                held = await holds(store, "f1", "rec.example", ganeti_values(f1, "rec.example"))
                assert held is not None and (held.memory, held.vcpus) == (2048, 4)
                assert held.nics is not None and held.nics[0]["ip"] == "198.51.100.9"

                third = await reconciler.run_once()
                assert third.ok and third.backends[0].observed == 0  # unchanged rows are not written


@pytest.mark.parametrize("version", ["3.0", "3.1"])
async def test_the_observer_asks_a_backend_once_per_pass_however_many_are_due(
    db_url: str, version: str
) -> None:
    """Ten instances due: one ``PUT /2/query/instance`` naming them (not ten GETs, nor a listing
    of every instance); one removed from Ganeti meanwhile is counted missed; values stored. On
    Ganeti 3.1 too, whose POSIX patterns refuse a ``(?:`` group (the 3.1 lab: 502)."""
    from synnefo_ganeti.dispatch._observe import Observer

    async with fakes(1, version=version) as (f1,), fake_client(f1) as client, Store(db_url) as store:
        names = [f"obs{i}.example" for i in range(10)]
        for name in [*names, "other.example"]:
            await client.wait_for_job(await client.create_instance(file_spec(name)), timeout=20)
            await store.add_instance("f1", name, status=InstanceStatus.STARTED)
        await client.wait_for_job(await client.delete_instance(names[-1]), timeout=20)
        asked: list[tuple[str, str, Any]] = []
        transport_request = client._transport.request

        async def spy(method: str, path: str, **kwargs: Any) -> Any:
            asked.append((method, path, kwargs.get("body")))
            return await transport_request(method, path, **kwargs)

        client._transport.request = spy  # type: ignore[method-assign]

        async def the_client(_name: str) -> Any:
            return client

        observer = Observer(store, the_client)
        observer.observe("f1", names)
        assert await observer.run_once() == 9
        assert [(method, path) for method, path, _ in asked] == [("PUT", "/2/query/instance")]
        # a regex, not "=" on each name: Ganeti fails the whole query on a name it lacks
        # (the tenth, never created here: it is "missed", the nine others stored)
        pattern = "^(" + "|".join(re.escape(name) for name in sorted(names)) + ")$"
        assert asked[0][2]["qfilter"] == ["=~", "name", pattern]
        assert (observer.stored, observer.missed) == (9, 1)
        for name in names[:-1]:
            assert await holds(store, "f1", name, ganeti_values(f1, name)) is not None
        other = await store.get_instance("f1", "other.example")
        assert other is not None and other.memory is None  # not due: not asked, not written
