"""What every part of the dispatcher shares: its state, its counters and the small steps
(pause, fail, cancel) that the submitter and crash recovery both take.

The dispatcher is one object built in layers, one module each: this base, the per-backend
wiring (:mod:`._wiring`), crash recovery (:mod:`._recovery`), the submitter
(:mod:`._submitter`) and the lifecycle (:mod:`._dispatcher`, the public :class:`Dispatcher`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from synnefo_ganeti import metrics
from synnefo_ganeti._backends import BackendResources
from synnefo_ganeti.allocate import Allocator, BackendView, Reservation
from synnefo_ganeti.config import BackendSettings, Settings
from synnefo_ganeti.control._validate import Catalogs
from synnefo_ganeti.daemon import StatusServer, Supervisor, SystemdNotifier
from synnefo_ganeti.dispatch._amqp import AmqpPublisher
from synnefo_ganeti.dispatch._leases import FollowLeases
from synnefo_ganeti.dispatch._liveness import DispatcherLock, new_dispatcher_id
from synnefo_ganeti.dispatch._tracker import JobTracker
from synnefo_ganeti.dispatch._webhook import WebhookDeliverer
from synnefo_ganeti.errors import GanetiError, JobNotFoundError
from synnefo_ganeti.health import HealthMonitor
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.rapi import CancelResult, RapiClient
from synnefo_ganeti.reconcile import Report
from synnefo_ganeti.store import InstanceStatus, Request, RequestStatus, Store
from synnefo_ganeti.watch import QueueWatcher

__all__ = ["DispatcherBase", "DispatcherStats"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: how long a backend that refused a create (503, unreachable, auth or TLS failure) is left out of placement
REFUSING_SECONDS = 15.0
#: a cancel Ganeti refused because its scheduler does not hold the job yet, which it lists
#: "queued" (luxid writes a new job to every master candidate before it enqueues it: with one
#: dead, a whole RPC timeout): sent again every NOT_ENQUEUED_PAUSE s, for up to NOT_ENQUEUED_WAIT s
NOT_ENQUEUED_PAUSE = 1.0
NOT_ENQUEUED_WAIT = 60.0


@dataclass(slots=True)
class DispatcherStats:
    claimed: int = 0
    submitted: int = 0
    resubmitted: int = 0  # sent again after Ganeti was asked and had nothing
    recovered: int = 0  # found in Ganeti after a crash (job or instance): not sent again
    failed: int = 0
    canceled: int = 0
    placement_retries: int = 0
    capacity_retries: int = 0  # creates that failed for lack of room, placed again
    moved: int = 0  # creates canceled while queued on a node that went down, placed again
    stranded: int = 0  # creates Ganeti listed but never enqueued, placed again on their backend
    deletes_followed: int = 0  # deletes asked while a create or action ran, sent once it ended
    node_retries: int = 0  # creates that failed because of their node (down, offline), placed again
    ends_read: int = 0  # its creates' ends read from the store, where another dispatcher stored them
    reconcile_passes: int = 0
    started_at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class _Backend:
    settings: BackendSettings
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    tracker: JobTracker | None = None
    watcher: QueueWatcher | None = None
    submit_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(8))


class DispatcherBase(BackendResources):
    """The dispatcher's state; see :class:`~synnefo_ganeti.dispatch.Dispatcher`."""

    _usage = "use 'await Dispatcher(settings).run()'"

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        clients: Mapping[str, RapiClient] | None = None,
        config_path: str | Path | None = None,
        dispatcher_id: str | None = None,
        status_server: bool = True,
        notifier: SystemdNotifier | None = None,
        freeze_gc: bool = False,
    ) -> None:
        super().__init__(settings, store=store, clients=clients)
        self.id = dispatcher_id or new_dispatcher_id()
        self.config_path = Path(config_path) if config_path is not None else settings.source
        self.stats = DispatcherStats()
        self.allocator = Allocator(settings.dispatcher.strategy)
        self.health: HealthMonitor | None = None
        self.status: StatusServer | None = None
        #: the change-feed webhook's deliverer while it runs ([notify] url set)
        self.webhook: WebhookDeliverer | None = None
        #: the change feed's AMQP publisher while it runs ([notify] amqp_url set)
        self.amqp: AmqpPublisher | None = None
        self.notifier = notifier or SystemdNotifier()
        #: called with the status server's application before it starts (the console's routes)
        self.status_setup: list[Callable[[web.Application], None]] = []
        #: called with each reconcile pass's report (the console shows the last one per backend)
        self.on_reconcile: list[Callable[[Report], None]] = []
        #: the root tasks (loops, per-backend trackers and watchers); a new one per run()
        self.supervisor = Supervisor("dispatcher", logger=log)
        self.ready = asyncio.Event()
        self._status_wanted = status_server
        self._freeze_gc = freeze_gc  # the collector set for a daemon once started (_gc.py)
        self._restore_gc: Callable[[], None] | None = None
        self._lock: DispatcherLock | None = None
        self._backends: dict[str, _Backend] = {}
        self._stop = asyncio.Event()
        self._claiming = True
        self._wake = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        # (backend, job id) -> the reservation and when the job was recorded
        self._jobs: dict[tuple[str, int], Reservation] = {}
        # (backend, create job id) -> its request; request id -> backends its create failed on
        # for a reason of theirs (the OS missing, the instance policy): not placed there again
        self._job_requests: dict[tuple[str, int], str] = {}
        self._avoid: dict[str, set[str]] = {}
        #: per backend what it offers (OSes, ipolicy), for placement (control/_validate.py)
        self.catalogs = Catalogs(self.client)
        self._health_task: asyncio.Task[Any] | None = None
        # nodes down or offline (dispatch/_node_watch.py): the root task reading them, the nodes
        # a failed job named (backend -> nodes) not written yet and what wakes it for them, and
        # when each backend's nodes were last written (monotonic)
        self._nodes_task: asyncio.Task[Any] | None = None
        self._node_signs: dict[str, set[str]] = {}
        self._node_wake = asyncio.Event()
        self._nodes_written: dict[str, float] = {}
        self._reload_lock = asyncio.Lock()
        # backend -> (when, the listing of its jobs by reason) for crash recovery
        self._job_listings: dict[
            str, tuple[float, asyncio.Future[dict[str, list[tuple[int, JobStatus]]]]]
        ] = {}
        # request id -> since when its create's fate is unknown (Ganeti is asked about it)
        self._check_since: dict[str, float] = {}
        # dispatcher id -> when its lock was first seen free (PostgreSQL)
        self._suspects: dict[str, float] = {}
        #: the backends whose recorded jobs and nodes this dispatcher reads (``_leases``; made on start)
        self.leases: FollowLeases | None = None

    def __repr__(self) -> str:
        return (
            f"<Dispatcher {self.id} backends=[{', '.join(self._backends)}] in flight={len(self._inflight)}>"
        )

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake at once when the dispatcher stops (a request waiting for room or for
        an answer from Ganeti then leaves its claim for the next dispatcher)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    async def _cancel(self, request: Request) -> None:
        await self.store.finish_request(
            request.id,
            RequestStatus.CANCELED,
            error="canceled before it was submitted",
            dispatcher=self.id,
            instance_status=InstanceStatus.DESTROYED,
        )
        self.stats.canceled += 1
        metrics.REQUESTS.labels("canceled").inc()

    async def _cancel_queued(self, client: RapiClient, job_id: int) -> tuple[CancelResult, bool]:
        """``DELETE /2/jobs/ID``, patient with a job Ganeti has written but not enqueued yet; returns
        Ganeti's last answer and whether the job is stranded.

        A create found in the job list after its POST's answer was lost (or answered late) may
        still be on its way into luxid's scheduler: the cancel then answers "not found in queue"
        while ``/2/jobs/ID`` shows it queued, and the job runs a moment later. Such a cancel is
        sent again (:data:`NOT_ENQUEUED_PAUSE`, up to :data:`NOT_ENQUEUED_WAIT`) until Ganeti
        answers otherwise; a job that ended, or that Ganeti does not know, is left to its end
        (or to the reservation sweep, :mod:`._reservations`). One still listed queued and still
        not in the scheduler after :data:`NOT_ENQUEUED_WAIT` is stranded: luxid wrote it and will
        not run it until it restarts (the 3-node lab with a master candidate dead, 2026-12-01).
        Raises :class:`GanetiError`."""
        deadline = time.monotonic() + NOT_ENQUEUED_WAIT
        result = await client.cancel_job(job_id)
        while not result.success and result.not_in_queue and self._claiming:
            try:
                job = await client.get_job(job_id)
            except JobNotFoundError:
                return result, False  # unknown to Ganeti: lost (the reservation sweep settles its request)
            if job.is_final:
                return result, False  # ended: the queue's end settles its request
            if job.status is JobStatus.QUEUED:
                if time.monotonic() >= deadline:
                    return result, True
                log.info(
                    "job %d is listed but not in Ganeti's scheduler yet; its cancel is sent again", job_id
                )
                await self._pause(NOT_ENQUEUED_PAUSE)
            result = await client.cancel_job(job_id)
        return result, False

    async def _job_stranded(self, backend: str, node: str | None, job_id: int, request_id: str) -> bool:
        """Ganeti lists ``job_id`` queued but will not run it (:meth:`_cancel_queued`): the request
        is placed again, on that backend only (:class:`~._reservations.ReservationSweep`)."""
        raise NotImplementedError

    async def _cancel_sent(self, request: Request, client: RapiClient) -> None:
        """A cancel asked for while the create was being sent: cancel its job if still queued."""
        assert request.job_id is not None
        try:
            result, stranded = await self._cancel_queued(client, request.job_id)
        except GanetiError as exc:
            log.warning("request %s: cancel of job %d failed (%s)", request.id, request.job_id, exc)
            return
        if result.success:
            await self.store.finish_request(
                request.id, RequestStatus.CANCELED, error=f"job {request.job_id} canceled"
            )
            self.stats.canceled += 1
            metrics.REQUESTS.labels("canceled").inc()
        elif stranded and request.backend is not None:
            # never to run: back to be placed, where its cancel is honoured once Ganeti is asked
            await self._job_stranded(request.backend, None, request.job_id, request.id)
        else:
            log.warning(
                "request %s: canceled while its create was sent, but job %d was not canceled (%s)",
                request.id,
                request.job_id,
                result.message,
            )

    async def _fail(
        self,
        request: Request,
        error: str,
        *,
        placed: bool = False,
        instance_status: InstanceStatus | None = None,
    ) -> None:
        """``placed``: its instance row goes ERROR; ``instance_status``: it goes to that instead."""
        if instance_status is None and placed:
            instance_status = InstanceStatus.ERROR
        await self.store.finish_request(
            request.id,
            RequestStatus.FAILED,
            error=error,
            dispatcher=self.id,
            instance_status=instance_status,
        )
        self.stats.failed += 1
        metrics.REQUESTS.labels("failed").inc()
        log.warning("request %s failed: %s", request.id, error)

    def _leave_out(self, name: str) -> None:
        """``name`` refused a create: out of placement for :data:`REFUSING_SECONDS`."""
        view = self.allocator.view(name)
        self.allocator.update(_replace(view, refusing_until=time.monotonic() + REFUSING_SECONDS))


def _replace(view: BackendView, **changes: Any) -> BackendView:
    return dataclasses.replace(view, **changes)
