"""What the real-Ganeti tests share: the testbed's queue, instance names and specs, a watcher, polling."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from synnefo_ganeti import InstanceSpec, RapiClient
from synnefo_ganeti.store import Store
from synnefo_ganeti.watch import QueueWatcher
from tests import helpers

TESTBED = Path(__file__).parents[2] / "scripts" / "ganeti-testbed"
QUEUE_DIR = Path(os.environ.get("SYNNEFO_GANETI_TEST_QUEUE", "/var/lib/ganeti/queue"))
BACKEND = "testbed"
DEADLINE = 60.0  # seconds for a job or an instance to get there (the cluster runs ~2.5 jobs/s)


def ns(testbed, *command: str) -> list[str]:
    """The argv that runs ``command`` on the testbed's (master) node, for the version the tests run on:
    ``scripts/ganeti-testbed ns --version 3.1 gnt-job list`` (without it, ``ns`` goes to the machine's
    own version: on Debian 12 the 3.0 testbed, while the tests may be on 3.1)."""
    return [str(TESTBED), "ns", "--version", testbed.series, *command]


def ns30(*command: str) -> list[str]:
    """``ns`` on the 3.0 testbed (the ``ganeti3`` tests', which have no ``Testbed`` at hand)."""
    return [str(TESTBED), "ns", "--version", "3.0", *command]


def client(testbed, **kwargs: Any) -> RapiClient:
    kwargs.setdefault("ca_file", testbed.ca_file)
    return RapiClient(testbed.url, username=testbed.username, password=testbed.password, **kwargs)


def name(tag: str) -> str:
    # the pattern of test_real_ganeti.py, with a tag per test module: no two tests share a name
    return f"sg-{tag}-{uuid.uuid4().hex[:6]}.ganeti.test"


def spec(testbed, instance: str, **kwargs: Any) -> InstanceSpec:
    """A small diskless instance on the testbed's node (its fake hypervisor)."""
    kwargs = {"memory": 128, "pnode": testbed.node, "hypervisor": "fake"} | kwargs
    return helpers.spec(instance, **kwargs)


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
