"""The durable create requests' part of the :class:`~synnefo_ganeti.store.Store` facade.

:class:`RequestMethods` is a mixin :class:`Store` inherits: each method hands over to the
requests repository (:mod:`._requests_repo`, rows and transactions in :mod:`._requests`),
``self._requests``, which the Store builds. Kept apart so that the facade stays one
screenful per part; the methods, their names and signatures are the Store's public API.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Unpack

from synnefo_ganeti.store.instances._instances import InstanceStatus, StoredInstance
from synnefo_ganeti.store.requests import _deletes, _request_view
from synnefo_ganeti.store.requests._deletes import DueDelete
from synnefo_ganeti.store.requests._names import UniqueNames
from synnefo_ganeti.store.requests._requests import Request, RequestStatus
from synnefo_ganeti.store.requests._requests_repo import RequestPage, Requests
from synnefo_ganeti.store.requests._waiting import set_waiting

__all__ = ["RequestMethods"]


class RequestMethods:
    """Durable create requests: add, read, claim, place, submit, finish, cancel."""

    _requests: Requests

    async def add_request(
        self,
        spec: dict[str, Any],
        *,
        name: str,
        backend: str | None = None,
        request_id: str | None = None,
        unique_names: UniqueNames | None = None,
    ) -> tuple[Request, bool]:
        """A pending create request: (request, True), or for the same request again (it, False)."""
        return await self._requests.add(
            spec, name=name, backend=backend, request_id=request_id, unique_names=unique_names
        )

    async def get_request(self, request_id: str) -> Request | None:  # None: no such request
        return await self._requests.get(request_id)

    async def list_requests(
        self,
        *,
        status: Iterable[RequestStatus | str] | None = None,
        backend: str | None = None,
        limit: int | None = None,
        newest_first: bool = True,
        **page: Unpack[RequestPage],
    ) -> list[Request]:
        """Newest first (or oldest); by id with ``by_id`` or ``after`` (the last id seen)."""
        return await self._requests.list_requests(
            status=status, backend=backend, limit=limit, newest_first=newest_first, **page
        )

    async def request_counts(
        self, *, status: Iterable[RequestStatus | str] | None = None
    ) -> dict[tuple[str | None, str], int]:
        """(backend or None, status) -> number of requests; ``status`` counts only those (an
        index serves it: cheap to poll for the open ones while the final ones pile up)."""
        return await self._requests.counts(status=status)

    async def claim_requests(self, dispatcher: str, limit: int = 100) -> list[Request]:
        """Take up to ``limit`` pending requests nobody holds (PostgreSQL: SKIP LOCKED)."""
        return await self._requests.claim(dispatcher, limit)

    async def request_claimants(self, *, exclude: str) -> set[str]:
        return await self._requests.claimants(exclude=exclude)

    async def take_over_requests(self, old: str, new: str) -> list[Request]:
        """Move a dead dispatcher's pending requests to ``new``."""
        return await self._requests.take_over(old, new)

    async def release_requests(self, dispatcher: str) -> int:
        """Give back the requests ``dispatcher`` holds and has not placed."""
        return await self._requests.release(dispatcher)

    async def place_request(
        self,
        request_id: str,
        dispatcher: str,
        backend: str,
        instance: dict[str, Any],
        *,
        unique_names: UniqueNames | None = None,
    ) -> Request:
        """Before sending the create: the backend chosen, an attempt counted, the instance row
        (BUILD, ``instance`` = its add_instance fields) added, its id on the request: one transaction."""
        return await self._requests.place(
            request_id, dispatcher, backend, instance, unique_names=unique_names
        )

    async def unplace_request(self, request_id: str, dispatcher: str, *, error: str | None = None) -> Request:
        """Ganeti certainly got nothing: forget the backend and the BUILD row (placed anew later)."""
        return await self._requests.unplace(request_id, dispatcher, error=error)

    async def set_waiting_reason(self, request_id: str, dispatcher: str, reason: str | None) -> bool:
        """Why ``dispatcher``, which holds the request, cannot place it now (``Request.waiting_reason``;
        None clears it). False: not written (the request is no longer pending, held by
        ``dispatcher`` and unplaced, or has that reason already)."""
        return await self._requests.writer.call(
            lambda conn: set_waiting(conn, request_id, dispatcher, reason)
        )

    async def submitted_request(self, request_id: str, job_id: int, *, start: bool | None = None) -> Request:
        """The create was accepted as ``job_id``: the request is submitted and the job recorded
        against its instance (a job end stored already settles both at once)."""
        return await self._requests.submitted(request_id, job_id, start=start)

    async def finish_request(
        self,
        request_id: str,
        status: RequestStatus | str,
        *,
        error: str | None = None,
        dispatcher: str | None = None,
        instance_status: InstanceStatus | None = None,
    ) -> Request:
        """End a request that never became a job (no capacity, refused by Ganeti, canceled);
        its instance row, if placed, takes ``instance_status`` (ERROR for a refused create)."""
        return await self._requests.finish(
            request_id,
            RequestStatus(status),
            error=error,
            dispatcher=dispatcher,
            instance_status=instance_status,
        )

    async def mark_moving(self, request_id: str, job_id: int, *, backend: str, node: str, why: str) -> bool:
        """Before the dispatcher cancels ``job_id``, the create of ``request_id`` still queued on
        ``node`` (down or offline), to place it elsewhere: an attempt error saying so, by which
        the canceled job's end puts the request back to be placed, not canceled. False: the
        request no longer waits on that job."""
        return await self._requests.mark_moving(request_id, job_id, backend=backend, node=node, why=why)

    async def job_lost(
        self, request_id: str, job_id: int, *, error: str, stranded: tuple[str, str | None] | None = None
    ) -> bool:
        """Ganeti no longer knows the create job ``job_id`` the request waits on (a backend restored
        from a backup): back to "placed", unsubmitted, with ``error`` saying so; the dispatcher
        asks Ganeti for its job or instance before placing it again. False: its end came meanwhile.
        ``stranded`` (backend, node): Ganeti lists the job but will not run it (luxid never enqueued
        it); the request is then placed on that backend only (``store.stranded_backend``) and
        that job passed over (``store.stranded_jobs``)."""
        return await self._requests.job_lost(request_id, job_id, error=error, stranded=stranded)

    async def unmark_moving(self, request_id: str, job_id: int) -> bool:
        """The cancel :meth:`mark_moving` announced did not go through (the job runs): take its
        attempt error back."""
        return await self._requests.unmark_moving(request_id, job_id)

    async def cancel_request(self, request_id: str) -> tuple[Request, bool]:
        """Cancel in the database what can be (see :func:`_requests.request_cancel`)."""
        return await self._requests.cancel(request_id)

    # -- one server from request to delete (store/requests/_request_view.py, store/requests/_deletes.py) ---------------

    async def request_instance_view(self, instance_id: str) -> StoredInstance | None:
        """The instance ``instance_id`` of a request, as its request tells it while it has no row
        (not placed yet, between attempts, or ended with nothing made); None: no request has it."""
        request = await self._requests.db.call_read(
            lambda conn: _request_view.request_by_instance(conn, instance_id)
        )
        return None if request is None else _request_view.view_of_request(request)

    async def defer_delete(self, instance_id: str, *, request_id: str | None = None) -> bool:
        """Mark the instance to be deleted once what runs on it ends (its open request canceled
        for good); False: it is DESTROYED already."""
        return await self._requests.writer.call(
            lambda conn: _deletes.defer_delete(conn, instance_id, request_id)
        )

    async def deletes_due(self, limit: int = 100) -> list[DueDelete]:
        """The deferred deletes that may be done now (nothing runs on their instances any more)."""
        return await self._requests.db.call_read(lambda conn: _deletes.deletes_due(conn, limit))

    async def pending_deletes(self) -> int:
        """How many deferred deletes wait, due or not."""
        return await self._requests.db.call_read(_deletes.pending_deletes)

    async def clear_delete(self, instance_id: str) -> None:
        """The deferred delete of ``instance_id`` was sent (or is no longer needed)."""
        await self._requests.writer.call(lambda conn: _deletes.clear_delete(conn, instance_id))
