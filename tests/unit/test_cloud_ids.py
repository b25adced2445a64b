"""Stable ids, names unique while alive, idempotency that refuses a changed request, listing pages.

Issue 14, parts 2, 4 and 9: ``StoredInstance.id`` is a UUID string given when the row is first
written (and to each new life of a name), never reused; ``Request.instance_id`` is the id of the
instance it placed; a name clash is a ConflictError at once; the same request id with another
request a ConflictError naming the fields; ``list_instances``/``list_requests`` page by id.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from synnefo_ganeti import ConflictError, ControlPlane, NotFoundError
from synnefo_ganeti.config import Settings
from synnefo_ganeti.store import InstanceStatus, RequestStatus, Store, StoredInstance
from synnefo_ganeti.store.instances._instances import instances_t
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.watch import QueueWatcher
from tests import helpers
from tests.helpers import eventually

QUICK = {"OP_INSTANCE_CREATE": 0.02, "OP_INSTANCE_REMOVE": 0.01, "OP_INSTANCE_SHUTDOWN": 0.01,
         "OP_INSTANCE_STARTUP": 0.01, "OP_INSTANCE_REBOOT": 0.01, "OP_INSTANCE_SET_PARAMS": 0.01}  # fmt: skip

spec = functools.partial(helpers.spec, pnode="node1.fake.test", vcpus=1)


def spec_of(name: str, memory: int = 256) -> dict[str, Any]:
    return {"name": name, "disk_template": "diskless", "os": "noop", "beparams": {"memory": memory}}


def is_uuid(value: object) -> bool:
    return isinstance(value, str) and str(uuid.UUID(value)) == value


def backend_of(name: str, fake: FakeGaneti, **extra: Any) -> dict[str, Any]:
    return {"name": name, "url": fake.url, "username": fake.username, "password": fake.password, **extra}


@asynccontextmanager
async def two_backends(
    tmp_path: Path, db_url: str, *, unique_names: str = "global"
) -> AsyncIterator[tuple[list[FakeGaneti], ControlPlane]]:
    """Two fakes (f1 followed by a queue watcher, f2 not followed) under one ControlPlane."""
    async with AsyncExitStack() as stack:
        queue = tmp_path / "queue"
        f1 = await stack.enter_async_context(FakeGaneti(tls=False, queue_dir=queue, op_times=QUICK))
        f2 = await stack.enter_async_context(FakeGaneti(tls=False, op_times=QUICK))
        settings = Settings(
            database={"url": db_url},
            backends=[backend_of("f1", f1), backend_of("f2", f2)],
            ownership={"unique_names": unique_names},
        )
        store = await stack.enter_async_context(Store(db_url))
        cp = await stack.enter_async_context(ControlPlane(settings, store=store))
        watcher = QueueWatcher(queue, store, "f1")
        task = asyncio.create_task(watcher.run())
        await watcher.ready.wait()
        try:
            yield [f1, f2], cp
        finally:
            watcher.stop()
            await task


async def until(cp: ControlPlane, instance_id: str, status: InstanceStatus) -> StoredInstance:
    async def reached() -> StoredInstance | None:
        instance = await cp.get_instance(instance_id)
        ended = instance is not None and instance.status is status and instance.task is None
        return instance if ended else None

    found: StoredInstance = await eventually(
        reached, what=f"{instance_id} to be {status.value}, its task ended"
    )
    return found


def creates(fake: FakeGaneti) -> int:
    return sum(1 for job in fake.cluster.jobs.values() for op in job.ops if op.op_id == "OP_INSTANCE_CREATE")


# -- stable ids -------------------------------------------------------------------------------------


async def test_an_instance_id_is_a_uuid_given_once_and_never_reused(db_url: str) -> None:
    async with Store(db_url) as store:
        first = await store.add_instance("b1", "vm1")
        other = await store.add_instance("b1", "vm2")
        assert is_uuid(first.id) and is_uuid(other.id) and first.id != other.id
        assert first.to_json()["id"] == first.id
        # the id stays through updates and job records
        updated = await store.update_instance("b1", "vm1", status=InstanceStatus.STARTED)
        assert updated.id == first.id
        assert await store.get_instance(None, None, id=first.id) == updated
        # a new life of the name is a new instance: a new id (a row of its own); the old id
        # still finds the old instance, DESTROYED
        await store.update_instance("b1", "vm1", status=InstanceStatus.DESTROYED)
        again = await store.add_instance("b1", "vm1")
        assert is_uuid(again.id) and again.id not in {first.id, other.id}
        old = await store.get_instance(None, None, id=first.id)
        assert old is not None and old.name == "vm1" and old.status is InstanceStatus.DESTROYED
        found = await store.get_instance(None, None, id=again.id)
        assert found is not None and found.name == "vm1" and found.status is InstanceStatus.BUILD
        assert await store.get_instance("b1", "vm1") == found  # by name: the live row
        assert await store.get_instance(None, None, id=str(uuid.uuid4())) is None


async def test_a_request_points_at_its_own_instance_even_after_the_name_is_reused(db_url: str) -> None:
    async with Store(db_url) as store:
        request, _ = await store.add_request(spec_of("vm1"), name="vm1")
        # the instance's id is given at once, and finds the request's server before it is placed
        assert is_uuid(request.instance_id) and request.to_json()["instance_id"] == request.instance_id
        view = await store.get_instance(None, None, id=request.instance_id)
        assert view is not None and view.status is InstanceStatus.BUILD and view.backend is None
        assert view.request_id == request.id and view.name == "vm1"
        await store.claim_requests("d1")
        placed = await store.place_request(request.id, "d1", "b1", {"os": "noop"}, unique_names="global")
        own = await store.get_instance("b1", "vm1")
        assert own is not None and placed.instance_id == own.id == request.instance_id
        assert own.request_id == request.id
        # not taken by Ganeti: unplaced, its BUILD row gone; the id stays the request's
        unplaced = await store.unplace_request(request.id, "d1", error="refused")
        assert unplaced.instance_id == request.instance_id and await store.get_instance("b1", "vm1") is None
        # placed again: its row again, with the same id
        placed = await store.place_request(request.id, "d1", "b1", {"os": "noop"}, unique_names="global")
        own = await store.get_instance("b1", "vm1")
        assert own is not None and placed.instance_id == own.id == request.instance_id
        await store.submitted_request(request.id, 17)
        await store.update_instance("b1", "vm1", status=InstanceStatus.STARTED)
        assert (await store.get_request(request.id)).status is RequestStatus.SUCCEEDED  # type: ignore[union-attr]
        # the instance is destroyed and its name reused by another instance
        await store.update_instance("b1", "vm1", status=InstanceStatus.DESTROYED)
        newer = await store.add_instance("b1", "vm1", unique_names="global")
        old_request = await store.get_request(request.id)
        assert old_request is not None and old_request.instance_id == own.id != newer.id
        old = await store.get_instance(None, None, id=old_request.instance_id)
        assert old is not None and (old.id, old.name, old.backend) == (own.id, "vm1", "b1")
        assert old.status is InstanceStatus.DESTROYED and old.create_job_id == 17
        new = await store.get_instance(None, None, id=newer.id)
        assert new is not None and new.status is InstanceStatus.BUILD and new.create_job_id is None
        # by name, the live row; both lives are listed, the live one first
        assert await store.get_instance("b1", "vm1") == new
        assert [i.id for i in await store.list_instances(backend="b1", name="vm1")] == [new.id, own.id]
        # the new life is destroyed and reused again: each id keeps finding its own instance
        await store.update_instance("b1", "vm1", status=InstanceStatus.DESTROYED)
        assert (await store.get_instance("b1", "vm1")).id == new.id  # type: ignore[union-attr]
        third = await store.add_instance("b1", "vm1")
        ids = [i.id for i in await store.list_instances(backend="b1", name="vm1")]
        assert ids == [third.id, new.id, own.id] and len(set(ids)) == 3


async def test_an_error_instance_starting_a_new_life_is_destroyed_and_kept(db_url: str) -> None:
    """An ERROR row whose name is reused becomes DESTROYED (not rewritten): its id finds it,
    its unapplied jobs move nothing, and the new life's jobs are its own."""
    async with Store(db_url) as store:
        first = await store.add_instance("b1", "vm1")
        assert await store.ensure_backend("b1") == 1
        await store.record_instance_job("b1", "vm1", 5, "create", start=True)
        await store.update_instance("b1", "vm1", status=InstanceStatus.ERROR)
        again = await store.add_instance("b1", "vm1")
        assert again.id != first.id and again.status is InstanceStatus.BUILD
        old = await store.get_instance(None, None, id=first.id)
        assert old is not None and old.status is InstanceStatus.DESTROYED and old.task is None
        assert await store.instance_jobs("b1", "vm1") == []  # the new life has none yet
        await store.record_instance_job("b1", "vm1", 6, "create", start=True)
        assert [job["job_id"] for job in await store.instance_jobs("b1", "vm1")] == [6]
        with pytest.raises(ConflictError, match="already in the database"):
            await store.add_instance("b1", "vm1")
        # the database itself refuses a second live row of the name (a partial unique index),
        # and takes any number of DESTROYED ones
        now = datetime.now(UTC)

        def insert_row(status: InstanceStatus) -> Any:
            def run(conn: Any) -> None:
                conn.execute(
                    insert(instances_t).values(
                        backend_id=1, name="vm1", status=status.value, created_at=now, updated_at=now
                    )
                )

            return run

        with pytest.raises(ConflictError, match="another write got there first"):
            await store.call(insert_row(InstanceStatus.STARTED))
        await store.call(insert_row(InstanceStatus.DESTROYED))
        rows = await store.list_instances(backend="b1", name="vm1")
        assert [i.status for i in rows] == [InstanceStatus.BUILD] + [InstanceStatus.DESTROYED] * 2
        assert rows[0].id == again.id and len({i.id for i in rows}) == 3


