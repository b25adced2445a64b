"""The change feed's horizon on PostgreSQL: the highest id no later commit can come below.

Writers take no common lock (migration 0015): two transactions may take change ids 7 and 8 and
commit 8 first. A reader that delivered 8 and moved its cursor there would never see 7. So a
reader delivers only ids up to the *horizon*: ``synnefo_ganeti_feed_safe_id()`` (migration
0021) gives the sequence's last value ``L`` and, read after it, the transactions writing change
rows now (each holds the feed writers' advisory lock, shared, from before it took its first id,
and a lock of that first id itself). Every id up to ``L`` belongs to a transaction that is either
done (committed, so any later snapshot sees it, or rolled back) or among those writers, whose
ids are all at or above their first. So the horizon is ``L``, or one below the lowest first id of
the writers running, whichever is lower: a reader does not wait for them. A writer stuck in a
transaction holds back the ids from its first on (by design: nothing may be skipped), and only
those.

A writer that holds the feed lock and no id lock yet (``waiting``) is between its ``nextval`` and
its id's lock, within one trigger call: :func:`horizon` looks again after a pause (1 ms, growing
to 20 ms) until there is none. After ``patience`` seconds it gives up and returns None ("nothing
new is safe yet"), which a follower takes as "read again later", and logs which writers hold it.
(Until 0021 a reader waited for every writer of its moment to end: about three looks at
``pg_locks`` a read in a burst.)

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

_HORIZON = text("SELECT safe_id, waiting FROM synnefo_ganeti_feed_safe_id()")
#: the pauses between looks while a writer is between its id and its id's lock (then the last)
_PAUSES: Final = (0.001, 0.002, 0.005, 0.01, 0.02)
#: how long a reader waits for the writers of one horizon before it gives up for this read
PATIENCE: Final = 10.0


async def horizon(conn: AsyncConnection, *, patience: float = PATIENCE) -> int | None:
    """The highest change id that is final now (see the module), or None when a writer still
    held the feed lock without its first id's lock after ``patience`` seconds.

    ``conn`` must not be inside a transaction that spans the looks: each is its own statement
    (READ COMMITTED), and so is the caller's read of the rows that follows."""
    row = (await conn.execute(_HORIZON)).one()
    if not row.waiting:
        return int(row.safe_id)
    deadline = time.monotonic() + patience
    for pause in itertools.chain(_PAUSES, itertools.repeat(_PAUSES[-1])):
        await asyncio.sleep(pause)
        row = (await conn.execute(_HORIZON)).one()
        if not row.waiting:
            return int(row.safe_id)
        if time.monotonic() >= deadline:
            log.warning(
                "change feed: %d writer transaction(s) held the feed lock without an id's lock "
                "for %.1f s (%s); changes after id %d wait for them",
                len(row.waiting),
                patience,
                ", ".join(sorted(row.waiting)),
                row.safe_id,
            )
            return None
    raise AssertionError("unreachable")  # (the pauses never run out)
