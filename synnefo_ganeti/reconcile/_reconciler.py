"""The reconciler: snapshots of every backend at once, :func:`plan`, and the opt-in fixes.

``async with Reconciler(settings) as reconciler: report = await reconciler.run_once()``.
Per backend: one query of instances (the compared columns) and one of jobs not final,
then Ganeti's instances (``/2/query/instance``, the compared fields: :mod:`._fetch`) and
jobs fetched concurrently, then ``GET /2/jobs/ID`` (bounded) for the jobs the database
needs that the listing lacks; all under the backend's timeout. A
backend that fails or is too slow gets ``ok=False`` and a one-line reason; the others
finish. Fixes are opt-in (see :class:`Fix`); the only Ganeti-side action, deleting an
orphan, needs ``delete_orphans=True``. Whatever the fixes, each pass stores what Ganeti
made (:func:`record_observed`), each instance's node state and the rows not ours
(:mod:`._marks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from synnefo_ganeti._backends import BackendResources
from synnefo_ganeti._gc import gc_paused
from synnefo_ganeti._serial import to_jsonable
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.metrics import DRIFT_FOUND
from synnefo_ganeti.rapi import RapiClient
from synnefo_ganeti.reconcile import _networks
from synnefo_ganeti.reconcile._fetch import INSTANCE_FIELDS
from synnefo_ganeti.reconcile._job_file import job_file
from synnefo_ganeti.reconcile._marks import ours, record_marks
from synnefo_ganeti.reconcile._networks import NetworkDrift, NetworkDriftKind, check_networks
from synnefo_ganeti.reconcile._observe import observed_changes
from synnefo_ganeti.reconcile._pass import PassReads, PassRows, settle
from synnefo_ganeti.reconcile._plan import (
    BUILD_GRACE,
    DbSnapshot,
    Drift,
    DriftKind,
    Fix,
    GanetiSnapshot,
    plan,
)
from synnefo_ganeti.reconcile._snapshots import complete_ganeti, snapshot_db, snapshot_ganeti
from synnefo_ganeti.store import JobVersion, Store, record_observed
from synnefo_ganeti.store.instances._outcomes import error_record

if TYPE_CHECKING:
    from synnefo_ganeti.config import BackendSettings, Settings

__all__ = [
    "BackendReport",
    "Reconciler",
    "Report",
    "apply",
    "job_file",
    "snapshot_db",
    "snapshot_ganeti",
]

log = logging.getLogger("synnefo_ganeti.reconcile")

_NOT_FINAL = [status for status in JobStatus if not status.is_final]


# -- reports -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class BackendReport:
    """One backend's outcome: ``ok`` False with ``error`` when it could not be checked."""

    name: str
    ok: bool
    error: str | None = None
    drifts: list[Drift] = field(default_factory=list)
    duration: float = 0.0
    #: rows that took Ganeti's values this pass (NICs, disks, memory, vcpus, os, pnode)
    observed: int = 0
    #: the network and address drifts (reconcile/_networks.py)
    networks: list[NetworkDrift] = field(default_factory=list)
    #: instances found as their rows expect by comparing Ganeti's cells whole (``_pass.settle``)
    settled: int = 0
    #: rows whose node state or ownership this pass marked (``_marks``)
    marked: int = 0

    __json_fields__ = ("name", "ok", "error", "drifts", "networks")

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        return result