async def test_acting_on_a_destroyed_id_never_touches_the_new_life_of_its_name(
    tmp_path: Path, db_url: str
) -> None:
    async with two_backends(tmp_path, db_url) as (_, cp):
        first, _ = await cp.create_instance(spec("vm1.fake.test"), backend="f1")
        await until(cp, first.id, InstanceStatus.STARTED)
        await cp.delete_instance(first.id)
        await until(cp, first.id, InstanceStatus.DESTROYED)
        second, _ = await cp.create_instance(spec("vm1.fake.test"), backend="f1")
        assert second.id != first.id
        await until(cp, second.id, InstanceStatus.STARTED)
        old = await cp.get_instance(first.id)
        assert old is not None and old.status is InstanceStatus.DESTROYED and old.name == second.name
        assert await cp.get_instance("vm1.fake.test", backend="f1") == await cp.get_instance(second.id)
        with pytest.raises(NotFoundError, match=f"its name is now instance {second.id}"):
            await cp.shutdown_instance(first.id)
        current = await cp.get_instance(second.id)
        assert current is not None and current.status is InstanceStatus.STARTED and current.task is None


async def test_get_and_act_on_an_instance_by_its_id(tmp_path: Path, db_url: str) -> None:
    async with two_backends(tmp_path, db_url) as (_, cp):
        instance, _ = await cp.create_instance(spec("vm1.fake.test"), backend="f1")
        assert is_uuid(instance.id)
        started = await until(cp, instance.id, InstanceStatus.STARTED)
        assert started.name == "vm1.fake.test" and started.backend == "f1"
        assert await cp.get_instance("vm1.fake.test", backend="f1") == await cp.get_instance(instance.id)
        assert await cp.get_instance("vm1.fake.test") is None  # without a backend, a name is no id

        await cp.shutdown_instance(instance.id)
        await until(cp, instance.id, InstanceStatus.STOPPED)
        await cp.startup_instance(instance.id)
        await until(cp, instance.id, InstanceStatus.STARTED)
        await cp.reboot_instance(instance.id)
        await until(cp, instance.id, InstanceStatus.STARTED)
        await cp.modify_instance(instance.id, beparams={"memory": 512})

        async def flavored() -> bool:
            found = await cp.get_instance(instance.id)
            return found is not None and found.task is None and (found.beparams or {}).get("maxmem") == 512

        await eventually(flavored, what="the modify to be applied")
        await cp.delete_instance(instance.id)
        destroyed = await until(cp, instance.id, InstanceStatus.DESTROYED)
        assert destroyed.id == instance.id

        unknown = str(uuid.uuid4())
        for action in (cp.startup_instance, cp.shutdown_instance, cp.reboot_instance, cp.delete_instance):
            with pytest.raises(NotFoundError, match=f"no instance has id {unknown}"):
                await action(unknown)
        with pytest.raises(NotFoundError):
            await cp.modify_instance(unknown, beparams={"memory": 512})


