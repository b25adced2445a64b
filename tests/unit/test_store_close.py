"""Closing a SQLite store closes every connection it opened, also those a cancelled task held.

Python 3.13 warns (``ResourceWarning: unclosed database``) when the garbage collector meets a
``sqlite3.Connection`` nobody closed; under ``filterwarnings = error`` that failed a test at
random, in whichever test the collector happened to run: a dispatcher stopped while its root
tasks' first reads were connecting, and the connections they were making were left open
(found with a collector run after every test, CI's py313-fast failure of 2026-11-29).
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

from sqlalchemy import event, text

from synnefo_ganeti.store.db._engine import Database


def _open(driver: Any) -> bool:
    """Whether an aiosqlite connection still holds its ``sqlite3.Connection``."""
    return getattr(driver, "_connection", None) is not None


async def test_a_connection_left_checked_out_is_closed_with_the_store(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/store.db")
    await db.open()
    lost = await db.engine.connect()  # checked out and never given back, as by a task cut off
    await lost.execute(text("SELECT 1"))
    driver = (await lost.get_raw_connection()).driver_connection
    assert _open(driver)
    await db.close()
    assert not _open(driver)
    await lost.invalidate()  # (SQLAlchemy's own record of it: a warning of its own otherwise)
    del lost, driver
    gc.collect()  # an unclosed sqlite3.Connection would warn here (an error in this suite)


async def test_a_read_cancelled_while_it_connects_leaves_nothing_open(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/store.db")
    await db.open()
    await db.engine.dispose()  # an empty pool: the read below opens a new connection
    made: list[Any] = []
    event.listen(db.engine.sync_engine, "connect", lambda conn, _: made.append(conn.driver_connection))
    started = asyncio.Event()

    async def read() -> None:
        started.set()
        async with db.connect() as conn:
            await conn.execute(text("SELECT 1"))

    task = asyncio.create_task(read())
    await started.wait()
    task.cancel()  # while the pool opens the driver connection (several thread round trips)
    results = await asyncio.gather(task, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    await db.close()  # waits for the connect cut off, and closes what it made
    assert len(made) == 1, "the cancelled read had begun to connect"
    assert not _open(made[0])
    assert not db._abandoned
    made.clear()
    gc.collect()
