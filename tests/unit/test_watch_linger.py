"""The queue watcher's reader, woken, waits ``read_linger`` before it reads (issue 31): a job's
versions written meanwhile are read once, the last. Real inotify, real files, real databases;
the wait is held open by the test, not timed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from synnefo_ganeti.store import Store
from synnefo_ganeti.watch import _watcher
from tests._watch import lifecycle, new_backend, settle, statuses, watching, write_version
from tests.helpers import eventually


async def test_versions_written_while_the_reader_lingers_are_read_once(
    db_url: str, queue: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = new_backend("linger")
    waits: list[float] = []
    held, release = asyncio.Event(), asyncio.Event()

    async def hold(seconds: float) -> None:
        waits.append(seconds)
        held.set()
        await release.wait()

    monkeypatch.setattr(_watcher, "_linger", hold)
    versions = lifecycle(1)
    async with Store(db_url) as store, watching(queue, store, backend) as watcher:
        write_version(queue, 1, versions[0])
        await held.wait()  # woken by the first version, the reader waits
        for content in versions[1:]:  # the rest of the job's life meanwhile
            write_version(queue, 1, content)
        await eventually(
            lambda: watcher.stats.coalesced >= len(versions) - 1, what="every later version marked"
        )
        assert watcher.stats.files_read == 0
        release.set()
        await settle(watcher, store)
        assert watcher.stats.files_read == 1 and watcher.stats.versions == 1
        assert waits[0] == _watcher.READ_LINGER == watcher.read_linger
        assert await statuses(store, backend) == {1: "success"}


async def test_no_linger_reads_at_once(sqlite_url: str, queue: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_linger=0`` (a consumer that wants every version as it comes): no wait at all."""

    async def never(seconds: float) -> None:
        raise AssertionError(f"the reader waited {seconds} s")

    monkeypatch.setattr(_watcher, "_linger", never)
    backend = new_backend("nolinger")
    async with Store(sqlite_url) as store, watching(queue, store, backend, read_linger=0) as watcher:
        for content in lifecycle(2)[:2]:
            read = watcher.stats.versions
            write_version(queue, 2, content)
            await eventually(lambda read=read: watcher.stats.versions > read, what="the version to be read")
        await settle(watcher, store)
        assert watcher.stats.versions == 2
