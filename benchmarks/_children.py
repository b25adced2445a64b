"""The benchmarks' child processes (fake Ganetis serving until their stdin closes)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


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
