"""The change feed's horizon on PostgreSQL: the highest id no later commit can come below.

Writers take no common lock (migration 0015): two transactions may take change ids 7 and 8 and
commit 8 first. A reader that delivered 8 and moved its cursor there would never see 7. So a
reader delivers only ids up to the *horizon*: ``synnefo_ganeti_feed_horizon()`` gives the
sequence's last value ``L`` and, read after it, the transactions writing change rows now (each
holds the feed writers' advisory lock, shared, from before it took its first id). Every id up to
``L`` belongs to a transaction that is either done (committed, so any later snapshot sees it, or
rolled back) or among those writers. Once none of them runs any more (they are gone from
``pg_locks``, which happens after their commit is visible), ``L`` is the horizon.

Writers' transactions are short (a batch of the writer task), so the wait is a few
milliseconds: :func:`horizon` polls ``pg_locks`` with a growing pause (1 ms to 20 ms). A writer
stuck in a transaction holds the feed back (by design: nothing may be skipped); after
``patience`` seconds :func:`horizon` gives up and returns None ("nothing new is safe yet"),
which a follower takes as "read again later", and logs which writers hold it.

SQLite needs none of this: its writes are serial (``BEGIN IMMEDIATE``), so ids commit in order.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Final

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["FEED_LOCK_KEY", "horizon"]

log = logging.getLogger("synnefo_ganeti.store")

#: the feed writers' advisory lock key ("sgfd"; migration 0015), taken shared with the first id
FEED_LOCK_KEY: Final = int.from_bytes(b"sgfd", "big")

_HORIZON = text("SELECT last_id, writers FROM synnefo_ganeti_feed_horizon()")
#: the pauses between looks at the writers still running (then the last one, repeated)
_PAUSES: Final = (0.001, 0.002, 0.005, 0.01, 0.02)
#: how long a reader waits for the writers of one horizon before it gives up for this read
PATIENCE: Final = 10.0


async def horizon(conn: AsyncConnection, *, patience: float = PATIENCE) -> int | None:
    """The highest change id that is final now (see the module), or None when the writers of
    this moment were still running after ``patience`` seconds.

    ``conn`` must not be inside a transaction that spans the wait: each look is its own
    statement (READ COMMITTED), and so is the caller's read of the rows that follows."""
    row = (await conn.execute(_HORIZON)).one()
    last_id, writers = int(row.last_id), set(row.writers or ())
    if not writers:
        return last_id
    deadline = time.monotonic() + patience
    for pause in itertools.chain(_PAUSES, itertools.repeat(_PAUSES[-1])):
        await asyncio.sleep(pause)
        running = writers & set((await conn.execute(_HORIZON)).one().writers or ())
        if not running:
            return last_id
        if time.monotonic() >= deadline:
            log.warning(
                "change feed: %d writer transaction(s) still running after %.1f s (%s); "
                "changes after id %d wait for them",
                len(running),
                patience,
                ", ".join(sorted(running)),
                last_id,
            )
            return None
    raise AssertionError("unreachable")  # (the pauses never run out)
