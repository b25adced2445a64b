"""Pure placement of new instances on Ganeti backends (no I/O, no clock unless asked).

The dispatcher feeds :class:`Allocator` one :class:`BackendView` per backend
(nodes from ``GET /2/nodes?bulk=1``, enabled disk templates from ``GET /2/info``,
health and 503 state) and asks it where a spec goes. Excluded are backends that are
drained in the configuration, failing health checks, refusing submissions (Ganeti
answered 503) or without room for the spec. Among the rest the ``"credits"``
strategy picks the one that can still take the most instances of the spec once the
requests already in flight to it are subtracted; ``"round_robin"`` cycles through
the backends with room, for comparison.

Drain speed. Free memory alone says where an instance fits, not when it will exist:
Ganeti runs one create at a time per primary node (the node lock), so a backend of
8 nodes finishes creates four times as fast as one of 2, whatever their memory. So
``"credits"`` first keeps the backends with room (credits >= 1: free memory, disk
and vcpus less what is pending there, as above), then picks the one where this
request would finish first: with ``q`` creates in flight there, ``n`` usable nodes
and ``d`` seconds per create, ``ceil((q + 1) / n) * d`` (the request waits for the
creates ahead of it, ``n`` at a time). Backends in the same "wave" tie, and ties go
to the most credits, then to the least recently chosen, so equal backends still
level their free capacity. ``d`` is learned per backend from the creates that end
(:meth:`Allocator.finished`, an exponentially weighted mean); until a backend has
ended one it borrows the mean of the others, or ``create_seconds`` when none has,
so an unmeasured backend is neither starved nor flooded.

A placement reserves capacity until :meth:`Allocator.release` (the create failed or
was never submitted) or until :meth:`Allocator.accounted` (the job ran) followed by
an :meth:`Allocator.update` whose node stats were read after that moment;
:meth:`Allocator.finished` (the create's job ended, with its time in Ganeti) does
one or the other and teaches the backend's create time. :meth:`Allocator.submitted`
(the job id came back) tells which creates were ahead of it in Ganeti, so that time
can be divided by the waves it waited.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Collection, Iterable
from typing import Literal

from synnefo_ganeti.allocate._addresses import address_shortage
from synnefo_ganeti.allocate._backend_state import BackendState, sync_out
from synnefo_ganeti.allocate._catalog import refusals
from synnefo_ganeti.allocate._liveness import NodeLiveness
from synnefo_ganeti.allocate._node_signs import NodeSigns
from synnefo_ganeti.allocate._nodes import NodeLoad, choose_nodes
from synnefo_ganeti.allocate._views import BackendView, Pending, Requirement, Reservation
from synnefo_ganeti.errors import NoCapacityError
from synnefo_ganeti.rapi import InstanceSpec

__all__ = [
    "Allocator",
    "BackendView",
    "NoCapacityError",
    "Pending",
    "Requirement",
    "Reservation",
    "Strategy",
]

Strategy = Literal["credits", "round_robin"]

DEFAULT_CREATE_SECONDS = 30.0  # a create's time on its node before any was measured
DEFAULT_SMOOTHING = 0.2  # weight of each new create time in the per-backend mean
_UNBOUNDED = 1_000_000_000  # credits of a backend no resource constrains


class Allocator(NodeSigns):
    """Chooses a backend per spec and tracks what is in flight to each.

    ``create_seconds`` is the time one create holds its node assumed before any create
    ended (only its ratio to measured ones matters); ``smoothing`` (0 < s <= 1) the
    weight of each new measure in a backend's mean.
    """

    def __init__(
        self,
        strategy: Strategy = "credits",
        *,
        create_seconds: float = DEFAULT_CREATE_SECONDS,
        smoothing: float = DEFAULT_SMOOTHING,
    ) -> None:
        if strategy not in ("credits", "round_robin"):
            raise ValueError(f"unknown strategy {strategy!r}: use 'credits' or 'round_robin'")
        if not create_seconds > 0:
            raise ValueError(f"create_seconds must be > 0, not {create_seconds}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], not {smoothing}")
        self.strategy: Strategy = strategy
        self.default_create_seconds = create_seconds
        self.smoothing = smoothing
        self._backends: dict[str, BackendState] = {}
        self._ids = itertools.count(1)
        self._placements = itertools.count()

    def __repr__(self) -> str:
        queued = sum(len(b.queue) for b in self._backends.values())
        reserved = sum(len(b.reservations) for b in self._backends.values())
        return (
            f"<Allocator {self.strategy} {len(self._backends)} backends, {queued} in flight, "
            f"{reserved} reserved>"
        )

    # -- state -------------------------------------------------------------------------------

    def update(self, view: BackendView) -> None:
        """Replace a backend's view (adding the backend if new).

        Reservations stay, except those :meth:`accounted` at or before ``view.stats_at``
        (or any accounted one when ``stats_at`` is ``None``): fresh stats include them.
        """
        backend = self._backends.get(view.name)
        if backend is None:
            backend = BackendState(view=view, order=len(self._backends), liveness=NodeLiveness(view.name))
            self._backends[view.name] = backend
            sync_out(backend)
            return
        backend.view = view
        sync_out(backend)
        if backend.returned is not None and view.stats_at is not None and view.stats_at >= backend.returned:
            backend.returned = None
        for rid, at in list(backend.accounted.items()):
            if view.stats_at is None or view.stats_at >= at:
                del backend.accounted[rid]
                dropped = backend.reservations.pop(rid, None)
                if dropped is not None:
                    backend.loads.remove(dropped, in_flight=rid in backend.queue)
        for node, at in list(backend.full.items()):
            if view.stats_at is not None and view.stats_at >= at:
                del backend.full[node]

    def forget(self, name: str) -> None:
        """Drop a backend (removed from the configuration) and its reservations."""
        self._backends.pop(name, None)

    @property
    def backends(self) -> list[str]:
        return list(self._backends)

    def view(self, name: str) -> BackendView:
        return self._backends[name].view

    def pending(self, name: str) -> Pending:
        """What the reservations of ``name`` hold that its node stats do not show yet."""
        loads = self._backends[name].loads
        return Pending(loads.memory, loads.disk, loads.count)

    def node_loads(self, name: str) -> dict[str, NodeLoad]:
        """Per node of ``name``: what is reserved there and not in its stats, and the creates
        in flight that take its lock (placements made with ``nodes=True``)."""
        return self._backends[name].loads.of_nodes()

    def full_nodes(self, name: str) -> set[str]:
        """Nodes of ``name`` out of node choice until its next node stats (:meth:`node_full`)."""
        return set(self._backends[name].full)

    def in_flight(self, name: str) -> int:
        """Creates placed on ``name`` whose job has not ended (reported by :meth:`finished`,
        :meth:`accounted` or :meth:`release`): the queue a new request would wait behind."""
        return len(self._backends[name].queue)

    def create_seconds(self, name: str) -> float:
        """Seconds one create holds a node of ``name``: learned, else borrowed (see the module)."""
        own = self._backends[name].create_seconds
        if own is not None:
            return own
        known = [b.create_seconds for b in self._backends.values() if b.create_seconds is not None]
        return sum(known) / len(known) if known else self.default_create_seconds

    def drain_rate(self, name: str) -> float:
        """Creates per second ``name`` can finish: usable nodes / :meth:`create_seconds`."""
        return self._backends[name].view.usable_count / self.create_seconds(name)

    def expected_finish(self, name: str) -> float:
        """Seconds until a create placed on ``name`` now would end: ``ceil((q + 1) / n) * d``."""
        backend = self._backends[name]
        nodes = max(1, backend.view.usable_count)
        return math.ceil((len(backend.queue) + 1) / nodes) * self.create_seconds(name)

    def due_for_refresh(self, *, interval: float, now: float | None = None) -> list[str]:
        """Backends whose stats are older than ``interval`` or miss an accounted placement."""
        now = time.monotonic() if now is None else now
        return [
            name
            for name, b in self._backends.items()
            if b.accounted
            or b.full
            or b.returned is not None
            or b.view.stats_at is None
            or now - b.view.stats_at >= interval
        ]

    # -- decisions ---------------------------------------------------------------------------

    def _assess(self, backend: BackendState, req: Requirement, now: float) -> tuple[int, str | None]:
        view = backend.view
        if view.drained:
            return 0, "drained"
        if not view.healthy:
            return 0, "failing health checks"
        if view.refusing_until is not None and view.refusing_until > now:
            return 0, f"refusing submissions (503) for {math.ceil(view.refusing_until - now)} s more"
        if view.catalog is not None and req.spec is not None:
            refused = refusals(view.catalog, req.spec)
            if refused:
                return 0, ", ".join(r.reason for r in refused)
            # (read only when the spec asks for addresses)
            pending_specs = (r.requirement.spec for r in backend.reservations.values())
            short = address_shortage(view.catalog.networks or {}, req.spec, pending_specs)
            if short is not None:
                return 0, short
        if view.disk_templates and req.disk_template not in view.disk_templates:
            enabled = ", ".join(sorted(view.disk_templates))
            return 0, f"disk template {req.disk_template} not enabled (enabled: {enabled})"
        usable = view.usable_nodes
        if not usable:
            down = f"; down or offline: {', '.join(sorted(view.out_nodes))}" if view.out_nodes else ""
            return 0, f"no usable node (all offline, drained or not vm_capable{down})"
        if req.disk_template == "drbd" and len(usable) < 2:
            return 0, "drbd needs 2 usable nodes, there is 1"
        max_vcpus = view.max_vcpus
        if max_vcpus is not None and req.vcpus > max_vcpus:
            return 0, f"needs {req.vcpus} vcpus, nodes have at most {max_vcpus}"
        pending = self.pending(view.name)
        credits = _UNBOUNDED - pending.count
        if req.memory > 0:
            if view.largest_free_memory < req.memory:
                return 0, f"no node has {req.memory} MiB free (largest {view.largest_free_memory})"
            credits = min(credits, (view.free_memory - pending.memory) // req.memory)
            if credits < 1:
                return 0, (
                    f"no room for {req.memory} MiB memory: {view.free_memory} MiB free,"
                    f" {pending.memory} MiB pending"
                )
        if req.disk > 0:
            per_node = req.disk_per_node
            if view.largest_free_disk < per_node:
                return 0, f"no node has {per_node} MiB disk free (largest {view.largest_free_disk})"
            credits = min(credits, (view.free_disk - pending.disk) // req.disk)
            if credits < 1:
                return 0, (
                    f"no room for {req.disk} MiB disk: {view.free_disk} MiB free, {pending.disk} MiB pending"
                )
        return credits, None

    def _requirement(self, spec: InstanceSpec | Requirement) -> Requirement:
        return spec if isinstance(spec, Requirement) else Requirement.of(spec)

    def _ranked(self, req: Requirement, now: float) -> list[tuple[BackendState, int]]:
        eligible: list[tuple[BackendState, int]] = []
        for backend in self._backends.values():
            credits, reason = self._assess(backend, req, now)
            if reason is None:
                eligible.append((backend, credits))

        def key(item: tuple[BackendState, int]) -> tuple[float, int, int, int]:
            backend, credits = item
            if self.strategy == "round_robin":
                return (0.0, 0, backend.last_chosen, backend.order)
            # Soonest end first; in the same wave the most credits; then least recently
            # chosen, so equal backends share the load.
            return (self.expected_finish(backend.view.name), -credits, backend.last_chosen, backend.order)

        return sorted(eligible, key=key)

    def candidates(
        self, spec: InstanceSpec | Requirement, *, now: float | None = None
    ) -> list[tuple[str, int]]:
        """Eligible backends with their credits, in the order :meth:`place` would try them."""
        now = time.monotonic() if now is None else now
        return [(b.view.name, credits) for b, credits in self._ranked(self._requirement(spec), now)]

    def rejected(self, spec: InstanceSpec | Requirement, *, now: float | None = None) -> dict[str, str]:
        """Why each excluded backend cannot take the spec."""
        now = time.monotonic() if now is None else now
        req = self._requirement(spec)
        out: dict[str, str] = {}
        for name, backend in self._backends.items():
            _, reason = self._assess(backend, req, now)
            if reason is not None:
                out[name] = reason
        return out

    def place(
        self,
        spec: InstanceSpec | Requirement,
        *,
        now: float | None = None,
        only: str | None = None,
        nodes: bool = False,
        exclude: Collection[str] = (),
    ) -> Reservation:
        """Choose a backend for ``spec`` and reserve its requirement there.

        ``only``: the request names its backend; it is reserved there if that backend
        is eligible, else :class:`NoCapacityError` says why not. ``nodes``: choose the
        primary node (and a secondary for a mirrored template) too (:mod:`._nodes`); a
        backend where no node fits is passed over for the next one. ``exclude``: backends
        where this request's create failed for a reason of theirs (not placed there again).
        """
        now = time.monotonic() if now is None else now
        req = self._requirement(spec)
        ranked = self._ranked(req, now)
        if exclude:
            ranked = [item for item in ranked if item[0].view.name not in exclude]
            if not ranked:
                failed = {name: "the create failed there already" for name in exclude}
                raise NoCapacityError(req, failed | self.rejected(req, now=now))
        if only is not None:
            ranked = [item for item in ranked if item[0].view.name == only]
            if not ranked:
                reason = self.rejected(req, now=now).get(only, "not a known backend")
                raise NoCapacityError(req, {only: reason})
        if not ranked:
            raise NoCapacityError(req, self.rejected(req, now=now))
        chosen: tuple[str | None, str | None] = (None, None)
        no_node: dict[str, str] = {}
        for candidate, _ in ranked:
            if not nodes:
                backend = candidate
                break
            name = candidate.view.name
            found = choose_nodes(candidate.view, req, candidate.loads.live(), candidate.excluded(now))
            if isinstance(found, str):
                no_node[name] = found
                continue
            backend, chosen = candidate, found
            break
        else:
            reasons = {} if only is not None else self.rejected(req, now=now)
            raise NoCapacityError(req, reasons | no_node)
        reservation = Reservation(
            name=backend.view.name, requirement=req, id=next(self._ids), node=chosen[0], snode=chosen[1]
        )
        backend.reservations[reservation.id] = reservation
        backend.queue[reservation.id] = len(backend.queue)
        backend.loads.add(reservation, in_flight=True)
        backend.last_chosen = next(self._placements)
        return reservation

    def release(self, reservation: Reservation) -> bool:
        """Give a reservation's capacity back (the create failed or was never sent)."""
        backend = self._backends.get(reservation.name)
        if backend is None:
            return False
        backend.accounted.pop(reservation.id, None)
        in_flight = backend.queue.pop(reservation.id, None) is not None
        backend.sent.discard(reservation.id)
        kept = backend.reservations.pop(reservation.id, None)
        if kept is not None:
            backend.loads.remove(kept, in_flight=in_flight)
        return kept is not None

    def accounted(self, reservation: Reservation, *, now: float | None = None) -> None:
        """The job ran: drop the reservation at the first :meth:`update` read after ``now``."""
        backend = self._backends.get(reservation.name)
        if backend is not None and reservation.id in backend.reservations:
            if backend.queue.pop(reservation.id, None) is not None:
                backend.loads.landed(backend.reservations[reservation.id])
            backend.sent.discard(reservation.id)
            backend.accounted[reservation.id] = time.monotonic() if now is None else now

    def submitted(self, reservation: Reservation) -> None:
        """Ganeti has the create (its job id came back): the creates ahead of it are now
        those already in Ganeti whose job has not ended, not all those placed before it."""
        backend = self._backends.get(reservation.name)
        if backend is None or reservation.id not in backend.queue or reservation.id in backend.sent:
            return
        backend.queue[reservation.id] = len(backend.sent)
        backend.sent.add(reservation.id)

    def finished(
        self, reservation: Reservation, seconds: float, *, ok: bool = True, now: float | None = None
    ) -> None:
        """The create's job ended after ``seconds`` in Ganeti (``end_ts - received_ts`` of the job).

        ``ok``: the instance exists: the reservation is :meth:`accounted` (at ``now``), and
        the backend's create time is learned. Not ``ok``: it is released, and nothing is
        learned (a failed create ends early, its time says nothing of the node's pace).

        ``seconds`` includes the wait behind the creates ahead of this one; with ``a``
        of them in Ganeti when it was :meth:`submitted` (without that call: in flight
        when it was placed, an overcount when submissions lag) and ``n`` usable nodes,
        the create itself took about ``seconds * n / max(n, a + 1)`` (the queue drains
        ``n`` at a time).
        When creates serialise more than per node (a cluster-wide lock, a low
        ``max_running_jobs``), this learns a longer per-node time: the drain rate
        measured, not the one assumed.
        """
        backend = self._backends.get(reservation.name)
        if backend is None or reservation.id not in backend.reservations:
            return
        ahead = backend.queue.get(reservation.id)
        if not ok:
            self.release(reservation)
            return
        self.accounted(reservation, now=now)
        if ahead is None or seconds <= 0 or not math.isfinite(seconds):
            return  # already accounted (its queue place forgotten), or a meaningless time
        nodes = max(1, backend.view.usable_count)
        sample = seconds * nodes / max(nodes, ahead + 1)
        if backend.create_seconds is None:
            backend.create_seconds = sample
        else:
            backend.create_seconds += self.smoothing * (sample - backend.create_seconds)

    def place_many(
        self, specs: Iterable[InstanceSpec | Requirement], *, now: float | None = None
    ) -> list[Reservation]:
        """Place several specs in turn; on failure release the ones already placed and re-raise."""
        done: list[Reservation] = []
        for spec in specs:
            try:
                reservation = self.place(spec, now=now)
            except NoCapacityError:
                for placed in done:
                    self.release(placed)
                raise
            done.append(reservation)
        return done