# -- names unique while alive ---------------------------------------------------------------------------


async def test_a_name_is_unique_across_backends_by_default(tmp_path: Path, db_url: str) -> None:
    async with two_backends(tmp_path, db_url) as ((_, f2), cp):
        assert cp.settings.ownership.unique_names == "global"
        instance, _ = await cp.create_instance(spec("vm1.fake.test"), backend="f1")
        with pytest.raises(ConflictError, match=r"vm1\.fake\.test is taken: instance .* of backend f1"):
            await cp.create_instance(spec("vm1.fake.test"), backend="f2")
        with pytest.raises(ConflictError, match="taken"):
            await cp.request_instance(spec("vm1.fake.test"))
        with pytest.raises(ConflictError, match="taken"):
            await cp.request_instance(spec("vm1.fake.test"), backend="f2")
        assert creates(f2) == 0 and await cp.get_instance("vm1.fake.test", backend="f2") is None
        assert await cp.list_requests() == []  # nothing written

        # an open request holds its name too
        request_id = await cp.request_instance(spec("vm2.fake.test"))
        with pytest.raises(ConflictError, match=f"taken by request {request_id}"):
            await cp.create_instance(spec("vm2.fake.test"), backend="f2")
        with pytest.raises(ConflictError, match=f"taken by request {request_id}"):
            await cp.request_instance(spec("vm2.fake.test"), backend="f1")
        assert [r.id for r in await cp.list_requests()] == [request_id]

        # once DESTROYED, the name is free anywhere
        await until(cp, instance.id, InstanceStatus.STARTED)
        await cp.delete_instance(instance.id)
        await until(cp, instance.id, InstanceStatus.DESTROYED)
        again, _ = await cp.create_instance(spec("vm1.fake.test"), backend="f2")
        assert again.id != instance.id and again.backend == "f2" and creates(f2) == 1


