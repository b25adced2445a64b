"""The dispatcher's report of itself in the database (``dispatchers``; :class:`~synnefo_ganeti.store.StatusStore`).

Every ``[dispatcher] report_interval`` seconds (and once more when it stops) the dispatcher writes
whether every root task runs, which ones do, whether it takes new claims, and per backend its
creates in flight, the requests open there (pending or submitted), whether placement may use it
and the nodes it leaves out. After each reconcile pass it writes the pass's report per backend.
A console or CLI of its own (``synnefo-ganeti web`` as a separate process) reads both: a report
older than a few intervals is a dispatcher that is not alive, whatever it said last.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.reconcile import Report
from synnefo_ganeti.store import RequestStatus, StatusStore

if TYPE_CHECKING:
    from synnefo_ganeti.dispatch._base import DispatcherBase

__all__ = ["REPORT_TASK", "SelfReport"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: the root task's name
REPORT_TASK = "dispatch report"
_OPEN = (RequestStatus.PENDING, RequestStatus.SUBMITTED)


class SelfReport:
    """Writes one dispatcher's reports (see the module)."""

    def __init__(self, dispatcher: DispatcherBase) -> None:
        self.dispatcher = dispatcher
        self.status = StatusStore(dispatcher.store)
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.started_at = datetime.fromtimestamp(dispatcher.stats.started_at, UTC)
        #: reports written (a test waits for one)
        self.written = 0

    def __repr__(self) -> str:
        return f"<SelfReport of {self.dispatcher.id}: {self.written} written>"

    async def state(self) -> dict[str, Any]:
        """What the dispatcher says of itself now."""
        d = self.dispatcher
        counts = await d.store.request_counts(status=_OPEN)
        now = time.monotonic()
        in_flight: dict[str, int] = {}
        for backend, _job in d._jobs:
            in_flight[backend] = in_flight.get(backend, 0) + 1
        backends: dict[str, Any] = {}
        for name in d._backends:
            view = d.allocator.view(name)
            backends[name] = {
                "in_flight": in_flight.get(name, 0),
                "pending": counts.get((name, RequestStatus.PENDING.value), 0),
                "submitted": counts.get((name, RequestStatus.SUBMITTED.value), 0),
                "healthy": view.healthy,
                "drained": view.drained,
                "refusing": view.refusing_until is not None and view.refusing_until > now,
                "out_nodes": sorted(view.out_nodes),
                "stats_age": None if view.stats_at is None else round(now - view.stats_at, 1),
            }
        supervisor = d.supervisor
        return {
            "tasks": supervisor.running,
            "problem": supervisor.problem(),
            "claiming": d._claiming,
            "claims": len(d._inflight),
            "unplaced": counts.get((None, RequestStatus.PENDING.value), 0),
            # the backends whose recorded jobs and nodes it reads (its follow leases: dispatch/_leases.py)
            "follows": sorted(n for n in d._backends if d.leases is None or d.leases.holds(n)),
            "backends": backends,
            "stats": d.stats.to_json(),
        }

    async def write(self, *, stopped: bool = False) -> None:
        d = self.dispatcher
        await self.status.report_dispatcher(
            d.id,
            host=self.host,
            pid=self.pid,
            started_at=self.started_at,
            interval=d.settings.dispatcher.report_interval,
            healthy=d.supervisor.healthy and not stopped,
            state=await self.state(),
            stopped=stopped,
        )
        self.written += 1

    async def run(self) -> None:
        """The root task: a report every interval (a database that cannot take one now: the next)."""
        while True:
            try:
                await self.write()
            except GanetiError as exc:
                log.warning(
                    "dispatcher %s: cannot write its report (%s); trying again", self.dispatcher.id, exc
                )
            await asyncio.sleep(self.dispatcher.settings.dispatcher.report_interval)

    async def reconciled(self, report: Report) -> None:
        """Store each backend's part of a reconcile pass's report."""
        for backend in report.backends:
            stored = {
                "ok": backend.ok,
                "error": backend.error,
                "duration": round(backend.duration, 3),
                "observed": backend.observed,
                "settled": backend.settled,
                "marked": backend.marked,
                "drifts": [
                    {
                        "kind": drift.kind.value,
                        "instance": drift.instance,
                        "detail": drift.detail,
                        "fixed": drift.fixed,
                        "error": drift.error,
                    }
                    for drift in backend.drifts
                ],
                "networks": len(backend.networks),
            }
            try:
                await self.status.record_reconcile(backend.name, stored, by=self.dispatcher.id)
            except GanetiError as exc:
                log.warning("cannot store the reconcile report of %s (%s)", backend.name, exc)
