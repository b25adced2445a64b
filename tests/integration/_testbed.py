"""What the real-Ganeti tests share: the testbed's queue, instance names and specs, a watcher, polling."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from synnefo_ganeti import InstanceSpec, RapiClient
from synnefo_ganeti.store import Store
from synnefo_ganeti.watch import QueueWatcher

TESTBED = Path(__file__).parents[2] / "scripts" / "ganeti-testbed"
QUEUE_DIR = Path(os.environ.get("SYNNEFO_GANETI_TEST_QUEUE", "/var/lib/ganeti/queue"))
BACKEND = "testbed"
DEADLINE = 60.0  # seconds for a job or an instance to get there (the cluster runs ~2.5 jobs/s)


def client(testbed) -> RapiClient:
    return RapiClient(
        testbed.url, username=testbed.username, password=testbed.password, ca_file=testbed.ca_file
    )


def name(tag: str) -> str:
    # the pattern of test_real_ganeti.py, with a tag per test module: no two tests share a name
    return f"sg-{tag}-{uuid.uuid4().hex[:6]}.ganeti.test"


def spec(testbed, instance: str) -> InstanceSpec:
    return InstanceSpec(
        name=instance,
        disk_template="diskless",
        os="noop",
        beparams={"memory": 128},
        pnode=testbed.node,
        hypervisor="fake",
    )


@contextlib.asynccontextmanager
async def watching(store: Store) -> AsyncIterator[tuple[QueueWatcher, asyncio.Task[None]]]:
    """A QueueWatcher on the testbed's queue, running until the block ends."""
    watcher = QueueWatcher(QUEUE_DIR, store, BACKEND, retry_interval=0.5)
    task = asyncio.create_task(watcher.run(), name="test watcher")
    try:
        await asyncio.wait_for(watcher.ready.wait(), 10)
        assert not task.done(), task
        yield watcher, task
    finally:
        watcher.stop()
        await asyncio.wait_for(task, 30)


async def until(what: str, check, timeout: float = DEADLINE) -> None:
    """Poll the async ``check`` until it is true."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"not true after {timeout:.0f} s: {what}")
        await asyncio.sleep(0.1)