async def test_names_unique_per_backend(tmp_path: Path, db_url: str) -> None:
    async with two_backends(tmp_path, db_url, unique_names="backend") as ((f1, f2), cp):
        one, _ = await cp.create_instance(spec("vm1.fake.test"), backend="f1")
        two, _ = await cp.create_instance(spec("vm1.fake.test"), backend="f2")
        assert one.id != two.id and (creates(f1), creates(f2)) == (1, 1)
        with pytest.raises(ConflictError, match="already in the database"):
            await cp.create_instance(spec("vm1.fake.test"), backend="f2")
        with pytest.raises(ConflictError, match="already in the database"):
            await cp.request_instance(spec("vm1.fake.test"), backend="f1")
        first = await cp.request_instance(spec("vm3.fake.test"), backend="f1")
        second = await cp.request_instance(spec("vm3.fake.test"), backend="f2")
        with pytest.raises(ConflictError, match="taken by request"):
            await cp.request_instance(spec("vm3.fake.test"))  # anywhere: it could land on either
        with pytest.raises(ConflictError, match=f"taken by request {first}"):
            await cp.create_instance(spec("vm3.fake.test"), backend="f1")
        assert {r.id for r in await cp.list_requests()} == {first, second}


async def test_the_name_check_is_one_transaction_with_the_write(db_url: str) -> None:
    """Two stores (two processes' worth) racing for one name: exactly one wins."""
    async with Store(db_url) as one, Store(db_url) as two:

        async def take(store: Store, backend: str) -> StoredInstance | ConflictError:
            try:
                return await store.add_instance(backend, "vm1", unique_names="global")
            except ConflictError as exc:
                return exc

        results = await asyncio.gather(*(take(s, b) for s in (one, two) for b in ("b1", "b2")))
        won = [r for r in results if isinstance(r, StoredInstance)]
        assert len(won) == 1 and sum(isinstance(r, ConflictError) for r in results) == 3
        assert [i.id for i in await one.list_instances()] == [won[0].id]


# -- idempotency that refuses a changed request ------------------------------------------------------