@dataclass(slots=True)
class Report:
    backends: list[BackendReport] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Every backend checked, no drift found."""
        return all(backend.ok and not backend.drifts and not backend.networks for backend in self.backends)

    @property
    def ok(self) -> bool:
        """Every backend could be checked."""
        return all(backend.ok for backend in self.backends)

    @property
    def drifts(self) -> list[Drift]:
        return [drift for backend in self.backends for drift in backend.drifts]

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        return result

    def summary(self) -> str:
        parts = []
        for backend in self.backends:
            if not backend.ok:
                parts.append(f"{backend.name}: failed ({backend.error})")
                continue
            found = len(backend.drifts) + len(backend.networks)
            fixed = sum(d.fixed for d in backend.drifts) + sum(d.fixed for d in backend.networks)
            parts.append(f"{backend.name}: {found} drifts, {fixed} fixed")
        return "; ".join(parts) or "no backends"


# -- fixes -------------------------------------------------------------------------------------------


def _fix_kinds(fixes: Iterable[Fix | str]) -> set[DriftKind]:
    return {Fix(fix).kind for fix in fixes}


def _vanished(drift: Drift) -> str:
    return f"instance {drift.instance} vanished from backend {drift.backend}: Ganeti no longer has it"


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, GanetiError) else f"{type(exc).__name__}: {exc}"


async def apply(
    drifts: list[Drift],
    fixes: Collection[Fix | str],
    *,
    store: Store,
    clients: Mapping[str, RapiClient] | None = None,
    delete_orphans: bool = False,
) -> list[Drift]:
    """Fix the drifts whose kind ``fixes`` names (and orphans with ``delete_orphans``).

    Database-side: job drifts first (their final versions stored in one batch, so the
    instances follow their ends), then each instance's row takes Ganeti's state or
    values. Ganeti-side: ``DELETE /2/instances/NAME`` for each orphan (the job is not
    waited for). A fix that fails leaves ``fixed`` False and says why in ``error``; the
    others go on. Returns ``drifts``.
    """
    kinds = _fix_kinds(fixes)
    clients = clients or {}

    jobs = [d for d in drifts if d.kind is DriftKind.JOB and d.kind in kinds and d.job is not None]
    queued: list[Drift] = []
    for drift in jobs:
        assert drift.job is not None
        job = drift.job
        client = clients.get(drift.backend)
        if job.oplog is None and client is not None:  # the listing's job: get its log and results
            try:
                job = await client.get_job(job.id)
            except GanetiError as exc:
                log.info("%s: job %s: storing the listing's version (%s)", drift.backend, job.id, exc)
        try:
            await store.put(JobVersion(drift.backend, job_file(job)))
        except (GanetiError, RuntimeError) as exc:
            drift.error = _reason(exc)
            continue
        queued.append(drift)
    if queued:
        try:
            await store.flush()
        except (GanetiError, RuntimeError) as exc:
            for drift in queued:
                drift.error = _reason(exc)
        else:
            for drift in queued:
                drift.fixed = True

    for drift in drifts:
        if drift.kind is DriftKind.JOB or drift.instance is None:
            continue
        try:
            if drift.kind is DriftKind.ORPHAN:
                if not delete_orphans:
                    continue
                client = clients.get(drift.backend)
                if client is None:
                    drift.error = f"no RAPI client for backend {drift.backend}"
                    continue
                drift.job_id = await client.delete_instance(drift.instance)
                log.warning(
                    "%s: deleting orphan %s from Ganeti (job %s)", drift.backend, drift.instance, drift.job_id
                )
                drift.fixed = True
            elif drift.kind in kinds:
                values: dict[str, Any] = dict(drift.values)
                if drift.status is not None:
                    values["status"] = drift.status
                if drift.kind is DriftKind.STALE:  # the row says why it ended (and so does the feed)
                    values["last_error"] = error_record(
                        "reconcile", None, _vanished(drift), datetime.now(UTC)
                    )
                if values:
                    await store.update_instance(drift.backend, drift.instance, **values)
                    drift.fixed = True
        except GanetiError as exc:
            drift.error = _reason(exc)
            log.warning("%s: cannot fix %s drift of %s: %s", drift.backend, drift.kind, drift.instance, exc)
    return drifts


# -- the reconciler ----------------------------------------------------------------------------------


class Reconciler(BackendResources):
    """Compares the database with every backend of ``settings``, and fixes what it is asked to.

    ``store`` and ``clients`` (name -> open :class:`RapiClient`) may be given (tests,
    the daemon); what the reconciler opens itself it closes on exit.
    """

    _usage = "use 'async with Reconciler(settings) as r'"

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        clients: Mapping[str, RapiClient] | None = None,
        lookup_concurrency: int = 8,
        build_grace: float = BUILD_GRACE,
    ) -> None:
        super().__init__(settings, store=store, clients=clients)
        self.lookup_concurrency = lookup_concurrency
        self.build_grace = build_grace

    def __repr__(self) -> str:
        return f"<Reconciler backends=[{', '.join(b.name for b in self.settings.backends)}]>"

    @property
    def _marks(self) -> bool:
        """Whether ``[ownership]`` has a mark: without, nothing is told ours or not ours."""
        ownership = self.settings.ownership
        return ownership.prefix is not None or ownership.tag is not None

    def _make_client(self, backend: BackendSettings) -> RapiClient:
        return backend.rapi_client(timeout=self.settings.reconcile_timeout(backend))

    async def snapshots(
        self, backend: str, reads: PassReads | None = None
    ) -> tuple[DbSnapshot, GanetiSnapshot]:
        """The database's snapshot, then Ganeti's (no timeout here), less what settles.

        ``reads``: the pass's (:meth:`run_once`: one database snapshot for every backend,
        taken before any is asked, each backend's rows read while the backends answer);
        None: one of this backend's own. A row and an instance that settle (``_pass.settle``:
        Ganeti's cells equal to those the row expects) are in neither snapshot: :func:`plan`
        has nothing to say of them, nor :func:`observed_changes`.
        """
        db, gnt, _settled = await self._snapshots(backend, reads)
        return db, gnt

    async def _snapshots(
        self, backend: str, reads: PassReads | None
    ) -> tuple[DbSnapshot, GanetiSnapshot, int]:
        """:meth:`snapshots`, and how many settled."""
        if reads is None:
            async with PassReads(self.store, [backend]) as own:
                return await self._snapshots(backend, own)
        client = await self.client(backend)
        # no snapshot held (an in-memory database): read before asking
        early = None if await reads.pinned() else await reads.rows(backend)
        taken_at = time.time()

        def into(load: Callable[[], list[list[Any]]]) -> tuple[PassRows | None, Any]:
            # Decoded and settled as soon as it comes when the rows are read by then; else
            # kept as it came (~310 bytes an instance; decoded, ~2.5 KB) until they are.
            read = early or reads.ready(backend)
            return (None, load) if read is None else (read, settle(backend, read, load(), client.where))

        (read, settled), jobs = await asyncio.gather(
            client.query_cells_into("instance", INSTANCE_FIELDS, into), client.list_jobs()
        )
        if read is None:  # the answer came before the rows
            read = await reads.rows(backend)
            settled = settle(backend, read, settled(), client.where)
        rows, instances, count = settled
        db = DbSnapshot(backend=backend, instances=rows, jobs=read.jobs, taken_at=read.taken_at)
        gnt = await complete_ganeti(
            client,
            db,
            instances,
            jobs,
            taken_at,
            owns=self.settings.ownership.owns,
            lookup_concurrency=self.lookup_concurrency,
            tag_namespace=self.settings.ownership.tag_namespace,
            marks=self._marks,
        )
        # The DESTROYED rows only of the names that could be orphans (ours in Ganeti, no live
        # row): the live rows alone are read by an index, every backend's DESTROYED ones by a scan.
        # Such a row is read in the pass's snapshot after Ganeti answered; it only says why an
        # orphan is one.
        unheld = sorted(name for name in gnt.owned if name not in db.instances)
        if unheld:
            ended = await reads.destroyed(backend, unheld)
            db = dataclasses.replace(db, instances={**ended, **db.instances})
        return db, gnt, count

    async def _check_networks(
        self,
        backend: str,
        fixes: Collection[NetworkDriftKind | str],
        delete_orphans: bool,
        timeout: float,
        reads: PassReads | None,
        seen: list[_networks.NetworkSnapshot] | None = None,
    ) -> list[NetworkDrift]:
        async with asyncio.timeout(timeout):
            client = await self.client(backend)
            drifts = await check_networks(
                self.store,
                client,
                backend,
                owns=self.settings.ownership.owns,
                fixes=fixes,
                delete_orphans=delete_orphans,
                timeout=timeout,
                stored=None if reads is None else await reads.networks(),  # the pass's: read once
                seen=seen,
            )
        for drift in drifts:
            DRIFT_FOUND.labels(backend, drift.kind.value).inc()
        return drifts

    async def check_backend(
        self,
        backend: str,
        *,
        fixes: Collection[Fix | str] = frozenset(),
        delete_orphans: bool = False,
        network_fixes: Collection[NetworkDriftKind | str] = frozenset(),
        reads: PassReads | None = None,
        seen: list[_networks.NetworkSnapshot] | None = None,
    ) -> BackendReport:
        """One backend: snapshots under its timeout, the plan, the requested fixes; never raises.

        The networks are checked at the same time as the instances (their answers take as long).
        ``reads``: the pass's database reads (see :meth:`snapshots`); ``seen``: its network
        snapshot is appended (:meth:`run_once` finds the address conflicts across backends)."""
        started = time.monotonic()
        timeout = self.settings.reconcile_timeout(backend)
        drifts: list[Drift] = []  # kept when the fixes fail: what was found is still reported
        observed_count = marked = 0
        networks = asyncio.ensure_future(
            self._check_networks(backend, network_fixes, delete_orphans, timeout, reads, seen)
        )
        try:
            async with asyncio.timeout(timeout):
                db, gnt, settled = await self._snapshots(backend, reads)
            drifts = plan(db, gnt, build_grace=self.build_grace)
            for drift in drifts:
                DRIFT_FOUND.labels(backend, drift.kind.value).inc()
            if drifts and (fixes or delete_orphans):
                async with asyncio.timeout(timeout):
                    await apply(
                        drifts, fixes, store=self.store, clients=self._clients, delete_orphans=delete_orphans
                    )
            # what Ganeti made, stored; but a nics or disks drift not fixed stays as it is
            held: dict[str, set[str]] = {}
            for drift in drifts:
                if drift.instance and not drift.fixed and drift.kind in (DriftKind.NICS, DriftKind.DISKS):
                    held.setdefault(drift.instance, set()).add(drift.kind.value)
            async with asyncio.timeout(timeout):
                marked = await record_marks(self.store, db, gnt, drifts)
            observed = observed_changes(db.instances, ours(gnt), held=held)
            if observed:
                async with asyncio.timeout(timeout):
                    observed_count = await record_observed(
                        self.store, backend, observed, taken_at=gnt.taken_at
                    )
            network_drifts = await networks
        except TimeoutError:
            error = f"backend {backend}: no answer within {timeout:g} s (timeout)"
            log.warning("%s", error)
            return BackendReport(backend, False, error, drifts, time.monotonic() - started)
        except (GanetiError, OSError) as exc:
            error = f"backend {backend}: {_reason(exc)}"
            log.warning("%s", error)
            return BackendReport(backend, False, error, drifts, time.monotonic() - started)
        except Exception as exc:  # a bug or a surprise: this backend fails, the others go on
            error = f"backend {backend}: unexpected {_reason(exc)}"
            log.exception("%s", error)
            return BackendReport(backend, False, error, drifts, time.monotonic() - started)
        finally:
            if not networks.done():  # the instance part failed first
                networks.cancel()
            await asyncio.gather(networks, return_exceptions=True)  # its failure is reported above
        return BackendReport(
            backend,
            ok=True,
            drifts=drifts,
            duration=time.monotonic() - started,
            observed=observed_count,
            marked=marked,
            networks=network_drifts,
            settled=settled,
        )

    async def run_once(
        self,
        *,
        backends: Iterable[str] | None = None,
        fixes: Collection[Fix | str] = frozenset(),
        delete_orphans: bool = False,
        network_fixes: Collection[NetworkDriftKind | str] = frozenset(),
    ) -> Report:
        """Every backend (or the named ones) at once; a failing one does not stop the others."""
        names = list(backends) if backends is not None else [b.name for b in self.settings.backends]
        names = list(dict.fromkeys(names))  # a backend named twice is checked once
        for name in names:
            self.settings.backend(name)  # ConfigError for an unknown name, before any work
        fixes = frozenset(Fix(fix) for fix in fixes)
        network_fixes = frozenset(NetworkDriftKind(kind) for kind in network_fixes)
        # The cyclic garbage collector is paused for the pass: its snapshots are hundreds of
        # thousands of acyclic objects (rows, answers), which full collections scanned again
        # and again without finding garbage (0.3 s of a 10 x 1,000 pass, more than the rest
        # at 100,000 instances: docs/benchmarks.md). Reference counting still frees them; a
        # cycle made meanwhile waits for the pass's end (bounded by the backends' timeouts).
        # One database snapshot for the pass, taken before any backend is asked; each backend's
        # rows are read in it while the backends answer (_pass.PassReads).
        seen: list[_networks.NetworkSnapshot] = []
        with gc_paused():
            async with PassReads(self.store, names) as reads:
                reports = await asyncio.gather(
                    *(
                        self.check_backend(
                            name,
                            fixes=fixes,
                            delete_orphans=delete_orphans,
                            network_fixes=network_fixes,
                            reads=reads,
                            seen=seen,
                        )
                        for name in names
                    )
                )
        conflicts = _networks.conflicts_by_backend(seen)  # address_conflict: across the backends' snapshots
        for report in [r for r in reports if r.ok]:
            for drift in conflicts.get(report.name, []):
                report.networks.append(drift)
                DRIFT_FOUND.labels(report.name, drift.kind.value).inc()
        return Report(list(reports))

    async def run_forever(
        self,
        *,
        backends: Iterable[str] | None = None,
        fixes: Collection[Fix | str] = frozenset(),
        delete_orphans: bool = False,
        network_fixes: Collection[NetworkDriftKind | str] = frozenset(),
        stop: asyncio.Event | None = None,
    ) -> None:
        """A pass every ``[reconcile] interval`` seconds until ``stop`` is set (or cancelled),
        logging a summary per pass; a pass that fails is logged and the next one comes."""
        stop = stop or asyncio.Event()
        names = list(backends) if backends is not None else None
        interval = self.settings.reconcile.interval
        while not stop.is_set():
            started = time.monotonic()
            try:
                report = await self.run_once(
                    backends=names, fixes=fixes, delete_orphans=delete_orphans, network_fixes=network_fixes
                )
            except Exception:
                log.exception("reconcile pass failed; next pass in %g s", interval)
            else:
                level = logging.INFO if report.clean else logging.WARNING
                log.log(level, "reconcile pass: %s", report.summary())
            pause = max(0.0, interval - (time.monotonic() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)
