"""Names as Ganeti and DNS take them, sizes that can never fit (issue 28 items 4 and 5).

A name with whitespace or a control character is refused, never stripped; names are one
whatever their case (``UPPER.example.org`` and ``upper.example.org`` cannot both exist), kept
as given. A spec larger than any usable node can ever free is a ``ValidationError`` at once,
naming the size at fault and the largest that can fit, in words of sizes (not disk counts).
Store checks run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pydantic
import pytest
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from synnefo_ganeti import ControlPlane, ValidationError
from synnefo_ganeti.allocate import Catalog, check_name, check_spec, refusals
from synnefo_ganeti.errors import ConflictError
from synnefo_ganeti.rapi import ClusterInfo, InstanceSpec, Node
from synnefo_ganeti.store import InstanceStatus, RequestStatus, Store, normalize_url
from synnefo_ganeti.store.requests._names import check_name_free
from tests.helpers import spec
from tests.unit.test_dispatcher import backend, fakes, settings_for

B1, B2 = "b1", "b2"
BAD_NAMES = [
    "web1.example.org\n",
    "a b.example.org",
    "a\tb.example.org",
    " web.example.org",
    "web.example.org\r",
    "we\x00b.example.org",
    "web\u00a0x.example.org",  # a no-break space
    "web\u200b.example.org",  # a zero-width space (a format character)
]


def raw_spec(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "disk_template": "diskless", "os": "noop", "beparams": {"memory": 256}} | extra


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(normalize_url(db_url))
    try:
        yield engine
    finally:
        await engine.dispose()


# -- names: whitespace and control characters --------------------------------------------------------


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_a_spec_refuses_whitespace_and_control_characters_in_its_name(bad: str) -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        InstanceSpec(name=bad, disk_template="diskless", os="noop")
    (error,) = caught.value.errors()
    assert error["loc"] == ("name",)
    assert "no whitespace or control characters" in error["msg"] and "send the hostname alone" in error["msg"]
    assert error["input"] == bad  # as given: nothing stripped
    # the facade's own hostname check says the same of a spec that skipped validation
    with pytest.raises(ValidationError) as checked:
        check_name(bad)
    assert checked.value.field == "name"


def test_good_names_pass_as_given() -> None:
    for good in ("vm1", "Web1.Example.ORG", "web-1.example.org.", "1.2.example"):
        assert InstanceSpec(name=good, disk_template="diskless", os="noop").name == good
        check_name(good)


async def test_the_facade_refuses_a_newline_in_a_name_and_writes_nothing(db_url: str) -> None:
    async with fakes(1, nodes=1) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            bad = InstanceSpec.model_construct(**spec().model_dump() | {"name": "web1.example.org\n"})
            for call in (
                lambda: cp.validate(bad),
                lambda: cp.request_instance(bad),
                lambda: cp.create_instance(bad, backend="f1"),
            ):
                with pytest.raises(ValidationError) as caught:
                    await call()
                assert caught.value.field == "name"
                assert "'web1.example.org\\n'" in str(caught.value)
            assert await store.list_requests() == [] and await store.list_instances() == []
            assert not f1.cluster.instances


# -- names: one whatever the case --------------------------------------------------------------------


async def test_a_request_name_is_one_whatever_its_case(db_url: str) -> None:
    async with Store(db_url) as store:
        first, _ = await store.add_request(
            raw_spec("UPPER.example.org"), name="UPPER.example.org", unique_names="global"
        )
        assert first.instance == "UPPER.example.org"  # kept as given
        with pytest.raises(ConflictError, match=r"as UPPER\.example\.org") as caught:
            await store.add_request(
                raw_spec("upper.example.org"), name="upper.example.org", unique_names="global"
            )
        assert first.id in str(caught.value)
        # the same name with another case on another backend, under unique_names = "backend":
        # the open request holds it wherever it may go (no backend chosen yet)
        with pytest.raises(ConflictError):
            await store.add_request(
                raw_spec("Upper.Example.Org"), name="Upper.Example.Org", backend=B2, unique_names="backend"
            )
        assert [r.instance for r in await store.list_requests()] == ["UPPER.example.org"]
        # once it ends, the name is free in any case
        await store.finish_request(first.id, RequestStatus.CANCELED)
        again, created = await store.add_request(
            raw_spec("upper.example.org"), name="upper.example.org", unique_names="global"
        )
        assert created and again.instance == "upper.example.org"


async def test_requests_written_together_clash_whatever_their_case(db_url: str) -> None:
    """Adds queued together go in one set-based step (store/requests/_requests_batch.py): its fast path
    compares lowered names too, so exactly one of each clashing group is written."""
    async with Store(db_url) as store:
        names = [f"{case}.example.org" for case in ("mixed", "MIXED", "Mixed", "miXed")] + [
            "other.example.org"
        ]
        outcomes = await asyncio.gather(
            *(store.add_request(raw_spec(name), name=name, unique_names="global") for name in names),
            return_exceptions=True,
        )
        written = [o for o in outcomes if not isinstance(o, BaseException)]
        refused = [o for o in outcomes if isinstance(o, BaseException)]
        assert all(isinstance(o, ConflictError) for o in refused), refused
        assert len(written) == 2 and len(refused) == 3
        kept = sorted(r.instance.lower() for r, _ in written)
        assert kept == ["mixed.example.org", "other.example.org"]


async def test_an_instance_name_is_one_whatever_its_case(db_url: str) -> None:
    async with Store(db_url) as store:
        web = await store.add_instance(B1, "Web.example.org", unique_names="global")
        assert web.name == "Web.example.org"
        with pytest.raises(ConflictError, match=r"as Web\.example\.org"):
            await store.add_request(
                raw_spec("web.example.org"), name="web.example.org", unique_names="global"
            )
        with pytest.raises(ConflictError, match=r"as Web\.example\.org"):
            await store.add_instance(B2, "WEB.example.org", unique_names="global")
        with pytest.raises(ConflictError):
            await store.add_instance(B1, "web.EXAMPLE.org", unique_names="backend")
        await store.add_instance(B2, "WEB.example.org", unique_names="backend")  # another backend: its own
        # an ERROR row starts a new life under its own name only: another case of it is taken
        await store.add_instance(B1, "Err.example.org", status=InstanceStatus.ERROR)
        with pytest.raises(ConflictError, match=r"as Err\.example\.org"):
            await store.add_instance(B1, "err.example.org", unique_names="backend")
        await store.add_instance(B1, "Err.example.org", unique_names="backend")  # its own name: new life
        # a DESTROYED row leaves its name free in every case
        await store.add_instance(B1, "Gone.example.org", status=InstanceStatus.DESTROYED)
        request, _ = await store.add_request(
            raw_spec("gone.example.org"), name="gone.example.org", unique_names="global"
        )
        assert request.instance == "gone.example.org"


async def test_a_rename_to_another_case_of_its_own_name_is_no_clash(db_url: str, engine: AsyncEngine) -> None:
    async with Store(db_url) as store:
        web = await store.add_instance(B1, "web.example.org", unique_names="global")
        await store.add_instance(B1, "db.example.org", unique_names="global")

    def check(conn: Connection, name: str, exclude: str | None) -> None:
        check_name_free(conn, name, backend=B1, unique_names="global", exclude_instance=exclude)

    async with engine.connect() as conn:
        await conn.run_sync(check, "WEB.example.org", web.id)  # itself, another case: free
        with pytest.raises(ConflictError, match=r"as db\.example\.org"):
            await conn.run_sync(check, "DB.Example.org", web.id)


async def test_name_checks_use_the_index_of_lowered_names(db_url: str, engine: AsyncEngine) -> None:
    async with Store(db_url) as store:
        await store.add_instance(B1, "web.example.org")
    async with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            rows = await conn.execute(
                text("EXPLAIN QUERY PLAN SELECT uuid FROM instances WHERE lower(name) = 'web.example.org'")
            )
            assert any("ix_instances_name_lower" in str(row[-1]) for row in rows)
        else:
            query = "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_instances_name_lower'"
            definition = (await conn.execute(text(query))).scalar_one()
            assert "lower((name)::text)" in definition


# -- sizes that can never fit ------------------------------------------------------------------------


async def assert_refused_at_once(cp: ControlPlane, store: Store, bad: InstanceSpec, field: str) -> str:
    """validate, request_instance and create_instance refuse ``bad`` at once, ``field`` named."""
    message = ""
    for call in (
        lambda: cp.validate(bad),
        lambda: cp.request_instance(bad),
        lambda: cp.create_instance(bad, backend="f1"),
    ):
        started = time.monotonic()
        with pytest.raises(ValidationError) as caught:
            await call()
        assert time.monotonic() - started < 5.0  # not the placement timeout
        assert caught.value.field == field, caught.value
        message = str(caught.value)
    assert await store.list_requests() == [] and await store.list_instances() == []
    return message


async def test_memory_no_node_can_ever_free_is_refused_at_once(db_url: str) -> None:
    # the policy admits 32768 MiB, the nodes have 32768 MiB of which 1024 are their own
    async with fakes(1, nodes=2) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            message = await assert_refused_at_once(cp, store, spec(memory=32768), "beparams.memory")
            assert message.startswith("beparams.memory 32768 MiB: no backend admits it")
            assert "the largest that can fit is 31744 MiB (backend f1" in message
            assert "no node can ever free 32768 MiB memory (at most 31744)" in message
            await cp.validate(spec(memory=31744))  # the largest that can fit does


async def test_a_600_gib_disk_speaks_of_its_size(db_url: str) -> None:
    async with fakes(1, nodes=2) as (f1,):  # nodes of 512 GiB of disk
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            big = spec(disk_template="file", disks=[{"size": 600 * 1024}])
            message = await assert_refused_at_once(cp, store, big, "disks[0].size")
            assert message.startswith("disks[0].size 614400 MiB: no backend admits it")
            assert "the largest that can fit is 524288 MiB (backend f1" in message
            assert (
                "disk-count" not in message
                and " disks (" not in message
                and "admits is 1 disks" not in message
            )
            # two disks that fit one by one, not together on one node: "disks", their sum
            two = spec(disk_template="file", disks=[{"size": 300 * 1024}, {"size": 300 * 1024}])
            message = await assert_refused_at_once(cp, store, two, "disks")
            assert message.startswith("disks (2 disks, 614400 MiB in all): no backend admits it")
            assert "the largest that can fit is 524288 MiB in all" in message
            assert "admits is 1 disks" not in message
            await cp.validate(spec(disk_template="file", disks=[{"size": 512 * 1024}]))


async def test_more_vcpus_than_any_node_has_are_refused_at_once(db_url: str) -> None:
    async with fakes(1, nodes=2, node_cpus=4, ipolicy={"cpu-count": (1, 64)}) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            message = await assert_refused_at_once(cp, store, spec(vcpus=16), "beparams.vcpus")
            assert (
                "the largest that can fit is 4 (backend f1: the CPUs of its largest usable node)" in message
            )
            await cp.validate(spec(vcpus=4))


def test_only_usable_nodes_count() -> None:
    info = ClusterInfo.model_validate({"name": "c", "enabled_disk_templates": ["diskless", "file"]})
    nodes = [
        Node(name="small", mtotal=8192, mnode=512, dtotal=10240, ctotal=4),
        Node(name="off", mtotal=65536, mnode=512, dtotal=999999, ctotal=64, offline=True),
        Node(name="drained", mtotal=65536, mnode=512, dtotal=999999, ctotal=64, drained=True),
        Node(name="novm", mtotal=65536, mnode=512, dtotal=999999, ctotal=64, vm_capable=False),
    ]
    catalog = Catalog.of("b1", info, nodes, ["noop"])
    assert (catalog.memory_room, catalog.largest_disk, catalog.largest_cpus) == (7680, 10240, 4)
    assert refusals(catalog, spec(memory=7680, vcpus=4)) == []
    (refused,) = refusals(catalog, spec(memory=7681))
    assert refused.field == "beparams.memory" and "at most 7680" in refused.reason
    # a stopped instance needs no free memory (Ganeti checks it at start only)
    assert refusals(catalog, spec(memory=7681, start=False)) == []
    with pytest.raises(ValidationError) as caught:
        check_spec(spec(disk_template="file", disks=[{"size": 4096}, {"size": 8192}]), [catalog])
    assert caught.value.field == "disks" and "(2 disks, 12288 MiB in all)" in str(caught.value)


async def test_a_drained_backend_is_not_room_for_a_spec(db_url: str) -> None:
    """ "Usable" nodes are those of the backends not drained (in the configuration or by an
    operator): a spec only a drained backend's nodes could hold is refused, the largest the
    others take named; naming that backend, it is accepted (it waits there for the undrain)."""
    async with (
        fakes(1, nodes=1, node_memory=65536, ipolicy={"memory-size": (128, 65536)}) as (big,),
        fakes(1, nodes=1) as (small,),
    ):
        settings = settings_for(db_url, [backend("big", big), backend("small", small)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            await cp.validate(spec(memory=40000))  # big takes it
            await store.add_instance("big", "other.example.org")  # (the backend rows exist)
            assert await store.set_backend_drained("big", True)
            cp._checker.drained_interval = 0.0  # (read at each check here)
            with pytest.raises(ValidationError) as caught:
                await cp.request_instance(spec("huge.example.org", memory=40000))
            assert caught.value.field == "beparams.memory"
            assert "the largest that can fit is 31744 MiB (backend small" in str(caught.value)
            rid = await cp.request_instance(spec("huge.example.org", memory=40000), backend="big")
            assert (await cp.get_request(rid)).status is RequestStatus.PENDING
            assert await store.set_backend_drained("big", False)
            await cp.validate(spec(memory=40000))


async def test_open_requests_are_found_by_name_through_their_index(db_url: str, engine: AsyncEngine) -> None:
    """Every new request checks the open requests' names; the requests table keeps every request
    ever made, so the check must not read it whole (migration 0017)."""
    async with Store(db_url) as store:
        await store.add_request({"name": "web.example.org"}, name="web.example.org")
    async with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            rows = await conn.execute(
                text("EXPLAIN QUERY PLAN SELECT id FROM requests WHERE lower(name) = 'web.example.org'")
            )
            assert any("ix_requests_name_lower" in str(row[-1]) for row in rows)
        else:
            await conn.execute(text("SET LOCAL enable_seqscan = off"))
            plan = await conn.execute(
                text(
                    "EXPLAIN SELECT id FROM requests WHERE lower(name) IN ('web.example.org', 'db.example.org')"
                )
            )
            assert "ix_requests_name_lower" in "\n".join(row[0] for row in plan)
