"""Two dispatcher processes on one PostgreSQL database, one SIGKILLed mid-burst (issue 31): the
other takes over its claims (crash recovery: Ganeti asked first) and its follow leases, and every
request ends: 0 lost, 0 instances created twice."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from synnefo_ganeti import ControlPlane
from synnefo_ganeti.config import Settings
from synnefo_ganeti.store import DispatcherReport, InstanceStatus, RequestStatus, StatusStore, Store
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import creates, fakes

COUNT = 120
#: a create runs long enough that the burst is still going when one dispatcher is killed
SLOW = {"OP_INSTANCE_CREATE": 0.15, "OP_INSTANCE_SHUTDOWN": 0.01}


def write_config(path: Path, db_url: str, backends: dict[str, FakeGaneti]) -> None:
    """The dispatchers' configuration: backends without a local queue (followed through RAPI
    ``/wait``, so by the holder of each follow lease), quick reports and polls."""
    lines = ["[database]", f"url = {json.dumps(db_url)}", ""]
    for name, fake in backends.items():
        secret = path.parent / f"{name}.password"
        secret.write_text(fake.password + "\n")
        secret.chmod(0o600)
        lines += [
            "[[backends]]",
            f"name = {json.dumps(name)}",
            f"url = {json.dumps(fake.url)}",
            f"username = {json.dumps(fake.username)}",
            f"password_file = {json.dumps(str(secret))}",
            "",
        ]
    lines += [
        "[dispatcher]",
        "status_port = 0",
        "poll_interval = 0.1",
        "health_interval = 1",
        "stats_interval = 2",
        "report_interval = 0.5",
        "claim_batch = 10",
        "",
        "[reconcile]",
        "interval = 3600",  # only following jobs and crash recovery settle requests here
    ]
    path.write_text("\n".join(lines) + "\n")


@asynccontextmanager
async def dispatcher_process(config: Path, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    with log.open("ab") as handle:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "synnefo_ganeti", "--log-format", "json", "--log-level", "info",
            "dispatcher", "--config", str(config), stdout=handle, stderr=handle,
        )  # fmt: skip
    try:
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()


async def reports(store: Store, pids: set[int]) -> dict[int, DispatcherReport]:
    """The live reports of the dispatchers run by ``pids``, by pid."""
    found = await StatusStore(store).dispatchers()
    return {r.pid: r for r in found if r.pid in pids and r.alive()}


@pytest.mark.slow
@pytest.mark.timeout(300)  # ~25 s on a quiet machine
async def test_a_dispatcher_killed_mid_burst_leaves_nothing_lost_or_sent_twice(
    pg_url: str, tmp_path: Path
) -> None:
    async with fakes(2, op_times=SLOW) as (f1, f2):
        config = tmp_path / "dispatcher.toml"
        write_config(config, pg_url, {"f1": f1, "f2": f2})
        settings = Settings.from_file(config)
        async with (
            Store(pg_url) as store,
            ControlPlane(settings, store=store) as cp,
            dispatcher_process(config, tmp_path / "one.log") as one,
            dispatcher_process(config, tmp_path / "two.log") as two,
        ):
            pids = {one.pid, two.pid}

            async def both_claiming() -> bool:
                found = await reports(store, pids)
                return len(found) == 2 and all(r.state.get("claiming") for r in found.values())

            await eventually(both_claiming, timeout=60, what="two dispatchers running")
            ids = [await cp.request_instance(spec(f"c{i:03d}.example", memory=128)) for i in range(COUNT)]

            async def victim_busy() -> DispatcherReport | None:
                report = (await reports(store, pids)).get(one.pid)
                busy = report is not None and report.state.get("claims", 0) > 0
                return report if busy and report.state["stats"]["submitted"] > 0 else None

            before = await eventually(victim_busy, timeout=60, what="the first dispatcher busy")
            one.send_signal(signal.SIGKILL)
            await one.wait()
            killed_at = time.monotonic()

            async def all_ended() -> bool:
                counts = await store.request_counts(status=[RequestStatus.PENDING, RequestStatus.SUBMITTED])
                return sum(counts.values()) == 0

            await eventually(all_ended, timeout=180, what="every request ended")
            took = time.monotonic() - killed_at
            done = [await store.get_request(rid) for rid in ids]
            failed = [
                (r.id, r.status, r.error)
                for r in done
                if r is None or r.status is not RequestStatus.SUCCEEDED
            ]
            assert not failed, failed  # 0 lost
            assert creates(f1, f2) == COUNT  # 0 sent twice
            names = [*f1.cluster.instances, *f2.cluster.instances]
            assert sorted(names) == sorted(f"c{i:03d}.example" for i in range(COUNT))
            # the survivor follows both backends' recorded jobs now (its follow leases): a job
            # another process records on each ends
            picked = {"f1": sorted(f1.cluster.instances)[0], "f2": sorted(f2.cluster.instances)[0]}
            for backend, name in picked.items():
                await cp.shutdown_instance(name, backend=backend)

            async def stopped() -> bool:
                for backend, name in picked.items():
                    instance = await store.get_instance(backend, name)
                    if instance is None or instance.status is not InstanceStatus.STOPPED:
                        return False
                return True

            await eventually(stopped, timeout=30, what="the shutdowns followed by the survivor")
            survivor = (await reports(store, {two.pid}))[two.pid]
            print(
                f"killed with {before.state['claims']} claims in flight, "
                f"{before.state['stats']['submitted']} submitted; the rest ended {took:.1f} s later; "
                f"survivor: {survivor.state['stats']}"
            )
            assert one.returncode == -signal.SIGKILL and two.returncode is None