async def test_the_same_request_id_with_another_request_is_a_conflict_naming_the_fields(db_url: str) -> None:
    async with Store(db_url) as store:
        request, new = await store.add_request(spec_of("vm1"), name="vm1", backend="b1", request_id="r1")
        again, new_again = await store.add_request(spec_of("vm1"), name="vm1", backend="b1", request_id="r1")
        assert new and not new_again and again == request
        same, _ = await store.add_request(spec_of("vm1"), name="vm1", request_id="r1")  # any backend
        assert same == request
        with pytest.raises(ConflictError, match="request r1 already exists with another beparams;"):
            await store.add_request(spec_of("vm1", memory=512), name="vm1", backend="b1", request_id="r1")
        changed = {**spec_of("vm1"), "os": "debootstrap"}
        with pytest.raises(ConflictError, match="with another backend, os;"):
            await store.add_request(changed, name="vm1", backend="b2", request_id="r1")
        with pytest.raises(ConflictError, match="with another name;"):
            await store.add_request(spec_of("vm2"), name="vm2", backend="b1", request_id="r1")
        assert [r.id for r in await store.list_requests()] == ["r1"]
        assert await store.get_request("r1") == request


async def test_request_instance_refuses_a_changed_request(tmp_path: Path, db_url: str) -> None:
    async with two_backends(tmp_path, db_url) as (_, cp):
        rid = await cp.request_instance(spec("vm1.fake.test"), request_id="api-key-1")
        assert await cp.request_instance(spec("vm1.fake.test"), request_id="api-key-1") == rid == "api-key-1"
        with pytest.raises(ConflictError, match="another beparams"):
            await cp.request_instance(spec("vm1.fake.test", memory=1024), request_id=rid)
        with pytest.raises(ConflictError, match="another backend"):
            await cp.request_instance(spec("vm1.fake.test"), backend="f2", request_id=rid)


# -- listing for an API --------------------------------------------------------------------------------


async def test_list_instances_pages_by_id_with_filters(db_url: str) -> None:
    async with Store(db_url) as store:
        made = [await store.add_instance(f"b{i % 2 + 1}", f"vm{i}") for i in range(7)]
        made.append(await store.add_instance("b1", "web1", status=InstanceStatus.STARTED))
        ids = sorted(i.id for i in made)
        pages, after = [], None
        while True:
            page = await store.list_instances(limit=3, after=after)
            if not page:
                break
            pages.append([i.id for i in page])
            after = page[-1].id
        assert [len(p) for p in pages] == [3, 3, 2] and [i for p in pages for i in p] == ids
        by_name = sorted(await store.list_instances(), key=lambda i: (i.backend, i.name))
        assert await store.list_instances() == by_name  # no page asked: by backend and name, as before
        b1 = sorted(i.id for i in made if i.backend == "b1")
        assert [i.id for i in await store.list_instances(backend="b1", limit=100)] == b1
        assert [i.name for i in await store.list_instances(name_prefix="web", limit=10)] == ["web1"]
        assert [i.name for i in await store.list_instances(status=["STARTED"], after="")] == ["web1"]
        assert await store.list_instances(name_prefix="vm_", limit=10) == []  # a prefix, not a pattern


async def test_list_requests_pages_by_id_with_filters(tmp_path: Path, db_url: str) -> None:
    async with two_backends(tmp_path, db_url, unique_names="backend") as (_, cp):
        for i in range(5):
            await cp.store.add_request(spec_of(f"vm{i}"), name=f"vm{i}", request_id=f"r{i}")
        await cp.store.add_request(spec_of("db0"), name="db0", backend="f2", request_id="q0")
        await cp.cancel_request("r3")
        listed = [r.id for r in await cp.list_requests()]
        assert listed == ["q0", "r0", "r1", "r2", "r3", "r4"]  # by id
        first = await cp.list_requests(limit=4)
        rest = await cp.list_requests(limit=4, after=first[-1].id)
        assert [r.id for r in first + rest] == listed and len(rest) == 2
        assert [r.id for r in await cp.list_requests(name_prefix="db")] == ["q0"]
        assert [r.id for r in await cp.list_requests(status=["canceled"])] == ["r3"]
        assert [r.id for r in await cp.list_requests(status=["pending"], after="r1", limit=1)] == ["r2"]
        newest = await cp.store.list_requests(limit=2)  # newest first, as before
        assert [r.id for r in newest] == ["q0", "r4"]
