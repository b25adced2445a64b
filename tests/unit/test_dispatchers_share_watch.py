"""Two dispatchers that watch one queue folder (issue 31 item 2): the holder of the backend's
follow lease reads every job file; the other reads none (its watch paused), and learns its
creates' ends from the jobs the holder stored (``dispatch/_ends.py``); a lease taken over has the
folder watched and read again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from synnefo_ganeti import ControlPlane
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.store import RequestStatus, Store
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import backend, creates, fakes, finished, running, settings_for


def options(db_url: str, fake: Any) -> Any:
    settings = settings_for(db_url, [backend("f1", fake, queue_dir=str(fake.queue_dir))], report_interval=0.5)
    return settings.model_copy(
        update={"reconcile": settings.reconcile.model_copy(update={"interval": 86_400})}
    )


def watcher_of(d: Dispatcher) -> Any:
    watcher = d._backends["f1"].watcher
    assert watcher is not None, "the backend's queue folder is watched"
    return watcher


@asynccontextmanager
async def two_dispatchers(pg_url: str) -> AsyncIterator[tuple[Any, ControlPlane, Dispatcher, Dispatcher]]:
    """A fake f1 with a queue folder, an API and two dispatchers on PostgreSQL, once both claim
    and one holds f1's follow lease: (the fake, the API, the holder, the other)."""
    async with fakes(1) as (f1,):
        settings = options(pg_url, f1)
        async with Store(pg_url) as store, ControlPlane(settings, store=store) as cp:
            d1 = Dispatcher(settings, dispatcher_id="one", status_server=False)
            d2 = Dispatcher(settings, dispatcher_id="two", status_server=False)
            async with running(d1), running(d2):
                await eventually(
                    lambda: (
                        all(d.leases is not None and d.leases.claimers() == 2 for d in (d1, d2))
                        and sum(len(d.leases.held) for d in (d1, d2) if d.leases is not None) == 1
                    ),
                    what="both dispatchers claiming, one holding f1's lease",
                )
                holder, other = (d1, d2) if d1.leases is not None and d1.leases.holds("f1") else (d2, d1)
                yield f1, cp, holder, other


async def test_the_holder_reads_every_job_file_and_the_other_none(pg_url: str) -> None:
    count = 60
    async with two_dispatchers(pg_url) as (f1, cp, holder, other):
        holder_w, other_w = watcher_of(holder), watcher_of(other)
        read_before = other_w.stats.files_read
        ids = [await cp.request_instance(spec(f"w{i:03d}.example", memory=128)) for i in range(count)]
        done = await asyncio.gather(*(finished(cp, rid, timeout=240) for rid in ids))
        assert [r.error for r in done if r.status is not RequestStatus.SUCCEEDED] == []
        assert creates(f1) == count  # 0 sent twice
        # both learned the ends of their own creates: no reservation left behind
        await eventually(lambda: not holder._jobs and not other._jobs, what="every end learned")
        assert other.stats.submitted > 0 and holder.stats.submitted > 0
        # the other's from the store, where the holder stored them: each one once
        assert other.stats.ends_read == other.stats.submitted
        assert holder.stats.ends_read == 0
        # the other read no job file: its watch is paused (no inotify instance); the holder all
        assert other_w.stats.files_read == read_before
        assert other_w.paused and other_w.stats.pauses >= 1 and not holder_w.paused
        assert holder_w.stats.files_read >= count
        assert other.allocator.in_flight("f1") == 0  # each end reached its allocator

        # the holder goes: the other takes the lease and reads the folder again
        scans = other_w.stats.scans
        holder.stop()
        await eventually(
            lambda: other.leases is not None and other.leases.holds("f1"),
            what="lease taken",
            timeout=30,
        )
        await eventually(lambda: other_w.stats.scans > scans, what="the folder read again")
        assert not other_w.paused
        rid = await cp.request_instance(spec("after.example", memory=128))
        assert (await finished(cp, rid, timeout=60)).status is RequestStatus.SUCCEEDED
