"""Claims: a dispatcher takes pending requests nobody holds, gives back what it holds and has not
placed, and takes over a dead one's (step 2 of a request's life, :mod:`._requests`).

On PostgreSQL a claim is one statement: the oldest unclaimed rows nobody else is claiming are
locked (``FOR UPDATE SKIP LOCKED``: dispatchers never take the same row), taken and returned.
Functions taking a ``Connection`` run inside a store transaction.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, bindparam, select, update

from synnefo_ganeti.store.db._any import any_of
from synnefo_ganeti.store.requests._requests import (
    Request,
    RequestStatus,
    backends_t,
    requests_t,
    select_requests,
)

__all__ = ["claim", "claimants", "release", "take_over"]


def claim(conn: Connection, dispatcher: str, limit: int, *, skip_locked: bool) -> list[Request]:
    """Take up to ``limit`` pending requests nobody holds, oldest first.

    ``skip_locked`` (PostgreSQL): one statement, the rows nobody else is claiming locked and
    taken (``FOR UPDATE SKIP LOCKED``) and returned; SQLite (whose writes are serial): the ids
    read, then taken, then read."""
    now = datetime.now(UTC)
    if skip_locked:
        rows = conn.execute(_CLAIM_SKIP_LOCKED, {"b_limit": limit, "b_dispatcher": dispatcher, "b_now": now})
    else:
        ids = [row.id for row in conn.execute(_UNCLAIMED, {"b_limit": limit})]
        if not ids:
            return []
        conn.execute(_CLAIM, {"b_ids": ids, "b_dispatcher": dispatcher, "b_now": now})
        rows = conn.execute(_CLAIMED, {"b_ids": ids, "b_dispatcher": dispatcher})
    return sorted((Request.from_row(row) for row in rows), key=lambda r: (r.created_at, r.id))


# claim()'s statements, built once (the dispatcher claims many times a second in a burst)
_UNCLAIMED = (
    select(requests_t.c.id)
    .where(requests_t.c.status == RequestStatus.PENDING.value, requests_t.c.claimed_by.is_(None))
    .order_by(requests_t.c.created_at, requests_t.c.id)
    .limit(bindparam("b_limit"))
)
_UNCLAIMED_SKIP_LOCKED = _UNCLAIMED.with_for_update(skip_locked=True)
#: what a claim writes into each row it takes
_TAKE: dict[str, Any] = {
    "claimed_by": bindparam("b_dispatcher"),
    "claimed_at": bindparam("b_now"),
    "updated_at": bindparam("b_now"),
}
_CLAIM = (
    update(requests_t)
    .where(any_of(requests_t.c.id, "b_ids"), requests_t.c.claimed_by.is_(None))
    .values(_TAKE)
)
_CLAIMED = select_requests().where(
    any_of(requests_t.c.id, "b_ids"),
    requests_t.c.claimed_by == bindparam("b_dispatcher"),
)
# PostgreSQL's claim in one round trip (a dispatcher in a burst claims many times a second):
# the oldest unclaimed rows nobody else holds, locked, taken, and returned with their backend
_TAKEN = (
    update(requests_t)
    .where(requests_t.c.id.in_(_UNCLAIMED_SKIP_LOCKED.scalar_subquery()))
    .values(_TAKE)
    .returning(*requests_t.c)
    .cte("taken")
)
_CLAIM_SKIP_LOCKED = select(_TAKEN, backends_t.c.name.label("backend")).outerjoin(
    backends_t, backends_t.c.id == _TAKEN.c.backend_id
)


def claimants(conn: Connection, exclude: str) -> set[str]:
    """Dispatchers (other than ``exclude``) holding pending requests."""
    rows = conn.execute(
        select(requests_t.c.claimed_by)
        .where(
            requests_t.c.status == RequestStatus.PENDING.value,
            requests_t.c.claimed_by.is_not(None),
            requests_t.c.claimed_by != exclude,
        )
        .distinct()
    )
    return {row.claimed_by for row in rows}


def take_over(conn: Connection, old: str, new: str) -> list[Request]:
    """Move the pending requests of dispatcher ``old`` (known dead) to ``new``."""
    ids = [
        row.id
        for row in conn.execute(
            select(requests_t.c.id).where(
                requests_t.c.status == RequestStatus.PENDING.value, requests_t.c.claimed_by == old
            )
        )
    ]
    if not ids:
        return []
    now = datetime.now(UTC)
    conn.execute(
        update(requests_t)
        .where(requests_t.c.id.in_(ids), requests_t.c.claimed_by == old)
        .values(claimed_by=new, claimed_at=now, updated_at=now)
    )
    rows = conn.execute(select_requests().where(requests_t.c.id.in_(ids)))
    return sorted((Request.from_row(row) for row in rows), key=lambda r: (r.created_at, r.id))


def release(conn: Connection, dispatcher: str) -> int:
    """Give back the pending requests ``dispatcher`` holds and has not placed (shutdown): nobody
    is placing them now, so none has a waiting reason."""
    result = conn.execute(
        update(requests_t)
        .where(
            requests_t.c.status == RequestStatus.PENDING.value,
            requests_t.c.claimed_by == dispatcher,
            requests_t.c.backend_id.is_(None),
        )
        .values(claimed_by=None, claimed_at=None, updated_at=datetime.now(UTC), waiting_reason=None)
    )
    return int(result.rowcount or 0)
