"""Never adopt what is not ours (issue 27 item 2), on SQLite and on PostgreSQL.

The bug: a create refused because an operator's untagged VM held the name left an ERROR row;
the reconciler's ``operstate`` fix set it STARTED (owned), and a later delete removed the
operator's VM from Ganeti. Here such a pair is ``not_owned`` in the plan (report-only), no fix
moves it (every fix at once, the dispatcher's own pass, the console's fix button), the row is
marked not owned, every action on it is refused and nothing is sent to Ganeti for it; its
delete (an ERROR row) forgets it without a job. Networks: one being deleted is never made
again by a fix, its delete is finished (Synnefo's ``test_stale_network``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from synnefo_ganeti import ConflictError, RapiClient, RetryPolicy
from synnefo_ganeti.config import Settings
from synnefo_ganeti.console import Console
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.rapi import Instance, Job
from synnefo_ganeti.reconcile import DbSnapshot, DriftKind, Fix, GanetiSnapshot, Reconciler, plan
from synnefo_ganeti.reconcile._networks import NetworkDriftKind, check_networks
from synnefo_ganeti.store import InstanceStatus, Store, StoredInstance
from synnefo_ganeti.store.networks._networks import NetworkState, NetworkStore
from synnefo_ganeti.testing import FakeGaneti
from tests import helpers
from tests.unit.test_console import login, write_users
from tests.unit.test_dispatcher import running

B = "athens"
OWNED = "synnefo-ganeti:owned"
QUICK = {"OP_INSTANCE_CREATE": 0.02, "OP_INSTANCE_REMOVE": 0.01, "OP_INSTANCE_SHUTDOWN": 0.01}
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)
NOW = LONG_AGO.timestamp() + 3600


# -- the plan (pure) ---------------------------------------------------------------------------------


def _row(name: str, status: InstanceStatus, *, owned: bool = True, job: int | None = None) -> StoredInstance:
    return StoredInstance(
        id=f"id-{name}", backend=B, name=name, status=status, owned=owned, os="noop", disk_template="diskless",
        beparams=None, nics=None, disks=None, tags=[OWNED], create_job_id=job, state_time=None,
        created_at=LONG_AGO, updated_at=LONG_AGO,
    )  # fmt: skip


def _theirs(name: str) -> Instance:  # an operator's VM: running, no ownership tag
    return Instance.model_validate(
        {"name": name, "admin_state": "up", "oper_state": True, "status": "running", "tags": ["ops:web"]}
    )


def _create(job_id: int, name: str, status: str) -> Job:
    op = {"OP_ID": "OP_INSTANCE_CREATE", "instance_name": name}
    ts = [int(LONG_AGO.timestamp()), 0]
    return Job.model_validate(
        {"id": job_id, "status": status, "ops": [op], "opstatus": [status], "end_ts": ts, "received_ts": ts}
    )


def _plan(rows: list[StoredInstance], *, jobs: list[Job] = (), marks: bool = True) -> list[tuple[str, str]]:  # type: ignore[assignment]
    db = DbSnapshot(B, {r.name: r for r in rows}, {}, taken_at=NOW)
    instances = {r.name: _theirs(r.name) for r in rows}
    gnt = GanetiSnapshot(B, instances, {j.id: j for j in jobs}, owned=frozenset(), taken_at=NOW, marks=marks)
    return [(d.kind.value, d.instance or "") for d in plan(db, gnt)]


def test_a_row_whose_name_ganeti_gives_an_instance_not_ours_is_not_owned_and_nothing_else() -> None:
    rows = [
        _row("failed", InstanceStatus.ERROR),  # the bug: was an operstate drift (fix: STARTED, owned)
        _row("adopted", InstanceStatus.STOPPED),  # was operstate too
        _row("marked", InstanceStatus.ERROR, owned=False),  # marked by an earlier pass: still reported
    ]
    assert sorted(_plan(rows)) == [("not_owned", "adopted"), ("not_owned", "failed"), ("not_owned", "marked")]
    # without any ownership mark configured nothing is told "not ours": the rows are compared
    compared = sorted(_plan(rows[:2], marks=False))
    assert ("operstate", "adopted") in compared and ("operstate", "failed") in compared


def test_a_build_row_never_takes_the_state_of_an_instance_not_ours() -> None:
    rows = [
        _row("refused", InstanceStatus.BUILD, job=7),  # its create failed: it ends ERROR, as usual
        _row("made", InstanceStatus.BUILD, job=8),  # its create "succeeded", the name is theirs
        _row("unknown", InstanceStatus.BUILD, job=9),  # a create job Ganeti does not know
        _row("unrecorded", InstanceStatus.BUILD),  # no create job recorded, past the grace
    ]
    jobs = [_create(7, "refused", "error"), _create(8, "made", "success")]
    assert sorted(_plan(rows, jobs=jobs)) == [
        ("building", "refused"), ("not_owned", "made"), ("not_owned", "unknown"), ("not_owned", "unrecorded"),
    ]  # fmt: skip


# -- fixes, actions and deletes, against the fake --------------------------------------------------------


@asynccontextmanager
async def world(db_url: str) -> AsyncIterator[tuple[FakeGaneti, Store, RapiClient, Settings, ControlPlane]]:
    async with FakeGaneti(tls=False, op_times=QUICK) as fake, Store(db_url) as store:
        client = RapiClient(
            fake.url, username=fake.username, password=fake.password, retry=RetryPolicy(attempts=1)
        )
        backends = [{"name": B, "url": fake.url, "username": fake.username, "password": fake.password}]
        settings = Settings(
            database={"url": db_url},
            backends=backends,
            dispatcher={"status_port": None, "poll_interval": 0.05, "shutdown_timeout": 5.0},
        )
        async with client, ControlPlane(settings, store=store, clients={B: client}) as cp:
            yield fake, store, client, settings, cp


async def _operators_vms(client: RapiClient, store: Store, *names: str) -> None:
    """``names`` made by an operator in Ganeti (no ownership tag), each with a row of ours in ERROR,
    as a create of ours refused for the name leaves it."""
    for name in names:
        await client.wait_for_job(await client.create_instance(helpers.spec(name, tags=["ops:web"])))
        await store.add_instance(B, name, status=InstanceStatus.ERROR)


async def _job_count(client: RapiClient) -> int:
    return len(await client.list_jobs())


async def test_every_fix_at_once_adopts_nothing_and_every_action_is_refused(db_url: str) -> None:
    async with world(db_url) as (fake, store, client, settings, cp):
        await _operators_vms(client, store, "web1", "web2")
        await store.update_instance(B, "web2", status=InstanceStatus.STARTED)  # adopted by the old bug
        jobs = await _job_count(client)
        async with Reconciler(settings, store=store, clients={B: client}) as reconciler:
            for _ in range(2):  # the second pass: the rows marked, still reported, still not fixed
                report = await reconciler.run_once(fixes=set(Fix), delete_orphans=True)
                assert sorted((d.kind.value, d.instance, d.fixed) for d in report.drifts) == [
                    ("not_owned", "web1", False), ("not_owned", "web2", False),
                ]  # fmt: skip
                assert "lacks the ownership marks" in report.drifts[0].detail
        rows = {i.name: i for i in await store.list_instances(backend=B)}
        assert {n: (r.status, r.owned) for n, r in rows.items()} == {
            "web1": (InstanceStatus.ERROR, False),
            "web2": (InstanceStatus.STARTED, False),
        }
        assert rows["web1"].os is None and rows["web1"].nics is None  # none of their values recorded
        for act in (cp.shutdown_instance, cp.reboot_instance, cp.delete_instance):
            with pytest.raises(
                ConflictError, match=r"instance web2 of backend athens is not this control plane"
            ):
                await act("web2", backend=B)
        # the ERROR row of a refused create: forgotten without a job, the operator's VM left alone
        assert await cp.delete_instance("web1", backend=B) is None
        gone = await store.get_instance(B, "web1")
        assert gone is not None and gone.status is InstanceStatus.DESTROYED
        assert await _job_count(client) == jobs  # nothing was sent to Ganeti
        assert {"web1", "web2"} <= set(fake.cluster.instances)
        assert (await store.get_instance(B, "web2")).task is None  # type: ignore[union-attr]


async def test_a_delete_asks_ganeti_whose_instance_holds_the_name_of_an_error_row(db_url: str) -> None:
    """No pass has seen the pair yet (the row still owned): the delete of the ERROR row finds
    Ganeti's instance without our mark, and leaves it."""
    async with world(db_url) as (fake, store, client, _settings, cp):
        await _operators_vms(client, store, "web1")
        jobs = await _job_count(client)
        assert await cp.delete_instance("web1", backend=B) is None
        gone = await store.get_instance(B, "web1")
        assert gone is not None and gone.status is InstanceStatus.DESTROYED
        assert await _job_count(client) == jobs and "web1" in fake.cluster.instances


