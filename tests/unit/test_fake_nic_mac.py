"""The fake Ganeti honours a NIC's ``mac`` on create and on attach, as Ganeti does (``ComputeNics``,
``LUInstanceSetParams._PrepareNicModification``): the NIC gets that MAC, checked for form and for
use in the cluster; ``auto``/``generate`` make one (issue 28, item 6). With Synnefo's
``UpdateNetTest.test_changed_nic`` ported: a NIC attached with a given MAC is seen in the
instance's info."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import RapiClient
from synnefo_ganeti.reconcile import Reconciler
from synnefo_ganeti.store import InstanceStatus
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.testing._cluster import new_mac
from tests.helpers import fake_client, spec
from tests.unit.test_operations import plane, settled, started
from tests.unit.test_operations import spec as operations_spec

FAST = {"OP_INSTANCE_CREATE": 0.01, "OP_INSTANCE_SET_PARAMS": 0.01}
MAC = "aa:bb:cc:00:11:22"


@pytest.fixture
async def rapi() -> Any:
    async with FakeGaneti(tls=False, op_times=FAST) as fake, fake_client(fake) as client:
        yield fake, client


async def create(client: RapiClient, name: str, nics: list[dict[str, Any]]) -> Any:
    job_id = await client.create_instance(spec(name, pnode="node1.fake.test", nics=nics))
    return await client.wait_for_job(job_id)


async def add_nic(client: RapiClient, name: str, nic: dict[str, Any]) -> Any:
    job_id = await client.modify_instance(name, nics=[["add", -1, nic]])
    return await client.wait_for_job(job_id)


def failure(job: Any) -> list[Any]:
    assert job.status == "error", job
    kind, args = job.opresult[0]
    return [kind, *args]


async def test_a_create_gives_the_nic_its_mac(rapi: Any) -> None:
    _, client = rapi
    job = await create(client, "vm1.fake.test", [{"mac": MAC.upper()}, {"mac": "generate"}, {}])
    assert job.status == "success"
    macs = (await client.get_instance("vm1.fake.test")).nic_macs
    assert macs[0] == MAC  # lower-cased, as NormalizeAndValidateMac does
    assert len(set(macs)) == 3 and all(mac != MAC for mac in macs[1:])


async def test_an_attached_nic_gets_its_mac(rapi: Any) -> None:
    fake, client = rapi
    assert (await create(client, "vm1.fake.test", [{}])).status == "success"
    job = await add_nic(client, "vm1.fake.test", {"mac": MAC, "link": "br1"})
    assert job.status == "success"
    assert job.opresult[0][0] == ["nic.1", f"add:mac={MAC},ip=None,mode=bridged,link=br1,network=None"]
    assert (await client.get_instance("vm1.fake.test")).nic_macs[1] == MAC
    assert fake.cluster.instances["vm1.fake.test"].nics[1]["mac"] == MAC


async def test_a_mac_in_use_is_refused(rapi: Any) -> None:
    fake, client = rapi
    assert (await create(client, "vm1.fake.test", [{"mac": MAC}])).status == "success"
    refused = await create(client, "vm2.fake.test", [{"mac": MAC}])
    assert failure(refused) == [
        "OpPrereqError",
        f"MAC address {MAC} already in use in cluster",
        "resource_not_unique",
    ]
    assert "vm2.fake.test" not in fake.cluster.instances
    # two NICs of one create with one MAC
    twice = await create(
        client, "vm3.fake.test", [{"mac": "aa:bb:cc:00:11:33"}, {"mac": "AA:BB:CC:00:11:33"}]
    )
    assert failure(twice)[1] == "MAC address aa:bb:cc:00:11:33 already in use in cluster"
    # attaching: the MAC quoted, as _PrepareNicModification words it; the instance unchanged
    attach = await add_nic(client, "vm1.fake.test", {"mac": MAC})
    assert failure(attach) == [
        "OpPrereqError",
        f"MAC address '{MAC}' already in use in cluster",
        "resource_not_unique",
    ]
    assert len(fake.cluster.instances["vm1.fake.test"].nics) == 1


async def test_a_malformed_mac_is_refused(rapi: Any) -> None:
    _, client = rapi
    for bad in ("aa:bb:cc:00:11", "aa-bb-cc-00-11-22", "zz:bb:cc:00:11:22"):
        job = await create(client, "vm1.fake.test", [{"mac": bad}])
        assert failure(job) == ["OpPrereqError", f"Invalid MAC address '{bad}'", "wrong_input"]
    assert (await create(client, "vm1.fake.test", [{}])).status == "success"
    job = await add_nic(client, "vm1.fake.test", {"mac": None})
    assert failure(job) == ["OpPrereqError", "Cannot unset the NIC MAC address", "wrong_input"]


async def test_a_generated_mac_never_takes_one_given(rapi: Any) -> None:
    fake, client = rapi
    last = int(new_mac().replace(":", ""), 16)  # the generator's, so the next one is known
    following = f"{last + 1:012x}"
    upcoming = ":".join(following[i : i + 2] for i in range(0, 12, 2))
    assert (await create(client, "vm1.fake.test", [{"mac": upcoming}])).status == "success"
    assert (await create(client, "vm2.fake.test", [{"mac": "auto"}])).status == "success"
    generated = fake.cluster.instances["vm2.fake.test"].nics[0]["mac"]
    assert generated != upcoming


async def test_changed_nic(tmp_path: Path, db_url: str) -> None:
    """Synnefo's UpdateNetTest.test_changed_nic: a NIC attached with a given MAC is the instance's,
    in Ganeti's info and in what the store keeps of it."""
    async with plane(tmp_path, db_url) as (fake, cp):
        vm = await started(cp, operations_spec("vm1.fake.test"))
        await cp.attach_nic(vm.id, link="br1", mac=MAC)
        attached = await settled(cp, vm.id, InstanceStatus.STARTED)
        assert attached.last_error is None
        info = fake.cluster.instance_view("vm1.fake.test")
        assert info is not None and info["nic.macs"][1] == MAC
        assert attached.nics is not None and len(attached.nics) == 2
        assert attached.nics == [{}, {"mac": MAC, "link": "br1"}]  # what was asked, kept
        # and Ganeti has what was asked: the reconciler sees no NIC drift
        async with Reconciler(cp.settings, store=cp.store) as reconciler:
            report = await reconciler.run_once(fixes=[])
        assert [d for d in report.backends[0].drifts if d.kind.value == "nics"] == []
