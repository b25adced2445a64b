"""The fake writes its queue directory as Ganeti does, seen through real inotify.

Ganeti never writes ``job-<id>`` in place: each version is a temp file (luxid's
``job-<id>-<pid>-<n>.tmp``, the executor's ``job-<id><8 chars>.new``) renamed over it.
A watcher that follows ``MOVED_TO job-<id>`` sees every version and never a partial one.
"""

from __future__ import annotations

import asyncio
import re

from asyncinotify import Inotify, Mask

from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import eventually

LUXID_TEMP = re.compile(r"^job-(\d+)-(\d+)-(\d+)\.tmp$")
EXECUTOR_TEMP = re.compile(r"^job-(\d+)[a-z0-9]{8}\.new$")
SERIAL_TEMP = re.compile(r"^serial-\d+-\d+\.tmp$")


async def test_every_version_arrives_by_rename(tmp_path) -> None:
    queue = tmp_path / "queue"
    queue.mkdir()
    events: list[tuple[str, Mask]] = []
    with Inotify() as inotify:
        inotify.add_watch(
            queue, Mask.CREATE | Mask.CLOSE_WRITE | Mask.MOVED_FROM | Mask.MOVED_TO | Mask.MODIFY
        )

        async def collect() -> None:
            async for event in inotify:  # runs until cancelled: every event must land at once
                events.append((event.name.name if event.name else "", event.mask))  # noqa: PERF401

        collector = asyncio.create_task(collect())
        async with FakeGaneti(tls=False, queue_dir=queue, op_times={"OP_INSTANCE_CREATE": 0.02}) as fake:
            params = {"instance_name": "vm1", "mode": "create", "disk_template": "diskless", "disks": [],
                      "nics": [{}], "os_type": "noop", "pnode": "node1.fake.test", "name_check": False,
                      "ip_check": False}  # fmt: skip
            job_id = fake.cluster.submit([("OP_INSTANCE_CREATE", params)], resource="instances")
            job = f"job-{job_id}"

            def last_version_seen() -> bool:
                final = fake.cluster.job(job_id).status.is_final  # type: ignore[union-attr]
                renames = sum(1 for name, mask in events if name == job and mask & Mask.MOVED_TO)
                return final and renames >= 10

            await eventually(last_version_seen, what="the final version's rename")
        collector.cancel()
    names = [name for name, _ in events]
    # the job file itself is never created, modified or closed after writing: only renamed onto
    assert all(mask & Mask.MOVED_TO for name, mask in events if name == job)
    moved_to = [name for name, mask in events if mask & Mask.MOVED_TO and name == job]
    assert len(moved_to) == 10  # queued x3, waiting, running, 4 log lines, success
    temps = [name for name, mask in events if mask & Mask.MOVED_FROM]
    luxid = [t for t in temps if LUXID_TEMP.match(t)]
    executor = [t for t in temps if EXECUTOR_TEMP.match(t)]
    assert len(luxid) == 3 and len(executor) == 7
    assert all(LUXID_TEMP.match(t).group(1) == str(job_id) for t in luxid)  # type: ignore[union-attr]
    assert any(SERIAL_TEMP.match(t) for t in temps) and "serial" in names
    # each temp file is written and closed before its rename
    for temp in luxid + executor:
        sequence = [mask for name, mask in events if name == temp]
        assert sequence[0] & Mask.CREATE and sequence[-1] & Mask.MOVED_FROM
        assert any(mask & Mask.CLOSE_WRITE for mask in sequence)
    # the serial file is written before the job's first version
    assert names.index("serial") < names.index(job)