async def test_the_dispatchers_own_fixes_adopt_nothing(db_url: str) -> None:
    async with world(db_url) as (fake, store, client, settings, _cp):
        await _operators_vms(client, store, "web1")
        jobs = await _job_count(client)
        async with running(Dispatcher(settings, store=store, status_server=False)) as dispatcher:
            report = await dispatcher.reconcile_once()  # every database-side fix (DAEMON_FIXES)
        assert report is not None
        assert [(d.kind.value, d.instance, d.fixed) for d in report.drifts] == [("not_owned", "web1", False)]
        row = await store.get_instance(B, "web1")
        assert row is not None and (row.status, row.owned) == (InstanceStatus.ERROR, False)
        assert await _job_count(client) == jobs and "web1" in fake.cluster.instances


async def test_the_consoles_fix_buttons_adopt_nothing(db_url: str, tmp_path: Path) -> None:
    users, tokens = write_users(tmp_path)
    async with world(db_url) as (fake, store, client, settings, _cp):
        settings = settings.model_copy(
            update={"web": settings.web.model_copy(update={"users_file": users, "tokens_file": tokens,
                                                           "secure_cookies": False})}
        )  # fmt: skip
        await _operators_vms(client, store, "web1")
        console = Console(settings, store=store, capacity_interval=0.2, live_interval=0.05)
        http = TestClient(TestServer(console.build()))
        await http.start_server()
        try:
            csrf = await login(http, "alice")
            await http.post("/drift/run", data={"csrf": csrf})
            page = await (await http.get("/drift")).text()
            assert "not_owned" in page and "web1" in page and 'id="fix-athens-' not in page  # no button
            for fix in Fix:  # a crafted POST of each fix moves nothing either
                response = await http.post("/drift/fix", data={"csrf": csrf, "backend": B, "fix": fix.value})
                assert response.status == 200 and "0 fixed" in await response.text()
        finally:
            await http.close()
        row = await store.get_instance(B, "web1")
        assert row is not None and (row.status, row.owned) == (InstanceStatus.ERROR, False)
        assert "web1" in fake.cluster.instances


