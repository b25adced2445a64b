"""The control-plane facade: what a cloud API calls to create and manage instances.

``async with ControlPlane(settings) as cp:`` opens the store and one pooled RAPI
client per backend (lazily). Each call writes the database first and Ganeti second,
and records the job before it returns:

* ``create_instance`` writes the instance row (BUILD, with what it expects Ganeti to
  report: beparams, NICs, disks, tags), submits the create with the ownership tag
  added, then records the job id. A create Ganeti refused leaves the row in ERROR; a
  create whose fate is unknown leaves it in BUILD for the reconciler to settle.
* ``startup_instance``, ``shutdown_instance``, ``reboot_instance``, ``delete_instance``
  and ``modify_instance`` submit the job and record it against the instance; so do the
  operations of :class:`~synnefo_ganeti.control._operations.InstanceOperations` (console,
  resize, grow a disk, attach and detach NICs and disks, rename, reinstall, migrate,
  failover, tags) and ``catalog(backend)`` tells what a backend offers.

The instance's state then follows the jobs' ends as the watcher (or the reconciler)
stores them; a job whose end was stored before it was recorded is applied on record.

Durable requests (``request_instance``) only write a request row and return its id:
the dispatcher (``synnefo-ganeti dispatcher``) places, submits and records it, and
``wait_request`` tells how it ended. They survive crashes of the caller and of the
dispatcher; see :mod:`synnefo_ganeti.dispatch`.

Errors are typed so that a caller maps them to answers without reading messages: an
unknown instance or request is a :class:`~synnefo_ganeti.NotFoundError`, a name taken (or
a request id reused for another instance) a :class:`~synnefo_ganeti.ConflictError`, a
database that cannot answer now a :class:`~synnefo_ganeti.StoreError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Self

from synnefo_ganeti import metrics
from synnefo_ganeti._backends import BackendResources
from synnefo_ganeti.config import Settings
from synnefo_ganeti.control._actions import Owns, run_action, submit_refused
from synnefo_ganeti.control._capacity import CapacityMethods
from synnefo_ganeti.control._deletes import DeleteFollower, delete_always, follow_deletes
from synnefo_ganeti.control._lookup import find_instance, resolve_instance
from synnefo_ganeti.control._networks import NetworkMethods
from synnefo_ganeti.control._node_moves import NodeMoves
from synnefo_ganeti.control._nodes import NodeMethods
from synnefo_ganeti.control._operations import InstanceOperations
from synnefo_ganeti.control._validate import SpecChecker
from synnefo_ganeti.errors import (
    ConfigError,
    ConflictError,
    CreateOutcomeUnknownError,
    GanetiError,
    NotFoundError,
    RequestTimeoutError,
)
from synnefo_ganeti.rapi import InstanceSpec, RapiClient, RebootType
from synnefo_ganeti.reconcile._observe import expectation, expected_beparams
from synnefo_ganeti.store import (
    Change,
    InstanceAction,
    InstanceStatus,
    Request,
    RequestStatus,
    Store,
    StoredInstance,
)

__all__ = ["ControlPlane"]

log = logging.getLogger("synnefo_ganeti.control")


class ControlPlane(
    InstanceOperations,  # console, resize, NICs and disks, rename, reinstall, moves, tags, catalog
    NetworkMethods,  # create_network, delete_network, get_network, list_networks (control/_networks.py)
    NodeMethods,  # nodes, node, drain_node, undrain_node (control/_nodes.py)
    NodeMoves,  # evacuate_node, failover_node (control/_node_moves.py)
    CapacityMethods,  # capacity (control/_capacity.py)
):
    """One control plane over the backends of ``settings``.

    ``store`` and ``clients`` (name -> open :class:`RapiClient`) may be given; what the
    control plane opens itself (the store, one pooled client per backend on first use)
    it closes on exit. It holds them (a :class:`BackendResources`), it is not one.
    """

    _usage = "use 'async with ControlPlane(settings) as cp'"

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        clients: Mapping[str, RapiClient] | None = None,
    ) -> None:
        self._resources = BackendResources(settings, store=store, clients=clients)
        # specs checked against the backends' catalogs before anything is written (control/_validate.py)
        self._checker = SpecChecker(lambda: self.settings, self.client, drained=self._drained_backends)
        # the deletes this process deferred, followed while any waits (control/_deletes.py)
        self._deletes = DeleteFollower(lambda: self.store, self.client, self._owns)

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the store (unless one was given); clients open on first use."""
        await self._resources.open()

    async def close(self) -> None:
        """Close what the control plane opened (not a store or clients it was given)."""
        await self._deletes.close()
        await self._resources.close()

    @property
    def settings(self) -> Settings:
        return self._resources.settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        self._resources.settings = settings

    async def _drained_backends(self) -> set[str]:
        """The backends an operator drained (none known while the store is not open)."""
        try:
            store = self._resources.store
        except RuntimeError:
            return set()
        return await store.drained_backends()

    @property
    def store(self) -> Store:
        """The store (``RuntimeError`` before :meth:`open` or ``async with``)."""
        try:
            return self._resources.store
        except RuntimeError:
            raise RuntimeError(f"{type(self).__name__} is not open: {self._usage}") from None

    async def client(self, backend: str) -> RapiClient:
        """The pooled RAPI client of ``backend`` (opened on first use)."""
        return await self._resources.client(backend)

    def __repr__(self) -> str:
        names = ", ".join(backend.name for backend in self.settings.backends)
        return f"<ControlPlane backends=[{names}]>"

    # -- instances -------------------------------------------------------------------------------

    async def create_instance(self, spec: InstanceSpec, *, backend: str) -> tuple[StoredInstance, int]:
        """Create ``spec`` on ``backend``: the instance row (BUILD), the create job, the job recorded.

        Returns the instance as stored and the job id; the instance becomes STARTED (or
        STOPPED for ``start=False``) or ERROR when the job ends. A name already in the
        database on that backend (and not DESTROYED) raises :class:`ConflictError`.
        """
        settings = self.settings.backend(backend)
        if settings.drained:
            raise ConfigError(
                f"backend {backend} is drained: it takes no new instances (undrain it in the config first)"
            )
        if backend in await self.store.drained_backends():
            raise GanetiError(
                f"backend {backend} is drained by an operator: it takes no new instances "
                f"('synnefo-ganeti backends undrain {backend}' lets them in again)"
            )
        await self._checker.check(spec, backend=backend)  # ValidationError: nothing written
        tags = list(dict.fromkeys([*spec.tags, *self.settings.ownership.tags_for_new()]))
        submitted = spec.model_copy(update={"tags": tags})
        await self.store.add_instance(
            backend,
            spec.name,
            status=InstanceStatus.BUILD,
            owned=True,
            unique_names=self.settings.ownership.unique_names,  # a name taken: ConflictError, nothing written
            **expectation(spec, tags, self.settings.ownership.tag_namespace),
        )
        try:
            job_id = await (await self.client(backend)).create_instance(submitted)
        except CreateOutcomeUnknownError:
            log.warning(
                "create of %s on %s: outcome unknown; the instance stays BUILD until the reconciler settles it",
                spec.name,
                backend,
            )
            raise
        except GanetiError as exc:
            # the instance ERROR, and its last_error says why
            await submit_refused(self.store, backend, spec.name, InstanceAction.CREATE, exc)
            raise
        instance = await self.store.record_instance_job(
            backend, spec.name, job_id, InstanceAction.CREATE, start=spec.start
        )
        return instance, job_id

    async def _submit(
        self,
        backend: str,
        name: str,
        action: InstanceAction,
        call: Callable[[RapiClient], Awaitable[int]],
        *,
        params: dict[str, Any] | None = None,
    ) -> int:
        instance = await self.store.get_instance(backend, name)
        if instance is None:
            raise NotFoundError(
                f"instance {name} of backend {backend} is not in the database; "
                "only instances this control plane created (or adopted) can be managed through it"
            )
        # one action at a time: the task reserved first, a busy instance a ConflictError (control/_actions.py)
        client = await self.client(backend)
        return await run_action(self.store, client, backend, name, action, call, params=params)

    async def delete_instance(
        self, name: str, *, backend: str | None = None, build_timeout: float | None = None
    ) -> int | None:
        """Delete the instance, at any stage, at once: never refused as busy, never waiting.

        Returns the remove's job id when it was sent now (DESTROYED once it succeeds, or fails
        because Ganeti has no such instance), the create's job id when that create was canceled
        before Ganeti started it (DESTROYED at once), or None: nothing was left to remove, or the
        delete follows what runs (control/_deletes.py): a request not submitted yet is canceled
        for good, a running create or action is followed by the remove as soon as it ends. The
        outcome comes by the change feed. A second delete returns the first one's job id.
        ``build_timeout``: how long to wait for a canceled create job to end (10 s by default).
        Without ``backend``, ``name`` is the instance's id (as for the other actions).
        """
        instance = await find_instance(self.store, name, backend)
        if instance is None:
            if backend is None:
                raise NotFoundError(
                    f"no instance has id {name}; check the id, or give the instance's name with its backend"
                )
            return await self._submit(backend, name, InstanceAction.REMOVE, lambda c: c.delete_instance(name))
        job_id, deferred = await delete_always(
            self.store, self.client, instance, owns=self._owns(), build_timeout=build_timeout
        )
        if deferred:
            log.info("delete of %s (%s): it follows what runs on it", instance.id, instance.name)
            self._deletes.kick()
        return job_id

    def _owns(self) -> Owns | None:
        ownership = self.settings.ownership  # (no mark configured: nothing is told "not ours")
        return ownership.owns if ownership.prefix is not None or ownership.tag is not None else None

    async def run_pending_deletes(self) -> int:
        """Send the deferred deletes whose instances nothing runs on any more; how many were sent.

        The dispatcher does this all the time, and this process while a delete it deferred
        waits; a cloud API with neither may call it (e.g. after each job end it learns of)."""
        return await follow_deletes(self.store, self.client, owns=self._owns())

    # without ``backend``, ``name`` is the instance's id (control/_lookup.py)
    async def startup_instance(self, name: str, *, backend: str | None = None) -> int:
        backend, name = await resolve_instance(self.store, name, backend)
        return await self._submit(backend, name, InstanceAction.STARTUP, lambda c: c.startup_instance(name))

    async def shutdown_instance(self, name: str, *, backend: str | None = None) -> int:
        backend, name = await resolve_instance(self.store, name, backend)
        return await self._submit(backend, name, InstanceAction.SHUTDOWN, lambda c: c.shutdown_instance(name))

    async def reboot_instance(
        self, name: str, *, backend: str | None = None, reboot_type: RebootType = "soft"
    ) -> int:
        backend, name = await resolve_instance(self.store, name, backend)
        return await self._submit(
            backend, name, InstanceAction.REBOOT, lambda c: c.reboot_instance(name, reboot_type=reboot_type)
        )

    async def modify_instance(
        self, name: str, *, backend: str | None = None, beparams: dict[str, Any]
    ) -> int:
        """Change beparams (memory, vcpus, ...); the recorded flavor follows when the job succeeds."""
        backend, name = await resolve_instance(self.store, name, backend)
        return await self._submit(
            backend,
            name,
            InstanceAction.MODIFY,
            lambda c: c.modify_instance(name, beparams=beparams),
            params=expected_beparams(beparams),
        )

    async def get_instance(self, name_or_id: str, *, backend: str | None = None) -> StoredInstance | None:
        """The instance with id ``name_or_id``, or (with ``backend``) named so there; None: none."""
        return await find_instance(self.store, name_or_id, backend)

    async def list_instances(
        self,
        *,
        backend: str | None = None,
        status: Iterable[InstanceStatus | str] | None = None,
        name_prefix: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[StoredInstance]:
        """Instances ordered by backend and name; by id with ``limit`` or ``after`` (the last id
        seen: the next page is ``after=page[-1].id``)."""
        return await self.store.list_instances(
            backend=backend, status=status, name_prefix=name_prefix, limit=limit, after=after
        )

    # -- the change feed -------------------------------------------------------------------------

    def changes(self, since: int | None = None) -> AsyncGenerator[Change, None]:
        """``async for change in cp.changes():`` every change of a request or an instance, forever.

        ``since=None``: the changes after the newest one when the iteration starts (what
        happens from then on); ``since=N``: those after change id ``N`` (resume with the
        ``id`` of the last change handled). Every process's writes are in it, in commit
        order; see docs/changes.md."""
        return self.store.changes(since)

    # -- durable requests ------------------------------------------------------------------------

    async def validate(self, spec: InstanceSpec, *, backend: str | None = None) -> None:
        """The checks ``request_instance`` and ``create_instance`` make first, alone: raise
        :class:`~synnefo_ganeti.ValidationError` (naming the field) unless ``spec`` is one
        ``backend`` (or, without it, some backend not drained) would take. Writes nothing;
        fetches the backends' catalogs on first use (an API may call it at start-up to have
        them ready)."""
        if backend is not None:
            self.settings.backend(backend)  # an unknown name is a ConfigError
        await self._checker.check(spec, backend=backend)

    async def request_instance(
        self, spec: InstanceSpec, *, backend: str | None = None, request_id: str | None = None
    ) -> str:
        """Write a durable create request and return its id (a UUID string) at once.

        The dispatcher places it (on ``backend`` if given), submits and records it;
        :meth:`wait_request` tells how it ended. ``request_id`` makes the call idempotent:
        the same id again returns the same request (with another spec, name or backend a
        :class:`ConflictError` naming the fields that differ). A name another instance (not
        DESTROYED) or open request holds (``[ownership] unique_names``) is a ConflictError.
        """
        if backend is not None:
            self.settings.backend(backend)  # an unknown name is a ConfigError now, not a failed request later
        await self._checker.check(spec, backend=backend)  # ValidationError: nothing written
        request, new = await self.store.add_request(
            spec.model_dump(mode="json"),
            name=spec.name,
            backend=backend,
            request_id=request_id,
            unique_names=self.settings.ownership.unique_names,
        )
        if new:
            metrics.REQUESTS.labels("pending").inc()
        return request.id

    async def get_request(self, request_id: str) -> Request:
        """The request as stored; :class:`NotFoundError` for an id the database does not hold."""
        request = await self.store.get_request(request_id)
        if request is None:
            raise NotFoundError(f"request {request_id} is not in the database; check the id")
        return request

    async def list_requests(
        self,
        *,
        status: Iterable[RequestStatus | str] | None = None,
        backend: str | None = None,
        limit: int | None = None,
        after: str | None = None,
        name_prefix: str | None = None,
    ) -> list[Request]:
        """Requests ordered by id: ``limit`` of them, with an id above ``after`` (the last id seen)."""
        return await self.store.list_requests(
            status=status, backend=backend, limit=limit, after=after, name_prefix=name_prefix, by_id=True
        )

    async def wait_request(self, request_id: str, *, timeout: float | None = None) -> Request:
        """Wait until the request ends (succeeded, failed or canceled) and return it.

        Raises :class:`RequestTimeoutError` after ``timeout`` seconds (the request goes on).
        Changes written by this process wake the wait at once; another process's (the
        dispatcher's) are seen within a poll of at most 0.5 s.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.02
        while True:
            request = await self.get_request(request_id)
            if request.is_final:
                return request
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise RequestTimeoutError(
                    f"request {request_id} has not ended within {timeout:g} s (it is {request.status}); "
                    "it goes on: wait again, or cancel it",
                    request_id=request_id,
                    status=request.status.value,
                )
            await self.store.wait_for_change(delay if left is None else min(delay, left))
            delay = min(delay * 2, 0.5)

    async def cancel_request(self, request_id: str) -> Request:
        """Cancel a request: one not yet submitted is canceled in the database (a dispatcher
        working on it stops before submitting); a submitted one through ``cancel_job`` while
        its job is still queued. A request that ended already is returned unchanged."""
        request, done = await self.store.cancel_request(request_id)
        if done or request.status is not RequestStatus.SUBMITTED:
            return request
        assert request.backend is not None and request.job_id is not None
        result = await (await self.client(request.backend)).cancel_job(request.job_id)
        if not result.success:
            latest = await self.get_request(request_id)
            if latest.is_final:
                return latest
            raise ConflictError(
                f"request {request_id}: its job {request.job_id} on {request.backend} could not be canceled "
                f"({result.message}); it is running already: delete the instance once it exists"
            )
        return await self.store.finish_request(
            request_id, RequestStatus.CANCELED, error=f"job {request.job_id} canceled"
        )
