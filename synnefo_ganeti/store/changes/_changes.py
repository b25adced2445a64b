"""The change feed: reading the ``changes`` table in id order, and waiting for new rows.

Rows are written by database triggers (migrations 0005, 0010 and 0012) on every insert of a
request or an instance and on updates of a request's status, error or waiting reason and of an
instance's status, task, last error or node state (and by ``store/operations/_incidents.py`` with each
write of an incident, in its transaction: ``kind`` "incident"), so that every process's writes are in the
feed (the API's, the CLI's, the dispatcher's). On SQLite writes are serial, so ids commit in
order. On PostgreSQL writers take no common lock (migration 0015): ids may commit out of order,
and a read delivers only ids up to the feed's *horizon* (``._horizon``), below which nothing
can commit any more; so a reader never moves past an id that commits later, and never waits
for more than the writers' transactions in progress at its read.

Waiting (:class:`ChangeWaiter`): this process's writer wakes a waiter at once; on
PostgreSQL, LISTEN on ``synnefo_ganeti_changes`` (the triggers NOTIFY it, once a transaction)
wakes it for every process's commits, with a 30 s poll as a safety net; on SQLite, other
processes' commits are seen within ``poll_interval``. A waiter is *armed* before the read
that found nothing new, so that a commit between that read and the wait still wakes it.

How far a consumer got is kept in ``feed_cursors`` (:func:`read_cursor`,
:func:`write_cursor`; the webhook's is named ``"webhook"``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, cast

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    Row,
    Select,
    Table,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from synnefo_ganeti.store.changes._horizon import PATIENCE, horizon
from synnefo_ganeti.store.changes._rows import ChangeRow, FeedCursor
from synnefo_ganeti.store.db._engine import Database
from synnefo_ganeti.store.db._writer import Writer

__all__ = [
    "CHANGES_CHANNEL",
    "Change",
    "ChangeWaiter",
    "Changes",
    "read_cursor",
    "write_cursor",
]

#: the channel the change triggers NOTIFY (PostgreSQL), once a transaction, with an empty payload
CHANGES_CHANNEL = "synnefo_ganeti_changes"

#: seconds between looks on PostgreSQL when no NOTIFY came (a lost listener connection)
_PG_POLL = 30.0

changes_t = cast(Table, ChangeRow.__table__)
cursors_t = cast(Table, FeedCursor.__table__)


@dataclass(frozen=True, slots=True)
class Change:
    """One change of a request, an instance or an incident, as the feed (``ControlPlane.changes``) tells it.

    ``id`` grows with every change (resume after it); ``kind`` is ``"request"``,
    ``"instance"`` or ``"incident"``; ``key`` the request id, the instance id (its UUID) or
    the incident's id (``IncidentStore``); ``status``, ``task`` (instances only) and
    ``error`` (a request's error, an instance's last error message) are the values after the
    change (an incident's: ``status`` "open" or its outcome, ``task`` its repair, ``error``
    its detail); ``at`` when it was written (UTC);
    ``node_state`` (instances only) the state of its primary node after the change: None
    while up, "down" or "offline" (see ``StoredInstance.node_state``); ``waiting_reason``
    (requests only) why the dispatcher cannot place it now, None when it is not waiting (see
    ``Request.waiting_reason``).
    """

    id: int
    kind: Literal["request", "instance", "incident"]
    key: str
    status: str | None
    task: str | None
    error: str | None
    at: datetime
    node_state: str | None = None
    waiting_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON values (``at`` in ISO 8601): the webhook's body. ``node_state``
        is there for an instance's change only, ``waiting_reason`` for a request's (neither
        for an incident's)."""
        body = {
            "id": self.id,
            "kind": self.kind,
            "key": self.key,
            "status": self.status,
            "task": self.task,
            "error": self.error,
            "at": self.at.isoformat(),
        }
        if self.kind == "instance":
            body["node_state"] = self.node_state
        elif self.kind == "request":
            body["waiting_reason"] = self.waiting_reason
        return body


