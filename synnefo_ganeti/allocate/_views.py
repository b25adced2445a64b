"""What placement reasons about: a spec's :class:`Requirement`, a backend's :class:`BackendView`,
what is :class:`Pending` there, and one placement's :class:`Reservation` (pure data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from synnefo_ganeti.allocate._catalog import Catalog
from synnefo_ganeti.rapi import InstanceSpec, Node

__all__ = ["DEFAULT_MEMORY_MIB", "BackendView", "Pending", "Requirement", "Reservation"]

DEFAULT_MEMORY_MIB = 128


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
    #: the spec itself, for the checks against a backend's catalog (OS, instance policy)
    spec: InstanceSpec | None = field(default=None, compare=False, repr=False)

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
        return cls(memory=memory, disk=size, vcpus=vcpus, disk_template=spec.disk_template, spec=spec)

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
    ``catalog``: what the backend offers (OSes, instance policy; ``None``: unknown, no check).
    ``out_nodes``: nodes down or offline (:mod:`._liveness`): neither chosen nor counted in its
    capacity; the :class:`~synnefo_ganeti.allocate.Allocator` keeps it (whatever a caller sets).
    """

    name: str
    nodes: list[Node] = field(default_factory=list)
    disk_templates: frozenset[str] = frozenset()
    drained: bool = False
    healthy: bool = True
    refusing_until: float | None = None
    stats_at: float | None = None
    catalog: Catalog | None = None
    out_nodes: frozenset[str] = frozenset()

    #: the usable nodes and their sums, worked out once per view (every placement reads them)
    _usable: _Usable | None = field(default=None, init=False, repr=False, compare=False)

    def _aggregate(self) -> _Usable:
        usable = self._usable
        if usable is None:
            usable = _Usable.of(self.nodes, self.out_nodes)
            object.__setattr__(self, "_usable", usable)
        return usable

    @property
    def usable_nodes(self) -> list[Node]:
        return list(self._aggregate().nodes)

    @property
    def usable_count(self) -> int:
        return len(self._aggregate().nodes)

    @property
    def free_memory(self) -> int:
        return self._aggregate().free_memory

    @property
    def largest_free_memory(self) -> int:
        return self._aggregate().largest_free_memory

    @property
    def free_disk(self) -> int:
        return self._aggregate().free_disk

    @property
    def largest_free_disk(self) -> int:
        return self._aggregate().largest_free_disk

    @property
    def max_vcpus(self) -> int | None:
        """The most CPUs of a usable node, ``None`` when no node reports it."""
        return self._aggregate().max_vcpus


@dataclass(frozen=True, slots=True)
class _Usable:
    """A view's usable nodes (not offline, not drained, vm_capable, not down) and their sums."""

    nodes: tuple[Node, ...]
    free_memory: int
    largest_free_memory: int
    free_disk: int
    largest_free_disk: int
    max_vcpus: int | None

    @classmethod
    def of(cls, nodes: list[Node], out: frozenset[str]) -> _Usable:
        usable = tuple(
            n
            for n in nodes
            if not n.offline and not n.drained and n.vm_capable is not False and n.name not in out
        )
        memory = [n.mfree or 0 for n in usable]
        disk = [n.dfree or 0 for n in usable]
        cpus = [n.ctotal for n in usable if n.ctotal is not None]
        return cls(
            nodes=usable,
            free_memory=sum(memory),
            largest_free_memory=max(memory, default=0),
            free_disk=sum(disk),
            largest_free_disk=max(disk, default=0),
            max_vcpus=max(cpus) if cpus else None,
        )


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
    #: the primary (and, for a mirrored template, secondary) node chosen, when nodes were placed
    node: str | None = None
    snode: str | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes whose locks this create takes (none when Ganeti chooses)."""
        return tuple(n for n in (self.node, self.snode) if n is not None)
