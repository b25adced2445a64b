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

    @property
    def usable_nodes(self) -> list[Node]:
        return [
            n
            for n in self.nodes
            if not n.offline and not n.drained and n.vm_capable is not False and n.name not in self.out_nodes
        ]

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
    #: the primary (and, for a mirrored template, secondary) node chosen, when nodes were placed
    node: str | None = None
    snode: str | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes whose locks this create takes (none when Ganeti chooses)."""
        return tuple(n for n in (self.node, self.snode) if n is not None)