def _change(row: Row[Any]) -> Change:
    return Change(
        id=int(row.id),
        kind=row.kind,
        key=row.key,
        status=row.status,
        task=row.task,
        error=row.error,
        at=datetime.fromtimestamp(row.at, UTC),
        node_state=row.node_state,
        waiting_reason=row.waiting_reason,
    )


def _read_statement(upto: bool, limit: bool) -> Select[Any]:
    """The changes above ``:after`` in id order (and up to ``:upto``; at most ``:limit``)."""
    statement = select(changes_t).where(changes_t.c.id > bindparam("after", type_=BigInteger))
    if upto:
        statement = statement.where(changes_t.c.id <= bindparam("upto", type_=BigInteger))
    statement = statement.order_by(changes_t.c.id)
    return statement.limit(bindparam("limit", type_=Integer)) if limit else statement


#: the feed's reads, built once (a follower reads hundreds of times a second in a burst, and
#: building the statement each time was a twentieth of a cloud API's CPU there: issue 31), by
#: (up to a horizon, with a limit)
_READS: Final = {
    (upto, limit): _read_statement(upto, limit) for upto in (False, True) for limit in (False, True)
}


#: how long :meth:`Changes.follow` waits, once woken, before it reads: every commit of every
#: process that writes a change notifies, and at a burst's rate (benchmarks/burst.py: ~170
#: requests a second, a few commits each) a read for each cost the reader's process and the
#: database more than anything else it did; 10 ms gathers them (+7% requests a second there),
#: a delay well under what the feed promises (its end in the feed within 250 ms, p99)
FOLLOW_LINGER: Final = 0.01
_pause = asyncio.sleep  # (tests hold the linger open)


class ChangeWaiter:
    """Wakes when a change may have been committed: ``arm()``, read, then ``await wait(timeout)``.

    Made by :meth:`Changes.waiter` (an async context manager: on PostgreSQL it holds a
    LISTEN connection while open)."""

    def __init__(self, writer: Writer, notified: asyncio.Event | None, poll_interval: float) -> None:
        self._writer = writer
        self._notified = notified
        self._poll_interval = poll_interval
        self._wakeup = writer.wakeup

    def __repr__(self) -> str:
        how = "LISTEN" if self._notified is not None else f"polling every {self._poll_interval:g} s"
        return f"<ChangeWaiter {how}>"

    def arm(self) -> None:
        """Call before reading: what is committed from now on wakes the next :meth:`wait`."""
        self._wakeup = self._writer.wakeup
        if self._notified is not None:
            self._notified.clear()

    async def wait(self, timeout: float | None = None) -> None:
        """Until a commit since :meth:`arm` (or ``timeout``, by default the poll interval)."""
        if timeout is None:
            timeout = _PG_POLL if self._notified is not None else self._poll_interval
        waiters = [asyncio.ensure_future(self._wakeup.wait())]
        if self._notified is not None:
            waiters.append(asyncio.ensure_future(self._notified.wait()))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()