# -- networks: a delete wins ----------------------------------------------------------------------------


async def test_a_network_whose_delete_was_cut_short_is_deleted_not_made_again(db_url: str) -> None:
    async with world(db_url) as (fake, store, client, _settings, _cp):
        networks = NetworkStore(store)
        values: dict[str, Any] = {"subnet": "10.0.0.0/29", "gateway": "10.0.0.1", "mac_prefix": None,
                                  "mode": "bridged", "link": None, "groups": None, "tags": [OWNED],
                                  "backends": [B]}  # fmt: skip
        await networks.add("cnet-a", **values)
        await networks.set_backend("cnet-a", B, state=NetworkState.ACTIVE, groups=["default"])
        # delete_network marked it deleting, then the caller died (Ganeti's network gone or not)
        await networks.set_status("cnet-a", NetworkState.DELETING)

        def owns(_name: str, tags: list[str]) -> bool:
            return OWNED in tags

        every = list(NetworkDriftKind)
        # within the grace a delete may be running: no drift, and never "stale" (made again)
        assert await check_networks(store, client, B, owns=owns, fixes=every) == []
        drifts = await check_networks(store, client, B, owns=owns, grace=0, fixes=every)
        assert [(d.kind, d.network, d.fixed, d.values) for d in drifts] == [
            (NetworkDriftKind.PENDING, "cnet-a", True, {"do": "delete"})
        ]
        assert "cnet-a" not in fake.cluster.model.networks  # not made again
        assert await networks.get("cnet-a") is None  # its delete finished: the name is free
        assert await check_networks(store, client, B, owns=owns, grace=0, fixes=every) == []


async def test_a_network_being_deleted_that_ganeti_still_has_is_removed(db_url: str) -> None:
    async with world(db_url) as (fake, store, client, _settings, _cp):
        networks = NetworkStore(store)
        await networks.add("cnet-b", subnet="10.0.1.0/29", gateway=None, mac_prefix=None, mode="bridged",
                           link=None, groups=None, tags=[OWNED], backends=[B])  # fmt: skip
        await client.wait_for_job(await client.create_network("cnet-b", "10.0.1.0/29", tags=[OWNED]))
        await client.wait_for_job(await client.connect_network("cnet-b", "default", "bridged", "br0"))
        await networks.set_backend("cnet-b", B, state=NetworkState.ACTIVE, groups=["default"])
        await networks.set_status("cnet-b", NetworkState.DELETING)
        drifts = await check_networks(store, client, B, grace=0, fixes=list(NetworkDriftKind))
        assert [(d.kind, d.fixed) for d in drifts] == [(NetworkDriftKind.PENDING, True)]
        assert "cnet-b" not in fake.cluster.model.networks and await networks.get("cnet-b") is None


def test_no_drift_kind_of_these_has_a_fix() -> None:
    kinds = {fix.kind for fix in Fix}
    assert DriftKind.NOT_OWNED not in kinds and DriftKind.NODE_DOWN not in kinds
