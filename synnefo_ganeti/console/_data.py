"""What the console's pages show, gathered from the control plane, the store and the reconciler.

:class:`Capacity` keeps each backend's node stats (``GET /2/nodes?bulk=1``), refreshed by
one task per process every ``interval`` seconds (and at once after an action), so a
viewer never makes the console call Ganeti. :class:`Reports` keeps the last reconcile
report of each backend: the console's own passes and, inside the dispatcher, the
dispatcher's; :func:`last_reports` adds those a dispatcher of another process stored
(``StatusStore``), and :func:`dispatchers` reads the dispatchers' own reports, so that a ``web``
of its own sees them. :func:`overview` puts a backend's figures together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.reconcile import BackendReport, Drift, DriftKind, Report
from synnefo_ganeti.store import DispatcherReport, RequestStatus, StatusStore

__all__ = ["BackendFigures", "Capacity", "NodeTotals", "Reports", "dispatchers", "last_reports", "overview"]

log = logging.getLogger("synnefo_ganeti.console")

RUNNING_JOB_STATUSES = [JobStatus.QUEUED, JobStatus.WAITING, JobStatus.RUNNING, JobStatus.CANCELING]


@dataclass(frozen=True, slots=True)
class NodeTotals:
    """A backend's nodes as Ganeti last reported them (MiB)."""

    nodes: int
    online: int
    memory_total: int
    memory_free: int
    disk_total: int
    disk_free: int
    at: float

    @property
    def memory_used(self) -> int:
        return max(0, self.memory_total - self.memory_free)

    @property
    def disk_used(self) -> int:
        return max(0, self.disk_total - self.disk_free)

    @property
    def memory_percent(self) -> int:
        return round(100 * self.memory_used / self.memory_total) if self.memory_total else 0

    @property
    def disk_percent(self) -> int:
        return round(100 * self.disk_used / self.disk_total) if self.disk_total else 0


class Capacity:
    """Node stats per backend, refreshed in the background (never per viewer)."""

    def __init__(self, cp: Callable[[], ControlPlane], *, interval: float = 30.0) -> None:
        self._cp = cp
        self.interval = interval
        self.totals: dict[str, NodeTotals] = {}
        self.errors: dict[str, str] = {}
        #: each backend's Ganeti ("3.0.2", "3.1.0~rc2"), as its RAPI client last read it
        self.versions: dict[str, str] = {}
        self._wake = asyncio.Event()
        self.on_refresh: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"<Capacity {len(self.totals)} backends known, {len(self.errors)} failing>"

    def refresh_soon(self) -> None:
        self._wake.set()

    async def refresh(self, backends: Iterable[str]) -> None:
        async def one(name: str) -> None:
            try:
                client = await self._cp().client(name)
                async with asyncio.timeout(10):
                    # (the version is read once per client: again after a reconnect)
                    nodes, version = await asyncio.gather(client.list_nodes(), client.ganeti_version())
            except (GanetiError, OSError, TimeoutError) as exc:
                self.errors[name] = str(exc) or type(exc).__name__
                return
            online = [n for n in nodes if not n.offline]
            self.versions[name] = version.text
            self.totals[name] = NodeTotals(
                nodes=len(nodes),
                online=len(online),
                memory_total=sum(n.mtotal or 0 for n in online),
                memory_free=sum(n.mfree or 0 for n in online),
                disk_total=sum(n.dtotal or 0 for n in online),
                disk_free=sum(n.dfree or 0 for n in online),
                at=time.time(),
            )
            self.errors.pop(name, None)

        await asyncio.gather(*(one(name) for name in backends))

    async def run(self) -> None:
        while True:
            await self.refresh([b.name for b in self._cp().settings.backends])
            for callback in self.on_refresh:
                callback()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()


