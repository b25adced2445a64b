"""The reconciler against FakeGaneti and both databases: drift made behind the control plane's
back is found, fixed per kind, orphans deleted only when asked; dead and slow backends; the CLI."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from synnefo_ganeti import JobStatus, RapiClient, RetryPolicy
from synnefo_ganeti.cli import main
from synnefo_ganeti.config import Settings
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.rapi import Job
from synnefo_ganeti.reconcile import Fix, Reconciler, Report, job_file
from synnefo_ganeti.store import InstanceStatus, Store
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.watch import QueueWatcher
from tests import helpers
from tests.helpers import clock_ticks, closed_port, eventually

QUICK = {"OP_INSTANCE_CREATE": 0.02, "OP_INSTANCE_REMOVE": 0.01, "OP_INSTANCE_SHUTDOWN": 0.01,
         "OP_INSTANCE_STARTUP": 0.01, "OP_INSTANCE_REBOOT": 0.01, "OP_INSTANCE_SET_PARAMS": 0.01,
         "dry_run": 0.01}  # fmt: skip
B = "athens"
OWNED = "synnefo-ganeti:owned"


def settings_for(
    db_url: str, *fakes: tuple[str, str, str, str], timeout: float = 5.0, **extra: Any
) -> Settings:
    backends = [
        {"name": name, "url": url, "username": user, "password": password}
        for name, url, user, password in fakes
    ]
    return Settings(database={"url": db_url}, backends=backends, reconcile={"timeout": timeout}, **extra)


def backend_of(name: str, fake: FakeGaneti) -> tuple[str, str, str, str]:
    return name, fake.url, fake.username, fake.password


#: a file-backed instance: the reconciler compares its disks too
spec = functools.partial(helpers.spec, disk_template="file", memory=512, disks=[{"size": 1024}])


def kinds(report: Report, backend: str = B) -> set[tuple[str, str | None]]:
    found = next(b for b in report.backends if b.name == backend)
    assert found.ok, found.error
    return {(d.kind.value, d.instance) for d in found.drifts}


@asynccontextmanager
async def watching(fake: FakeGaneti, store: Store) -> AsyncIterator[QueueWatcher]:
    assert fake.queue_dir is not None
    watcher = QueueWatcher(fake.queue_dir, store, B)
    task = asyncio.create_task(watcher.run())
    try:
        yield watcher
    finally:
        watcher.stop()
        await task


@asynccontextmanager
async def world(
    db_url: str, **fake_kwargs: Any
) -> AsyncIterator[tuple[FakeGaneti, Store, RapiClient, Settings]]:
    fake_kwargs.setdefault("op_times", QUICK)
    async with FakeGaneti(tls=False, **fake_kwargs) as fake, Store(db_url) as store:
        client = RapiClient(
            fake.url, username=fake.username, password=fake.password, retry=RetryPolicy(attempts=1)
        )
        async with client:
            yield fake, store, client, settings_for(db_url, backend_of(B, fake))


async def create(cp: ControlPlane, client: RapiClient, *names: str, **kwargs: Any) -> None:
    for name in names:
        _, job_id = await cp.create_instance(spec(name, **kwargs), backend=B)
        await client.wait_for_job(job_id)


async def statuses(store: Store) -> dict[str, InstanceStatus]:
    return {row.name: row.status for row in await store.list_instances(backend=B)}


# -- the whole cycle -------------------------------------------------------------------------------


async def test_drift_found_fixed_per_kind_and_then_clean(db_url: str) -> None:
    async with world(db_url) as (fake, store, client, settings):
        cp = ControlPlane(settings, store=store, clients={B: client})
        async with cp, Reconciler(settings, store=store, clients={B: client}) as reconciler:
            names = [f"sg-{letter}" for letter in "abcdef"]
            async with watching(fake, store):
                await create(cp, client, *names)
                await eventually(lambda: _all_started(store, names), what="every instance started")
            # just created through the facade, events stored by the watcher: no drift at all
            assert (await reconciler.run_once()).clean
            assert (await reconciler.run_once()).clean

            # now the watcher is gone, and things change behind the control plane's back
            cluster = fake.cluster
            del cluster.instances["sg-a"]
            cluster.instances["sg-b"].admin_state = "down"
            cluster.instances["sg-b"].oper_state = False
            cluster.instances["sg-c"].beparams["maxmem"] = 2048
            cluster.instances["sg-d"].nics.append({"mac": "aa:00:00:ff:ff:ff", "uuid": "n2"})
            cluster.instances["sg-e"].disks[0]["size"] = 4096
            # under [ownership] tag_namespace: ours (a drift); an operator's own tag is not
            cluster.instances["sg-f"].tags += ["synnefo-ganeti:extra", "ops:backup"]
            await create(cp, client, "sg-g")  # its end is never stored: still BUILD
            orphan = await client.create_instance(spec("sg-orphan", tags=[OWNED]))
            theirs = await client.create_instance(spec("theirs"))
            delay = cluster.submit([("OP_TEST_DELAY", {"duration": 0})], client=("gnt-debug", "delay"))
            for job_id in (orphan, theirs, delay):
                await client.wait_for_job(job_id)
            # the database holds the delay job as running (the watcher missed its end)
            ended = await client.get_job(delay)
            running = Job.model_validate(
                ended.model_dump(by_alias=True)
                | {"status": "running", "opstatus": ["running"], "end_ts": None}
            )
            await store.record(B, job_file(running))
            await clock_ticks()  # the jobs ended before the next snapshot

            expected = {
                ("stale", "sg-a"), ("operstate", "sg-b"), ("flavor", "sg-c"), ("nics", "sg-d"), ("disks", "sg-e"),
                ("tags", "sg-f"), ("building", "sg-g"), ("orphan", "sg-orphan"), ("job", None),
            }  # fmt: skip
            report = await reconciler.run_once()
            assert kinds(report) == expected and not report.clean
            assert not any(d.fixed for d in report.drifts)
            assert (await statuses(store))["sg-a"] is InstanceStatus.STARTED  # report-only touched nothing

            # one kind at a time
            report = await reconciler.run_once(fixes={Fix.OPERSTATE, "stale"})
            fixed = {(d.kind.value, d.instance) for d in report.drifts if d.fixed}
            assert fixed == {("operstate", "sg-b"), ("stale", "sg-a")}
            now = await statuses(store)
            assert now["sg-a"] is InstanceStatus.DESTROYED and now["sg-b"] is InstanceStatus.STOPPED
            assert kinds(await reconciler.run_once()) == expected - fixed

            # everything else on the database side: the orphan stays in Ganeti without --delete-orphans
            report = await reconciler.run_once(fixes=set(Fix))
            assert {(d.kind.value, d.instance) for d in report.drifts if not d.fixed} == {
                ("orphan", "sg-orphan")
            }
            assert "sg-orphan" in fake.cluster.instances
            sg_c = await store.get_instance(B, "sg-c")
            assert sg_c is not None and sg_c.beparams is not None and sg_c.beparams["maxmem"] == 2048
            sg_d = await store.get_instance(B, "sg-d")
            assert sg_d is not None and sg_d.nics is not None and len(sg_d.nics) == 2
            sg_e = await store.get_instance(B, "sg-e")
            assert sg_e is not None and sg_e.disks is not None
            assert [disk["size"] for disk in sg_e.disks] == [4096] and sg_e.disks[0]["uuid"]  # Ganeti's
            sg_f = await store.get_instance(B, "sg-f")
            assert sg_f is not None and sg_f.tags == sorted([OWNED, "synnefo-ganeti:extra"])
            assert (await statuses(store))["sg-g"] is InstanceStatus.STARTED
            stored_delay = await store.get_job(B, delay)
            assert stored_delay is not None and stored_delay.status is JobStatus.SUCCESS
            assert kinds(await reconciler.run_once()) == {("orphan", "sg-orphan")}

            # --delete-orphans: the one Ganeti-side action
            report = await reconciler.run_once(delete_orphans=True)
            assert [(d.kind.value, d.instance, d.fixed) for d in report.drifts] == [
                ("orphan", "sg-orphan", True)
            ]
            await eventually(lambda: "sg-orphan" not in fake.cluster.instances, what="the orphan deleted")
            assert "theirs" in fake.cluster.instances  # not ours: never touched
            await clock_ticks()
            assert (await reconciler.run_once()).clean
            assert (await reconciler.run_once()).clean


async def _all_started(store: Store, names: list[str]) -> bool:
    now = await statuses(store)
    return all(now.get(name) is InstanceStatus.STARTED for name in names)


async def test_building_cases_against_ganeti(db_url: str) -> None:
    slow_creates = QUICK | {"OP_INSTANCE_CREATE": 2.0}
    async with (
        world(db_url, op_times=slow_creates) as (_fake, store, client, settings),
        Reconciler(settings, store=store, clients={B: client}, build_grace=0.0) as reconciler,
    ):
        cp = ControlPlane(settings, store=store, clients={B: client})
        _, slow_job = await cp.create_instance(spec("sg-slow"), backend=B)
        # the create job is running: no drift
        assert (await reconciler.run_once()).clean
        # a BUILD row whose recorded create job Ganeti does not know, and one with no job at all
        await store.add_instance(B, "sg-lost", status=InstanceStatus.BUILD)
        await store.record_instance_job(B, "sg-lost", 9999, "create", start=True)
        await store.add_instance(B, "sg-never", status=InstanceStatus.BUILD)
        report = await reconciler.run_once(fixes={Fix.BUILDING})
        assert kinds(report) == {("building", "sg-lost"), ("building", "sg-never")}
        assert all(d.fixed for d in report.drifts)
        now = await statuses(store)
        assert now["sg-lost"] is InstanceStatus.ERROR and now["sg-never"] is InstanceStatus.ERROR
        assert now["sg-slow"] is InstanceStatus.BUILD
        await client.wait_for_job(slow_job)
        await clock_ticks()
        report = await reconciler.run_once(fixes={Fix.BUILDING})
        assert kinds(report) == {("building", "sg-slow")}
        assert (await statuses(store))["sg-slow"] is InstanceStatus.STARTED
        assert (await reconciler.run_once()).clean


async def test_a_job_unknown_to_ganeti_is_reported_not_failed(db_url: str) -> None:
    async with world(db_url) as (fake, store, client, settings):
        job_id = fake.cluster.submit([("OP_TEST_DELAY", {"duration": 0})], client=("gnt-debug", "delay"))
        done = await client.wait_for_job(job_id)
        running = Job.model_validate(
            done.model_dump(by_alias=True)
            | {"id": 777, "status": "running", "opstatus": ["running"], "end_ts": None}
        )
        await store.record(B, job_file(running))
        async with Reconciler(settings, store=store, clients={B: client}) as reconciler:
            report = await reconciler.run_once(fixes=set(Fix))
        (drift,) = report.drifts
        assert drift.kind == "job" and drift.instance is None and not drift.fixed
        assert "unknown to Ganeti" in drift.detail
        stored = await store.get_job(B, 777)
        assert stored is not None and stored.status is JobStatus.RUNNING  # not marked failed


async def test_archived_job_is_looked_up(db_url: str) -> None:
    async with world(db_url) as (fake, store, client, settings):
        job_id = fake.cluster.submit([("OP_TEST_DELAY", {"duration": 0})], client=("gnt-debug", "delay"))
        done = await client.wait_for_job(job_id)
        running = Job.model_validate(
            done.model_dump(by_alias=True) | {"status": "running", "opstatus": ["running"], "end_ts": None}
        )
        await store.record(B, job_file(running))
        assert fake.archive_jobs() == 1
        assert job_id not in {job.id for job in await client.list_jobs()}
        await clock_ticks()
        async with Reconciler(settings, store=store, clients={B: client}) as reconciler:
            report = await reconciler.run_once(fixes={Fix.JOBS})
            (drift,) = report.drifts
            assert drift.kind == "job" and drift.fixed and "Ganeti says success" in drift.detail
            assert (await reconciler.run_once()).clean
        stored = await store.get_job(B, job_id)
        assert stored is not None and stored.status is JobStatus.SUCCESS


# -- several backends ------------------------------------------------------------------------------


async def test_dead_and_slow_backends_do_not_stop_the_others(db_url: str) -> None:
    async with (
        FakeGaneti(tls=False, op_times=QUICK) as good,
        FakeGaneti(tls=False, op_times=QUICK, latency=60.0) as slow,
    ):
        dead = ("dead", f"http://127.0.0.1:{closed_port()}", "user", "password")
        # 3 s: room for the good backend's pass on a loaded machine (1 s left it little)
        settings = settings_for(db_url, backend_of("good", good), backend_of("slow", slow), dead, timeout=3.0)
        async with Reconciler(settings) as reconciler:
            await reconciler.store.add_instance("good", "sg-x", status=InstanceStatus.STARTED)
            report = await reconciler.run_once()
            # its answers take 60 s (counted from each connection's accept): still being made
            answering = slow.rapi.active
    by_name = {b.name: b for b in report.backends}
    assert [b.name for b in report.backends] == ["good", "slow", "dead"]
    assert by_name["good"].ok and [(d.kind.value, d.instance) for d in by_name["good"].drifts] == [
        ("stale", "sg-x")
    ]
    assert not by_name["slow"].ok and "slow" in (by_name["slow"].error or "")
    assert "timeout" in (by_name["slow"].error or "")
    assert not by_name["dead"].ok and "dead" in (by_name["dead"].error or "")
    assert "Traceback" not in (by_name["dead"].error or "")
    assert answering > 0  # the pass ended before the slow backend answered: cut at its timeout
    assert report.to_json()["backends"][2] == {
        "name": "dead", "ok": False, "error": by_name["dead"].error, "drifts": [], "networks": [],
    }  # fmt: skip


async def test_run_forever_survives_and_stops(db_url: str) -> None:
    async with world(db_url) as (_fake, store, client, settings):
        settings = settings.model_copy(
            update={"reconcile": settings.reconcile.model_copy(update={"interval": 0.05})}
        )
        stop = asyncio.Event()
        passes = 0
        async with Reconciler(settings, store=store, clients={B: client}) as reconciler:
            original = reconciler.run_once

            async def counting(**kwargs: Any) -> Report:
                nonlocal passes
                passes += 1
                if passes == 2:
                    raise RuntimeError("one bad pass")
                return await original(**kwargs)

            reconciler.run_once = counting  # type: ignore[method-assign]
            task = asyncio.create_task(reconciler.run_forever(stop=stop))
            await eventually(lambda: passes >= 4, what="four passes")
            stop.set()
            await asyncio.wait_for(task, 2)


# -- the CLI ---------------------------------------------------------------------------------------


def write_config(
    tmp_path: Path, db_url: str, *backends: tuple[str, str, str, str], timeout: float = 5.0
) -> Path:
    lines = [f'[database]\nurl = "{db_url}"\n', f"[reconcile]\ntimeout = {timeout}\n"]
    for name, url, user, password in backends:
        lines.append(
            f'[[backends]]\nname = "{name}"\nurl = "{url}"\nusername = "{user}"\npassword = "{password}"\n'
        )
    path = tmp_path / "synnefo-ganeti.toml"
    path.write_text("\n".join(lines))
    return path


async def cli(*args: str) -> Any:
    runner = CliRunner()
    return await asyncio.to_thread(runner.invoke, main, list(args), catch_exceptions=False)


async def test_cli_reconcile_json_and_exit_codes(db_url: str, tmp_path: Path) -> None:
    async with world(db_url) as (fake, store, client, _settings):
        config = write_config(tmp_path, db_url, backend_of(B, fake))
        clean = await cli("reconcile", "--config", str(config), "--json")
        assert clean.exit_code == 0, clean.output
        assert json.loads(clean.stdout) == {
            "backends": [{"name": B, "ok": True, "error": None, "drifts": [], "networks": []}]
        }

        await store.add_instance(B, "sg-gone", status=InstanceStatus.STARTED)
        orphan = await client.create_instance(spec("sg-orphan", tags=[OWNED]))
        await client.wait_for_job(orphan)
        await clock_ticks()
        found = await cli("reconcile", "--config", str(config), "--json")
        assert found.exit_code == 1, found.output
        data = json.loads(found.stdout)
        drifts = data["backends"][0]["drifts"]
        assert {(d["kind"], d["instance"], d["fixed"]) for d in drifts} == {
            ("stale", "sg-gone", False), ("orphan", "sg-orphan", False),
        }  # fmt: skip
        assert all(set(d) == {"kind", "instance", "detail", "fixed"} for d in drifts)

        table = await cli("reconcile", "--config", str(config))
        assert table.exit_code == 1 and "sg-gone" in table.output and "stale" in table.output

        fixed = await cli("reconcile", "--config", str(config), "--json", "--fix-all", "--delete-orphans")
        assert fixed.exit_code == 1
        assert all(d["fixed"] for d in json.loads(fixed.stdout)["backends"][0]["drifts"])
        await eventually(lambda: "sg-orphan" not in fake.cluster.instances, what="the orphan deleted")
        await clock_ticks()
        again = await cli("reconcile", "--config", str(config), "--json", "--backend", B)
        assert again.exit_code == 0, again.output

        dead = write_config(
            tmp_path, db_url, backend_of(B, fake), ("dead", f"http://127.0.0.1:{closed_port()}", "u", "p"),
            timeout=10.0,  # the dead one is refused at once; the live one is not cut on a loaded machine
        )  # fmt: skip
        failed = await cli("reconcile", "--config", str(dead), "--json")
        assert failed.exit_code == 2
        result = {b["name"]: b for b in json.loads(failed.stdout)["backends"]}
        assert result[B]["ok"] and not result["dead"]["ok"] and result["dead"]["error"]

        unknown = await cli("reconcile", "--config", str(config), "--backend", "nowhere")
        assert unknown.exit_code == 2 and "nowhere" in unknown.output


async def test_cli_backends_list(db_url: str, tmp_path: Path) -> None:
    async with world(db_url) as (fake, _store, client, _settings):
        await client.wait_for_job(await client.create_instance(spec("sg-one")))
        dead = ("dead", f"http://127.0.0.1:{closed_port()}", "u", "p")
        # the dead one is refused at once; at 1 s the live one was once cut too, on a loaded machine
        config = write_config(tmp_path, db_url, backend_of(B, fake), dead, timeout=10.0)
        result = await cli("backends", "list", "--config", str(config), "--json")
        assert result.exit_code == 1
        rows = {row["name"]: row for row in json.loads(result.stdout)["backends"]}
        assert rows[B]["ok"] and rows[B]["version"] == 2 and rows[B]["instances"] == 1
        assert rows[B]["free_memory"] > 0 and rows[B]["free_disk"] > 0
        assert not rows["dead"]["ok"] and rows["dead"]["error"]
        table = await cli("backends", "list", "--config", str(config))
        assert B in table.output and "dead" in table.output


@pytest.mark.parametrize("args", [["reconcile"], ["backends", "list"]])
def test_cli_needs_a_config(args: list[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [*args, "--config", str(tmp_path / "missing.toml")])
    assert result.exit_code == 2 and "does not exist" in result.output
