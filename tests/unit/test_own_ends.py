"""A dispatcher that does not hold a backend's follow lease reads no job file there: it learns
its creates' ends from the jobs the holder stored (``dispatch/_ends.py``, issue 31): failures as
well as successes, and again after the database dropped its listening connection."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
import pytest

from synnefo_ganeti.dispatch import Dispatcher, _ends
from synnefo_ganeti.store import RequestStatus
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import finished
from tests.unit.test_dispatchers_share_watch import two_dispatchers, watcher_of

_LISTENING = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = $1"
_LISTEN = 'LISTEN "synnefo_ganeti_events"'


async def listening(raw: Any, count: int) -> bool:
    return bool(await raw.fetchval(_LISTENING, _LISTEN) == count)


def no_claims(d: Dispatcher) -> None:
    """``d`` claims nothing more (it runs on: its submit loop, a root task, must not end)."""

    async def nothing(_room: int) -> int:
        return 0

    d._claim_limit = nothing  # type: ignore[method-assign]


def learned_all(d: Dispatcher) -> bool:
    return not d._jobs and d.allocator.in_flight("f1") == 0


async def test_a_failed_create_of_the_other_dispatcher_is_learned_from_the_store(pg_url: str) -> None:
    async with two_dispatchers(pg_url) as (f1, cp, holder, other):
        no_claims(holder)  # every request goes to the other one
        read_before = watcher_of(other).stats.files_read
        await eventually(lambda: other.allocator.view("f1").catalog is not None, what="f1's catalog")
        warm = await finished(cp, await cp.request_instance(spec("warm.example")), timeout=60)
        assert warm.status is RequestStatus.SUCCEEDED
        f1.cluster.oses.clear()  # the next create's job fails in Ganeti (no such OS)
        failed = await finished(cp, await cp.request_instance(spec("noos.example")), timeout=60)
        assert failed.status is RequestStatus.FAILED and failed.error is not None
        assert "noos.example" not in f1.cluster.instances
        await eventually(lambda: learned_all(other), what="both ends learned by the other")
        # the failed create may be sent twice: Ganeti's "OS missing" is the backend's reason, and the
        # request is placed again while the dispatcher's catalog of f1 still lists the OS (CI, once)
        sent = other.stats.submitted
        assert sent in (2, 3) and holder.stats.submitted == 0, (other.stats, holder.stats)
        assert other.stats.ends_read == sent  # the success and each failure, each once
        assert watcher_of(other).stats.files_read == read_before  # no job file read


async def test_ends_are_read_again_after_the_database_drops_the_listening_connection(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_ends, "OWN_ENDS_RETRY", 0.1)
    caplog.set_level(logging.INFO, logger="synnefo_ganeti.dispatch")
    async with two_dispatchers(pg_url) as (_f1, cp, holder, other):
        no_claims(holder)
        raw: Any = await asyncpg.connect(pg_url.replace("postgresql+asyncpg", "postgresql"))
        try:
            # the other listens (the holder, which follows every backend, does not)
            await eventually(lambda: listening(raw, 1), what="the other listening, the holder not")
            assert other._reads_own_ends("f1") and not holder._reads_own_ends("f1")
            killed = await raw.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query = $1",
                _LISTEN,
            )
            assert killed == 1
            await eventually(lambda: "dropped the LISTEN connection" in caplog.text, what="the drop seen")
            await eventually(lambda: raw.fetchval(_LISTENING, _LISTEN), what="listening again", timeout=30)
        finally:
            await raw.close()
        ids = [await cp.request_instance(spec(f"after{i}.example")) for i in range(5)]
        done = await asyncio.gather(*(finished(cp, rid, timeout=60) for rid in ids))
        assert all(r.status is RequestStatus.SUCCEEDED for r in done)
        await eventually(lambda: learned_all(other), what="every end learned by the other")
        assert other.stats.ends_read == other.stats.submitted == 5
