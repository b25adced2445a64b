"""Create specs checked before they are accepted (issue 14 part 3): ``ValidationError`` at once,
nothing written; placement only where the OS, template and policy fit; a create refused by its
backend for a reason of that backend placed again on another."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import ControlPlane, GanetiError, InvalidError, ValidationError
from synnefo_ganeti.allocate import Catalog, check_name, check_spec
from synnefo_ganeti.control._validate import Catalogs
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.rapi import ClusterInfo, InstanceSpec, Node
from synnefo_ganeti.store import InstanceStatus, RequestStatus, Store
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import closed_port, eventually, fake_client, spec
from tests.unit.test_dispatcher import backend, fakes, finished, running, settings_for

PB_MIB = 1024**3  # 1 PB in MiB


async def assert_refused(cp: ControlPlane, store: Store, bad: InstanceSpec, field: str, *words: str) -> str:
    """Both entry points refuse ``bad`` at once with ``field`` named; nothing is written."""
    for call in (
        lambda: cp.request_instance(bad),
        lambda: cp.request_instance(bad, request_id="same-id"),
        lambda: cp.create_instance(bad, backend="f1"),
    ):
        with pytest.raises(ValidationError) as caught:
            await call()
        assert caught.value.field == field, caught.value
        message = str(caught.value)
        assert message.startswith(field) or f"change {field}" in message, message
        for word in words:
            assert word in message, message
    assert await store.list_requests() == []
    assert await store.list_instances() == []
    return message


# -- the checks, one field each --------------------------------------------------------------------


async def test_each_refusal_names_its_field_and_writes_nothing(db_url: str) -> None:
    async with fakes(1, nodes=2, node_memory=16384, oses=("noop", "debootstrap+default")) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            await assert_refused(cp, store, spec("bad_name!"), "name", "bad_name!", "DNS hostname")
            await assert_refused(cp, store, spec("-dash.example"), "name")
            await assert_refused(cp, store, spec("x" * 64 + ".example"), "name")
            await assert_refused(cp, store, spec(memory=-512), "beparams.memory", "positive integer")
            await assert_refused(cp, store, spec(memory=0), "beparams.memory")
            await assert_refused(cp, store, spec(vcpus=-1), "beparams.vcpus")
            await assert_refused(cp, store, spec(vcpus=64), "beparams.vcpus", "no backend admits", "8")
            await assert_refused(cp, store, spec(memory=64), "beparams.memory", "smallest", "128 MiB")
            # fits the policy (up to 32768) but no node of 16384 MiB (1024 of them its own), even empty
            await assert_refused(
                cp, store, spec(memory=20000), "beparams.memory", "the largest that can fit is 15360 MiB"
            )
            await assert_refused(
                cp, store, spec(os="debian"), "os", "debian", "offered: debootstrap+default, noop"
            )
            await assert_refused(
                cp, store, spec(disk_template="drbd"), "disk_template", "enabled: diskless, file"
            )
            big_disk = spec(disk_template="file", disks=[{"size": 2048}, {"size": 4 * 1024 * 1024}])
            await assert_refused(cp, store, big_disk, "disks[1].size", "1048576 MiB")
            await assert_refused(
                cp, store, spec(disk_template="file", disks=[{"size": "1G"}]), "disks[0].size"
            )
            # the same checks alone: cp.validate writes nothing, either way
            with pytest.raises(ValidationError) as refused:
                await cp.validate(spec(memory=-512))
            assert refused.value.field == "beparams.memory"
            await cp.validate(spec("ok.example", os="debootstrap+default"))
            assert await cp.list_requests() == []
            # what is accepted still is
            rid = await cp.request_instance(spec("ok.example", os="debootstrap+default"))
            assert (await cp.get_request(rid)).status is RequestStatus.PENDING


async def test_a_petabyte_of_memory_is_refused_at_once(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    async with fakes(2) as (f1, f2):
        settings = settings_for(db_url, [backend("f1", f1), backend("f2", f2)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            started = time.monotonic()
            with pytest.raises(ValidationError) as caught:
                await cp.request_instance(spec("huge.example", memory=PB_MIB))
            assert time.monotonic() - started < 5.0  # not the placement timeout (600 s)
            error = caught.value
            assert (
                isinstance(error, InvalidError)
                and isinstance(error, GanetiError)
                and isinstance(error, ValueError)
            )
            assert error.field == "beparams.memory"
            assert str(error).startswith(f"beparams.memory {PB_MIB} MiB: no backend admits it")
            assert "the largest 32768 MiB (backend f1's instance policy)" in str(error)
            assert await store.list_requests() == []


async def test_a_spec_no_single_backend_takes_names_a_field(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    async with (
        fakes(1, oses=("noop",)) as (f1,),
        fakes(1, oses=("debian",), ipolicy={"memory-size": (128, 1024)}) as (f2,),
    ):
        settings = settings_for(db_url, [backend("f1", f1), backend("f2", f2)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            # debian only on f2, 4096 MiB only on f1
            with pytest.raises(ValidationError) as caught:
                await cp.request_instance(spec("mix.example", os="debian", memory=4096))
            assert caught.value.field in ("os", "beparams.memory")
            assert "f1: OS debian not offered" in str(caught.value)
            assert "f2: memory-size value 4096 is not in range [128, 1024]" in str(caught.value)
            # pinned to f2, the OS f2 offers but not its memory
            with pytest.raises(ValidationError) as caught:
                await cp.request_instance(spec("mix.example", os="debian", memory=4096), backend="f2")
            assert caught.value.field == "beparams.memory" and "1024 MiB" in str(caught.value)
            assert await store.list_requests() == []
            await cp.request_instance(spec("fits.example", os="debian", memory=512))


async def test_an_unreachable_backend_is_skipped_not_a_reason_to_refuse(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    async with fakes(1) as (f1,):
        dead = {"name": "dead", "url": f"http://127.0.0.1:{closed_port()}", "username": "u", "password": "p"}
        settings = settings_for(db_url, [dead, backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            await cp.request_instance(spec("ok.example"))
            await cp.request_instance(spec("pinned.example"), backend="dead")  # nothing known: no check
            with pytest.raises(ValidationError, match="no-such-os"):
                await cp.request_instance(spec("bad.example", os="no-such-os"))
            assert sorted(r.instance for r in await store.list_requests()) == ["ok.example", "pinned.example"]


async def test_catalogs_are_fetched_again_after_their_interval(tmp_path: Path) -> None:
    async with fakes(1) as (f1,):
        settings = settings_for(f"sqlite:///{tmp_path / 's.db'}", [backend("f1", f1)])
        async with ControlPlane(settings) as cp:
            catalogs = Catalogs(cp.client, interval=0.2)
            (first,) = await catalogs.get(["f1"])
            assert first.oses == frozenset({"noop"}) and first.largest_memory == 32768
            f1.cluster.oses.add("debian+default")
            assert (await catalogs.get(["f1"]))[0].oses == frozenset({"noop"})  # cached

            async def knows_debian() -> bool:
                return "debian+default" in ((await catalogs.get(["f1"]))[0].oses or ())

            await eventually(knows_debian, what="the OS added")


def test_names_as_ganeti_takes_them() -> None:
    for good in ("vm1", "vm-1.example.org", "a" * 63 + ".example", "VM1.Example.", "1.2.example"):
        check_name(good)
    for bad in (
        "",
        "bad name!",
        "-vm.example",
        "vm-.example",
        "vm..example",
        "a" * 64,
        "vm_1.example",
        "x" * 256,
    ):
        with pytest.raises(ValidationError) as caught:
            check_name(bad)
        assert caught.value.field == "name"


def test_check_spec_follows_ganetis_policy_rules() -> None:
    info: dict[str, Any] = {
        "name": "c",
        "enabled_disk_templates": ["diskless", "file", "drbd"],
        "ipolicy": {
            "minmax": [
                {"min": {"memory-size": 128, "cpu-count": 1, "disk-size": 1024, "disk-count": 1, "nic-count": 1},
                 "max": {"memory-size": 4096, "cpu-count": 4, "disk-size": 10240, "disk-count": 2, "nic-count": 2}},
                {"min": {"memory-size": 8192, "cpu-count": 8, "disk-size": 1024, "disk-count": 1, "nic-count": 1},
                 "max": {"memory-size": 65536, "cpu-count": 32, "disk-size": 10240, "disk-count": 2, "nic-count": 2}},
            ],
            "disk-templates": ["diskless", "file"],
        },
    }  # fmt: skip
    nodes = [Node(name="n1", mtotal=131072, dtotal=20480), Node(name="n2", mtotal=262144, offline=True)]
    catalog = Catalog.of("b1", ClusterInfo.model_validate(info), nodes, ["noop"])
    assert catalog.largest_memory == 131072  # the offline node does not count
    check_spec(spec(memory=2048, vcpus=2), [catalog])  # the first pair
    check_spec(spec(memory=16384, vcpus=16), [catalog])  # the second pair
    with pytest.raises(ValidationError) as caught:  # each value fits a pair, not both the same
        check_spec(spec(memory=2048, vcpus=16), [catalog])
    assert caught.value.field == "beparams.memory" or caught.value.field == "beparams.vcpus"
    check_spec(spec(disk_template="diskless", disks=[]), [catalog])  # diskless: no disk checks
    with pytest.raises(ValidationError) as caught:
        check_spec(spec(disk_template="file", disks=[]), [catalog])  # disk-count 0 < 1
    assert caught.value.field == "disks"
    with pytest.raises(ValidationError) as caught:  # enabled, but not in the policy's templates
        check_spec(spec(disk_template="drbd", disks=[{"size": 2048}]), [catalog])
    assert caught.value.field == "disk_template"
    with pytest.raises(ValidationError) as caught:  # each disk fits, not their sum on one node
        check_spec(spec(disk_template="file", disks=[{"size": 10240}, {"size": 10241}]), [catalog])
    assert caught.value.field in ("disks", "disks[1].size")
    check_spec(spec(memory=PB_MIB), [])  # nothing known: nothing refused


# -- placement -----------------------------------------------------------------------------------


async def test_an_os_only_one_backend_offers_is_placed_there(db_url: str) -> None:
    async with (
        fakes(1, nodes=4, oses=("noop",)) as (f1,),
        fakes(1, nodes=1, oses=("noop", "debian+default")) as (f2,),
    ):
        settings = settings_for(db_url, [backend("f1", f1), backend("f2", f2)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store, status_server=False)) as d:
                ids = [
                    await cp.request_instance(spec(f"deb{i}.example", os="debian+default")) for i in range(4)
                ]
                done = [await finished(cp, rid) for rid in ids]
            assert [(r.status, r.backend) for r in done] == [(RequestStatus.SUCCEEDED, "f2")] * 4, [
                r.error for r in done
            ]
            assert not f1.cluster.instances and d.stats.failed == 0
            assert sum(1 for j in f1.cluster.jobs.values() if j.ops[0].op_id == "OP_INSTANCE_CREATE") == 0


async def test_a_create_refused_by_its_backend_is_placed_on_the_other(db_url: str) -> None:
    # f1 (more nodes) is preferred; once the dispatcher has read its catalog, its OS goes away
    async with fakes(1, nodes=4) as (f1,), fakes(1, nodes=1) as (f2,):
        settings = settings_for(db_url, [backend("f1", f1), backend("f2", f2)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            dispatcher = Dispatcher(settings, store=store, status_server=False)
            async with running(dispatcher) as d:
                await eventually(lambda: _catalogs_read(d), what="the catalogs read")
                await cp.request_instance(spec("warm.example"))  # the facade's catalogs read, both with noop
                f1.cluster.oses.clear()
                rid = await cp.request_instance(spec("moved.example"))
                done = await finished(cp, rid)
            assert done.status is RequestStatus.SUCCEEDED and done.backend == "f2", done.error
            assert done.attempts >= 2
            failed = [
                j for j in f1.cluster.jobs.values() if j.ops[0].luxid.get("instance_name") == "moved.example"
            ]
            assert failed and all(j.status is JobStatus.ERROR for j in failed), [j.status for j in failed]
            instance = await store.get_instance("f2", "moved.example")
            assert instance is not None and instance.status is InstanceStatus.STARTED


async def test_a_pinned_create_refused_by_its_backend_fails_at_once(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    async with fakes(2) as (f1, f2):
        settings = settings_for(db_url, [backend("f1", f1), backend("f2", f2)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store, status_server=False)) as d:
                await eventually(lambda: _catalogs_read(d), what="the catalogs read")
                await cp.request_instance(spec("warm.example"), backend="f1")
                f1.cluster.oses.clear()
                rid = await cp.request_instance(spec("pinned.example"), backend="f1")
                done = await finished(cp, rid)
            assert done.status is RequestStatus.FAILED and done.attempts == 1, done
            assert "no other backend takes it" in (done.error or "") and "Directory for OS" in (
                done.error or ""
            )
            assert "pinned.example" not in f2.cluster.instances


async def _catalogs_read(d: Dispatcher) -> bool:
    return all(d.allocator.view(name).catalog is not None for name in ("f1", "f2"))


async def test_the_fake_answers_os_and_policy_like_ganeti() -> None:
    async with (
        FakeGaneti(tls=False, oses=("noop", "debootstrap+default"), ipolicy={"cpu-count": (1, 4)}) as fake,
        fake_client(fake) as client,
    ):
        assert await client.list_os() == ["debootstrap+default", "noop"]
        info = await client.info()
        (pair,) = info.ipolicy["minmax"]
        assert pair["max"]["cpu-count"] == 4 and pair["max"]["memory-size"] == 32768
        assert info.ipolicy["disk-templates"] == info.enabled_disk_templates == ["diskless", "file"]
        job = await client.create_instance(spec("cpu.example", vcpus=6))
        failed = await client.wait_for_job(job)
        assert failed.failure is not None and failed.failure.ecode == "wrong_input"
        assert "cpu-count value 6 is not in range [1, 4]" in failed.failure.message