@dataclass(slots=True)
class Reports:
    """The last reconcile report of each backend, and who ran it when."""

    last: dict[str, tuple[BackendReport, datetime, str]] = field(default_factory=dict)
    on_record: list[Callable[[], None]] = field(default_factory=list)

    def record(self, report: Report, by: str = "dispatcher") -> None:
        now = datetime.now(UTC)
        for backend in report.backends:
            self.last[backend.name] = (backend, now, by)
        for callback in self.on_record:
            callback()


@dataclass(slots=True)
class BackendFigures:
    """One backend's line on the overview."""

    name: str
    health: str  # up, down or unknown
    health_detail: str | None
    drained: bool
    drained_by: str | None  # "config" or "operator"
    nodes: NodeTotals | None
    nodes_error: str | None
    requests: dict[str, int]
    jobs_running: int
    ganeti_version: str | None = None


async def overview(cp: ControlPlane, capacity: Capacity) -> list[BackendFigures]:
    """Every backend of the settings: health, drain, nodes, requests per status, jobs running.

    Three reads of the store whatever the number of backends."""
    store = cp.store
    states = await store.backend_states()
    counts = await store.request_counts()
    running: dict[str, int] = {}
    for job in await store.list_jobs(status=RUNNING_JOB_STATUSES):
        running[job.backend] = running.get(job.backend, 0) + 1
    figures = []
    for backend in cp.settings.backends:
        state: dict[str, Any] = states.get(backend.name, {})
        health = state.get("health")
        requests = {status.value: counts.get((backend.name, status.value), 0) for status in RequestStatus}
        figures.append(
            BackendFigures(
                name=backend.name,
                # the store keeps the text "up" or "down" (both truthy): read it as text
                health=health if health in ("up", "down") else "unknown",
                health_detail=state.get("health_detail"),
                drained=backend.drained or bool(state.get("drained")),
                drained_by="config" if backend.drained else ("operator" if state.get("drained") else None),
                nodes=capacity.totals.get(backend.name),
                nodes_error=capacity.errors.get(backend.name),
                requests=requests,
                jobs_running=running.get(backend.name, 0),
                ganeti_version=capacity.versions.get(backend.name),
            )
        )
    return figures


async def unplaced(cp: ControlPlane) -> int:
    """Requests pending and not placed on any backend yet."""
    counts = await cp.store.request_counts(status=[RequestStatus.PENDING])
    return counts.get((None, RequestStatus.PENDING.value), 0)


async def last_reports(cp: ControlPlane, reports: Reports) -> dict[str, tuple[BackendReport, datetime, str]]:
    """Per backend, the newer of this process's last report and the one a dispatcher stored."""
    merged = dict(reports.last)
    for name, record in (await StatusStore(cp.store).reconcile_reports()).items():
        mine = merged.get(name)
        if mine is None or mine[1] < record.at:
            merged[name] = (stored_report(name, record.report), record.at, record.by)
    return merged


def stored_report(name: str, data: dict[str, Any]) -> BackendReport:
    """A backend's report as a dispatcher stored it (``dispatch/_report.py``), for the pages."""
    drifts = []
    for item in data.get("drifts") or []:
        try:
            kind = DriftKind(item.get("kind"))
        except ValueError:
            continue  # a kind a newer version wrote
        drifts.append(
            Drift(
                kind=kind,
                backend=name,
                instance=item.get("instance"),
                detail=str(item.get("detail", "")),
                fixed=bool(item.get("fixed")),
                error=item.get("error"),
            )
        )
    return BackendReport(
        name=name,
        ok=bool(data.get("ok")),
        error=data.get("error"),
        drifts=drifts,
        duration=float(data.get("duration") or 0.0),
        observed=int(data.get("observed") or 0),
        settled=int(data.get("settled") or 0),
        marked=int(data.get("marked") or 0),
    )


async def dispatchers(cp: ControlPlane) -> list[DispatcherReport]:
    """The dispatchers' own reports: the alive ones first, then the newest start."""
    found = await StatusStore(cp.store).dispatchers()
    now = datetime.now(UTC)
    return sorted(found, key=lambda d: (not d.alive(now), -d.started_at.timestamp()))
