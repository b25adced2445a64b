"""What the control plane expects of an instance, what Ganeti reports, and how they differ.

Pure functions shared by the facade (which records the expectation from the spec at
create) and the reconciler (which compares it with the fields of ``/2/query/instance``,
see :mod:`._fetch`). Only what the expectation names is compared: an instance created with
``beparams={"memory": 512}`` is checked for its memory, not for Ganeti's defaults of
everything else.

They read Ganeti's side through :class:`InstanceView` (what :class:`~synnefo_ganeti.rapi.Instance`
and the reconciler's :class:`~._fetch.QueriedInstance` both offer) and the database's through
:class:`RowView` (:class:`~synnefo_ganeti.store.StoredInstance`, :class:`~._fetch.SnapshotRow`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from synnefo_ganeti.rapi import InstanceSpec
from synnefo_ganeti.reconcile._fetch import BEPARAM_KEYS, QueriedInstance
from synnefo_ganeti.store import InstanceStatus

__all__ = [
    "BEPARAM_KEYS",
    "NIC_KEYS",
    "InstanceView",
    "RowView",
    "beparams_differ",
    "disks_differ",
    "expected_beparams",
    "expected_disks",
    "expected_nics",
    "nics_differ",
    "observed_beparams",
    "observed_changes",
    "observed_disks",
    "observed_memory",
    "observed_nics",
    "observed_values",
    "our_tags",
    "tags_differ",
]

NIC_KEYS = ("mac", "ip", "mode", "link", "network", "name")


class InstanceView(Protocol):
    """What the comparisons read of an instance in Ganeti (``rapi.Instance``'s names)."""

    @property
    def name(self) -> str: ...
    @property
    def admin_state(self) -> str | None: ...
    @property
    def oper_state(self) -> bool | None: ...
    @property
    def status(self) -> str | None: ...
    @property
    def os(self) -> str | None: ...
    @property
    def pnode(self) -> str | None: ...
    @property
    def beparams(self) -> dict[str, Any]: ...
    @property
    def tags(self) -> list[str]: ...
    @property
    def nic_macs(self) -> list[str]: ...
    @property
    def nic_ips(self) -> list[str | None]: ...
    @property
    def nic_modes(self) -> list[str | None]: ...
    @property
    def nic_links(self) -> list[str | None]: ...
    @property
    def nic_networks(self) -> list[str | None]: ...
    @property
    def disk_sizes(self) -> list[int]: ...
    @property
    def disk_uuids(self) -> list[str | None]: ...


class RowView(Protocol):
    """What the comparisons read of an instance's row (``store.StoredInstance``'s names)."""

    @property
    def backend(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def status(self) -> InstanceStatus: ...
    @property
    def owned(self) -> bool: ...
    @property
    def create_job_id(self) -> int | None: ...
    @property
    def updated_at(self) -> datetime | None: ...
    @property
    def os(self) -> str | None: ...
    @property
    def beparams(self) -> dict[str, Any] | None: ...
    @property
    def nics(self) -> list[dict[str, Any]] | None: ...
    @property
    def disks(self) -> list[dict[str, Any]] | None: ...
    @property
    def tags(self) -> list[str] | None: ...
    @property
    def memory(self) -> int | None: ...
    @property
    def vcpus(self) -> int | None: ...
    @property
    def pnode(self) -> str | None: ...
    @property
    def node_state(self) -> str | None: ...


def expected_beparams(beparams: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's beparams as Ganeti 3.0 reports them (``memory`` sets both maxmem and minmem)."""
    expected = {key: beparams[key] for key in BEPARAM_KEYS if key in beparams}
    if "memory" in beparams:
        expected.setdefault("maxmem", beparams["memory"])
        expected.setdefault("minmem", beparams["memory"])
    return expected


def observed_beparams(instance: InstanceView) -> dict[str, Any]:
    return {key: instance.beparams[key] for key in BEPARAM_KEYS if key in instance.beparams}


def beparams_differ(expected: Mapping[str, Any] | None, instance: InstanceView) -> dict[str, tuple[Any, Any]]:
    """key -> (expected, Ganeti's) for each expected beparam Ganeti reports otherwise."""
    if not expected:
        return {}
    observed = observed_beparams(instance)
    return {key: (value, observed.get(key)) for key, value in expected.items() if observed.get(key) != value}


def expected_nics(nics: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{key: nic[key] for key in NIC_KEYS if nic.get(key) is not None} for nic in nics]


def _at(values: list[Any], index: int) -> Any:
    return values[index] if index < len(values) else None


def observed_nics(instance: InstanceView) -> list[dict[str, Any]]:
    """Ganeti's NICs, each ``{"mac", "ip", "network", "mode", "link"}`` (``None`` where unset)."""
    return [
        {
            "mac": _at(instance.nic_macs, index),
            "ip": _at(instance.nic_ips, index),
            # by name, as a spec names it (``nic.networks`` holds UUIDs; a view without names falls back)
            "network": _at(getattr(instance, "nic_network_names", None) or instance.nic_networks, index),
            "mode": _at(instance.nic_modes, index),
            "link": _at(instance.nic_links, index),
        }
        for index in range(len(instance.nic_macs))
    ]


def nics_differ(expected: list[dict[str, Any]] | None, instance: InstanceView) -> str | None:
    """What differs (a sentence), or None; only keys the expectation names are compared."""
    if expected is None:
        return None
    observed = observed_nics(instance)
    if len(expected) != len(observed):
        return f"{len(expected)} NICs expected, Ganeti reports {len(observed)}"
    for index, (want, have) in enumerate(zip(expected, observed, strict=True)):
        for key, value in want.items():
            if key == "name":
                continue  # not in the bulk answer's nic fields we read
            if have.get(key) != value:
                return f"NIC {index} {key}: expected {value!r}, Ganeti reports {have.get(key)!r}"
    return None


def expected_disks(disks: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{"size": int(disk["size"])} for disk in disks if "size" in disk]


def observed_disks(instance: InstanceView) -> list[dict[str, Any]]:
    """Ganeti's disks, each ``{"size", "uuid"}`` (size in MiB)."""
    return [
        {"size": size, "uuid": _at(instance.disk_uuids, index)}
        for index, size in enumerate(instance.disk_sizes)
    ]


def observed_memory(instance: InstanceView) -> int | None:
    """Ganeti's memory in MiB: ``maxmem`` (``memory`` in older answers)."""
    value = instance.beparams.get("maxmem", instance.beparams.get("memory"))
    return None if value is None else int(value)


def observed_values(instance: InstanceView) -> dict[str, Any]:
    """The instance columns Ganeti's answer fills: what :func:`synnefo_ganeti.store.store_observed` records.

    NICs ``{"mac", "ip", "network", "mode", "link"}``, disks ``{"size", "uuid"}``,
    ``memory`` (maxmem), ``vcpus``, ``os`` and ``pnode``.
    """
    vcpus = instance.beparams.get("vcpus")
    return {
        "nics": observed_nics(instance),
        "disks": observed_disks(instance),
        "memory": observed_memory(instance),
        "vcpus": None if vcpus is None else int(vcpus),
        "os": instance.os,
        "pnode": instance.pnode,
    }


def disks_differ(expected: list[dict[str, Any]] | None, instance: InstanceView) -> str | None:
    if expected is None:
        return None
    want = [disk.get("size") for disk in expected]
    have = list(instance.disk_sizes)
    if want != have:
        return f"disk sizes expected {want}, Ganeti reports {have}"
    return None


def observed_changes(
    rows: Mapping[str, RowView],
    instances: Mapping[str, InstanceView],
    *,
    held: Mapping[str, Collection[str]] | None = None,
) -> dict[str, dict[str, Any]]:
    """name -> :func:`observed_values` for each row (not DESTROYED) whose stored values differ.

    ``held``: name -> fields left out (a ``nics`` or ``disks`` drift not fixed stays reported
    until its fix is asked for, so its stored expectation is not overwritten).
    """
    held = held or {}
    changes = {}
    for name, row in rows.items():
        instance = instances.get(name)
        if instance is None or row.status is InstanceStatus.DESTROYED:
            continue
        if isinstance(instance, QueriedInstance) and instance.settles(row, tags=False):
            continue  # the fast path: the same values, nothing to record
        values = observed_values(instance)
        for key in held.get(name, ()):
            values.pop(key, None)
        if any(getattr(row, key) != value for key, value in values.items()):
            changes[name] = values
    return changes


def our_tags(tags: Iterable[str], namespace: str | None) -> list[str]:
    """The tags under ``namespace`` (``[ownership] tag_namespace``; None: all), sorted.

    Only these are the control plane's to store and compare: an operator's other tags
    on an instance in Ganeti are neither copied into the database nor a drift."""
    return sorted({tag for tag in tags if namespace is None or tag.startswith(namespace)})


def tags_differ(
    expected: list[str] | None, instance: InstanceView, namespace: str | None = None
) -> str | None:
    if expected is None:
        return None
    want, have = set(our_tags(expected, namespace)), set(our_tags(instance.tags, namespace))
    if want == have:
        return None
    parts = []
    if want - have:
        parts.append(f"missing in Ganeti: {', '.join(sorted(want - have))}")
    if have - want:
        parts.append(f"only in Ganeti: {', '.join(sorted(have - want))}")
    return "; ".join(parts)


def expectation(spec: InstanceSpec, tags: list[str], tag_namespace: str | None = None) -> dict[str, Any]:
    """The columns the facade records for a new instance (of ``tags``, those under ``tag_namespace``)."""
    return {
        "os": spec.os,
        "disk_template": spec.disk_template,
        "beparams": expected_beparams(spec.beparams),
        "nics": expected_nics(spec.nics),
        "disks": expected_disks(spec.disks),
        "tags": our_tags(tags, tag_namespace),
    }