class Changes:
    """The change-feed repository."""

    def __init__(self, db: Database, writer: Writer, *, poll_interval: float) -> None:
        self.db = db
        self.writer = writer
        self.poll_interval = poll_interval
        #: PostgreSQL: how long a read waits for the writers of its horizon (see ._horizon)
        self.patience = PATIENCE

    def __repr__(self) -> str:
        return f"<Changes {self.db.display_url}>"

    async def list_changes(self, *, after: int = 0, limit: int | None = 1000) -> list[Change]:
        """The changes with an id above ``after``, in id order, at most ``limit``: every change
        committed before the call, none that a later commit could come below (PostgreSQL: up to
        the horizon, below the first id of every writer still running; see ._horizon)."""

        async def run(conn: AsyncConnection) -> list[Change]:
            params: dict[str, int] = {"after": after}
            upto: int | None = None
            if self.db.dialect == "postgresql":
                # only ids no later commit can come below (see ._horizon): read after it
                upto = await horizon(conn, patience=self.patience)
                if upto is None or upto <= after:
                    return []
                params["upto"] = upto
            if limit is not None:
                params["limit"] = limit
            query = _READS[(upto is not None, limit is not None)]
            return [_change(row) for row in (await conn.execute(query, params)).all()]

        return await self.db.read(run)

    async def last_id(self) -> int:
        """The id of the newest change (0 when there is none). PostgreSQL: of the newest change
        up to the horizon (see ._horizon), always a change's own id (the horizon itself may be an
        id no change has): every change committed after the call has a higher id; while a writer
        that began earlier still runs, so may some committed before it (a follower starting there
        sees them: at least once, never skipped)."""

        async def run(conn: AsyncConnection) -> int:
            query = select(func.max(changes_t.c.id))
            if self.db.dialect == "postgresql":
                while (upto := await horizon(conn, patience=self.patience)) is None:
                    pass
                query = query.where(changes_t.c.id <= upto)
            return int((await conn.execute(query)).scalar() or 0)

        return await self.db.read(run)

    async def cursor(self, name: str) -> int:
        """How far feed consumer ``name`` (the webhook: ``"webhook"``) got; 0 from the start."""
        return await self.db.call_read(lambda conn: read_cursor(conn, name))

    async def advance(self, name: str, last_id: int) -> int:
        """Move consumer ``name``'s cursor forward to ``last_id`` (never back); the cursor after."""
        return await self.writer.call(lambda conn: write_cursor(conn, name, last_id))

    @contextlib.asynccontextmanager
    async def waiter(self) -> AsyncIterator[ChangeWaiter]:
        """A :class:`ChangeWaiter` (PostgreSQL: LISTENing while the context is open)."""
        if self.db.dialect != "postgresql":
            yield ChangeWaiter(self.writer, None, self.poll_interval)
            return
        notified = asyncio.Event()

        def on_notify(*_args: object) -> None:
            notified.set()

        async with self.db.listen(CHANGES_CHANNEL, on_notify):
            yield ChangeWaiter(self.writer, notified, self.poll_interval)

    async def follow(
        self, since: int | None = None, *, batch: int = 1000, linger: float = FOLLOW_LINGER
    ) -> AsyncGenerator[Change, None]:
        """Every change after id ``since`` (None: after the newest one now), forever.

        Once woken by a commit, it waits ``linger`` seconds before reading, so that the changes
        of the commits made meanwhile come in the same read (see :data:`FOLLOW_LINGER`)."""
        async with self.waiter() as waiter:
            cursor = await self.last_id() if since is None else since
            while True:
                waiter.arm()
                found = await self.list_changes(after=cursor, limit=batch)
                for change in found:
                    cursor = change.id
                    yield change
                if len(found) < batch:
                    await waiter.wait()
                    if linger > 0:
                        await _pause(linger)


# -- feed cursors (in a transaction of the writer, or a read) ---------------------------------------


def read_cursor(conn: Connection, name: str) -> int:
    """How far consumer ``name`` got (0: from the start)."""
    value = conn.execute(select(cursors_t.c.last_id).where(cursors_t.c.name == name)).scalar()
    return int(value or 0)


def write_cursor(conn: Connection, name: str, last_id: int) -> int:
    """Move consumer ``name``'s cursor forward to ``last_id`` (never back); the cursor after."""
    now = datetime.now(UTC)
    current = conn.execute(select(cursors_t.c.last_id).where(cursors_t.c.name == name)).scalar()
    if current is None:
        conn.execute(insert(cursors_t).values(name=name, last_id=last_id, updated_at=now))
        return last_id
    if last_id > current:
        conn.execute(
            update(cursors_t).where(cursors_t.c.name == name).values(last_id=last_id, updated_at=now)
        )
        return last_id
    return int(current)
