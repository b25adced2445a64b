"""Why a pending request waits (``requests.waiting_reason``, migration 0012): written by the
dispatcher holding it when no backend takes it now (dispatch/_waiting.py), cleared when it is
placed (:func:`~synnefo_ganeti.store.requests._requests.place`, the batched ``place_many``) or ends
(``finish``). A change of it is a row of the change feed (the request triggers of 0012).

Functions taking a ``Connection`` run inside a store transaction.
"""

from __future__ import annotations

from sqlalchemy import Connection, update

from synnefo_ganeti.store.requests._requests import RequestStatus, requests_t

__all__ = ["set_waiting"]


def set_waiting(conn: Connection, request_id: str, dispatcher: str, reason: str | None) -> bool:
    """Write ``reason`` on the request if it is pending, held by ``dispatcher`` and not placed,
    and its reason is another (the same again writes nothing, so makes no change row). True:
    written."""
    result = conn.execute(
        update(requests_t)
        .where(
            requests_t.c.id == request_id,
            requests_t.c.status == RequestStatus.PENDING.value,
            requests_t.c.claimed_by == dispatcher,
            requests_t.c.backend_id.is_(None),
            requests_t.c.waiting_reason.is_distinct_from(reason),
        )
        .values(waiting_reason=reason)
    )
    return bool(result.rowcount)
