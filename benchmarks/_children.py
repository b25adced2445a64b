"""The benchmarks' child processes (fake Ganetis serving until their stdin closes)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable
from typing import Any

import orjson


async def serve_fake(fake: Any) -> None:
    """In a child: start ``fake`` (a ``FakeGaneti``), write its world (URL, credentials, queue
    folder) to stdout as one JSON line for the parent, and serve until the parent closes stdin."""
    async with fake:
        world = {"url": fake.url, "username": fake.username, "password": fake.password,
                 "queue_dir": str(fake.queue_dir)}  # fmt: skip
        sys.stdout.buffer.write(orjson.dumps(world) + b"\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)


async def stop_children(processes: Iterable[asyncio.subprocess.Process], *, grace: float = 10.0) -> None:
    """Close each child's stdin (its signal to stop), wait ``grace`` seconds, then kill what is left."""
    processes = list(processes)
    for process in processes:
        if process.returncode is None and process.stdin is not None:
            process.stdin.close()
    for process in processes:
        try:
            await asyncio.wait_for(process.wait(), grace)
        except TimeoutError:
            process.kill()
            await process.wait()
