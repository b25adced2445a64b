"""Pure placement of new instances on Ganeti backends (no I/O, no clock unless asked).

The dispatcher feeds :class:`Allocator` one :class:`BackendView` per backend
(nodes from ``GET /2/nodes?bulk=1``, enabled disk templates from ``GET /2/info``,
health and 503 state) and asks it where a spec goes. Excluded are backends that are
drained in the configuration, failing health checks, refusing submissions (Ganeti
answered 503) or without room for the spec. Among the rest the ``"credits"``
strategy picks the one that can still take the most instances of the spec once the
requests already in flight to it are subtracted; ``"round_robin"`` cycles through
the backends with room, for comparison.

A placement reserves capacity until :meth:`Allocator.release` (the create failed or
was never submitted) or until :meth:`Allocator.accounted` (the job ran) followed by
an :meth:`Allocator.update` whose node stats were read after that moment.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.rapi import InstanceSpec, Node

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

DEFAULT_MEMORY_MIB = 128
_UNBOUNDED = 1_000_000_000  # credits of a backend no resource constrains


def _as_int(value: Any, default: int) -> int:
    if value is None or isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True, slots=True)
class Requirement:
    """What one instance of a spec needs: memory and disk in MiB, vcpus, disk template.

    ``disk`` is the cluster-wide total (twice the disk sizes for ``drbd``, which
    mirrors to a second node); :attr:`disk_per_node` is what one node must hold.
    """

    memory: int
    disk: int
    vcpus: int
    disk_template: str

    @classmethod
    def of(cls, spec: InstanceSpec) -> Requirement:
        beparams = spec.beparams
        memory = (
            _as_int(beparams.get("maxmem"), 0) or _as_int(beparams.get("memory"), 0) or DEFAULT_MEMORY_MIB
        )
        vcpus = _as_int(beparams.get("vcpus"), 0) or 1
        size = sum(_as_int(disk.get("size"), 0) for disk in spec.disks)
        if spec.disk_template == "diskless":
            size = 0
        elif spec.disk_template == "drbd":
            size *= 2
        return cls(memory=memory, disk=size, vcpus=vcpus, disk_template=spec.disk_template)

    @property
    def disk_per_node(self) -> int:
        return self.disk // 2 if self.disk_template == "drbd" else self.disk

    def describe(self) -> str:
        return f"{self.memory} MiB memory, {self.disk} MiB disk, {self.vcpus} vcpus, {self.disk_template}"


@dataclass(frozen=True, slots=True)
class BackendView:
    """What is known of one backend at ``stats_at`` (a ``time.monotonic()`` value).

    ``disk_templates`` empty means unknown: any template is accepted.
    ``refusing_until`` is set (monotonic time) when a submit got a 503.
    """

    name: str
    nodes: list[Node] = field(default_factory=list)
    disk_templates: frozenset[str] = frozenset()
    drained: bool = False
    healthy: bool = True
    refusing_until: float | None = None
    stats_at: float | None = None

    @property
    def usable_nodes(self) -> list[Node]:
        return [n for n in self.nodes if not n.offline and not n.drained and n.vm_capable is not False]

    @property
    def free_memory(self) -> int:
        return sum(n.mfree or 0 for n in self.usable_nodes)

    @property
    def largest_free_memory(self) -> int:
        return max((n.mfree or 0 for n in self.usable_nodes), default=0)

    @property
    def free_disk(self) -> int:
        return sum(n.dfree or 0 for n in self.usable_nodes)

    @property
    def largest_free_disk(self) -> int:
        return max((n.dfree or 0 for n in self.usable_nodes), default=0)

    @property
    def max_vcpus(self) -> int | None:
        """The most CPUs of a usable node, ``None`` when no node reports it."""
        known = [n.ctotal for n in self.usable_nodes if n.ctotal is not None]
        return max(known) if known else None


@dataclass(frozen=True, slots=True)
class Pending:
    """What is reserved on a backend and not yet in its node stats."""

    memory: int
    disk: int
    count: int


@dataclass(frozen=True, slots=True)
class Reservation:
    """One placement: ``name`` is the chosen backend, ``id`` unique per allocator."""

    name: str
    requirement: Requirement
    id: int


class NoCapacityError(GanetiError):
    """No backend can take the spec; ``reasons`` maps each backend to why not."""

    def __init__(self, requirement: Requirement, reasons: dict[str, str]) -> None:
        if reasons:
            detail = "; ".join(f"{name}: {reason}" for name, reason in reasons.items())
        else:
            detail = "no backends are known (add backends to the configuration)"
        super().__init__(f"no backend can take an instance of {requirement.describe()}: {detail}")
        self.requirement = requirement
        self.reasons = dict(reasons)


@dataclass(slots=True)
class _Backend:
    view: BackendView
    order: int
    reservations: dict[int, Reservation] = field(default_factory=dict)
    # id -> monotonic time the job was accounted; dropped by the first update read after it.
    accounted: dict[int, float] = field(default_factory=dict)
    last_chosen: int = -1


class Allocator:
    """Chooses a backend per spec and tracks what is in flight to each."""

    def __init__(self, strategy: Strategy = "credits") -> None:
        if strategy not in ("credits", "round_robin"):
            raise ValueError(f"unknown strategy {strategy!r}: use 'credits' or 'round_robin'")
        self.strategy: Strategy = strategy
        self._backends: dict[str, _Backend] = {}
        self._ids = itertools.count(1)
        self._placements = itertools.count()

    # -- state -------------------------------------------------------------------------------

    def update(self, view: BackendView) -> None:
        """Replace a backend's view (adding the backend if new).

        Reservations stay, except those :meth:`accounted` at or before ``view.stats_at``
        (or any accounted one when ``stats_at`` is ``None``): fresh stats include them.
        """
        backend = self._backends.get(view.name)
        if backend is None:
            self._backends[view.name] = _Backend(view=view, order=len(self._backends))
            return
        backend.view = view
        for rid, at in list(backend.accounted.items()):
            if view.stats_at is None or view.stats_at >= at:
                del backend.accounted[rid]
                backend.reservations.pop(rid, None)

    def forget(self, name: str) -> None:
        """Drop a backend (removed from the configuration) and its reservations."""
        self._backends.pop(name, None)

    @property
    def backends(self) -> list[str]:
        return list(self._backends)

    def view(self, name: str) -> BackendView:
        return self._backends[name].view

    def pending(self, name: str) -> Pending:
        backend = self._backends[name]
        reqs = [r.requirement for r in backend.reservations.values()]
        return Pending(sum(r.memory for r in reqs), sum(r.disk for r in reqs), len(reqs))

    def due_for_refresh(self, *, interval: float, now: float | None = None) -> list[str]:
        """Backends whose stats are older than ``interval`` or miss an accounted placement."""
        now = time.monotonic() if now is None else now
        return [
            name
            for name, b in self._backends.items()
            if b.accounted or b.view.stats_at is None or now - b.view.stats_at >= interval
        ]

    # -- decisions ---------------------------------------------------------------------------

    def _assess(self, backend: _Backend, req: Requirement, now: float) -> tuple[int, str | None]:
        view = backend.view
        if view.drained:
            return 0, "drained"
        if not view.healthy:
            return 0, "failing health checks"
        if view.refusing_until is not None and view.refusing_until > now:
            return 0, f"refusing submissions (503) for {math.ceil(view.refusing_until - now)} s more"
        if view.disk_templates and req.disk_template not in view.disk_templates:
            enabled = ", ".join(sorted(view.disk_templates))
            return 0, f"disk template {req.disk_template} not enabled (enabled: {enabled})"
        usable = view.usable_nodes
        if not usable:
            return 0, "no usable node (all offline, drained or not vm_capable)"
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

    def _ranked(self, req: Requirement, now: float) -> list[tuple[_Backend, int]]:
        eligible: list[tuple[_Backend, int]] = []
        for backend in self._backends.values():
            credits, reason = self._assess(backend, req, now)
            if reason is None:
                eligible.append((backend, credits))

        def key(item: tuple[_Backend, int]) -> tuple[int, int, int]:
            backend, credits = item
            # Least recently chosen first among equals: equal backends share the load.
            primary = -credits if self.strategy == "credits" else 0
            return (primary, backend.last_chosen, backend.order)

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

    def place(self, spec: InstanceSpec | Requirement, *, now: float | None = None) -> Reservation:
        """Choose a backend for ``spec`` and reserve its requirement there."""
        now = time.monotonic() if now is None else now
        req = self._requirement(spec)
        ranked = self._ranked(req, now)
        if not ranked:
            raise NoCapacityError(req, self.rejected(req, now=now))
        backend = ranked[0][0]
        reservation = Reservation(name=backend.view.name, requirement=req, id=next(self._ids))
        backend.reservations[reservation.id] = reservation
        backend.last_chosen = next(self._placements)
        return reservation

    def release(self, reservation: Reservation) -> bool:
        """Give a reservation's capacity back (the create failed or was never sent)."""
        backend = self._backends.get(reservation.name)
        if backend is None:
            return False
        backend.accounted.pop(reservation.id, None)
        return backend.reservations.pop(reservation.id, None) is not None

    def accounted(self, reservation: Reservation, *, now: float | None = None) -> None:
        """The job ran: drop the reservation at the first :meth:`update` read after ``now``."""
        backend = self._backends.get(reservation.name)
        if backend is not None and reservation.id in backend.reservations:
            backend.accounted[reservation.id] = time.monotonic() if now is None else now

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
