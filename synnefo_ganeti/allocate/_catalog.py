"""What a backend offers (its :class:`Catalog`) and whether a spec is one it takes (pure code).

A backend's catalog comes from three RAPI answers: ``GET /2/os`` (the OS names, with their
variants as ``os+variant``), ``GET /2/info`` (``enabled_disk_templates`` and the instance
policy ``ipolicy``: ``minmax`` pairs of ``min``/``max`` specs and the allowed
``disk-templates``) and ``GET /2/nodes?bulk=1`` (each node's total memory and disk).

:func:`refusals` says why one backend does not take a spec, the way Ganeti 3.0 would refuse
it (``ComputeIPolicySpecViolation`` in cmdlib/common.py: the spec fits one ``minmax`` pair,
its memory is ``maxmem``, a diskless instance has no disk checks), each with the spec field at
fault. :func:`check_spec` raises :class:`ValidationError` when no backend takes it, naming the
field and what would be accepted; :func:`check_name` checks the name as Ganeti's
``netutils.Hostname`` does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from synnefo_ganeti.allocate._addresses import NetworkPool, network_refusals, pools_of
from synnefo_ganeti.errors import ValidationError
from synnefo_ganeti.rapi import ClusterInfo, InstanceSpec, Network, Node

__all__ = [
    "Catalog",
    "PolicyBounds",
    "Refusal",
    "check_name",
    "check_numbers",
    "check_spec",
    "refusals",
    "spec_values",
]

#: a DNS label: letters, digits and hyphens, not starting or ending with a hyphen
#: (``netutils.Hostname._VALID_NAME_RE``)
_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$", re.IGNORECASE)
_MAX_NAME = 255
DEFAULT_MEMORY_MIB = 128  # the cluster's default beparams (maxmem 128) when the spec gives none

_UNITS = {"memory-size": "MiB", "disk-size": "MiB"}


@dataclass(frozen=True, slots=True)
class PolicyBounds:
    """One ``minmax`` pair of an instance policy: ``key -> (min, max)``."""

    bounds: Mapping[str, tuple[int, int]]

    @classmethod
    def parse(cls, ipolicy: Mapping[str, Any]) -> tuple[PolicyBounds, ...]:
        out = []
        for pair in ipolicy.get("minmax") or ():
            if not isinstance(pair, Mapping):
                continue
            low, high = pair.get("min") or {}, pair.get("max") or {}
            bounds = {
                key: (int(low[key]), int(high[key]))
                for key in set(low) & set(high)
                if _is_int(low[key]) and _is_int(high[key])
            }
            out.append(cls(bounds))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class Catalog:
    """What one backend offers. A part not known (not fetched, not answered) is ``None``."""

    name: str
    oses: frozenset[str] | None = None
    disk_templates: frozenset[str] | None = None
    policy: tuple[PolicyBounds, ...] = ()
    policy_templates: frozenset[str] | None = None  # the ipolicy's "disk-templates"
    largest_memory: int | None = None  # MiB, the largest usable node's total memory
    largest_disk: int | None = None  # MiB, the largest usable node's total disk
    #: MiB, the most memory an instance can ever have on a usable node: its total less what the
    #: node uses itself (``mnode``), the most it can ever free
    memory_room: int | None = None
    largest_cpus: int | None = None  # the most CPUs of a usable node
    #: its Ganeti networks by name (``GET /2/networks?bulk=1``; ``allocate/_addresses.py``)
    networks: Mapping[str, NetworkPool] | None = None

    @classmethod
    def of(
        cls,
        name: str,
        info: ClusterInfo | None,
        nodes: Sequence[Node] | None,
        oses: Iterable[str] | None,
        networks: Iterable[Network] | None = None,
    ) -> Catalog:
        templates = policy_templates = None
        policy: tuple[PolicyBounds, ...] = ()
        if info is not None:
            templates = frozenset(info.enabled_disk_templates) or None
            policy = PolicyBounds.parse(info.ipolicy)
            allowed = info.ipolicy.get("disk-templates")
            policy_templates = frozenset(str(t) for t in allowed) if isinstance(allowed, list) else None
        largest_memory = largest_disk = memory_room = largest_cpus = None
        if nodes is not None:
            usable = [n for n in nodes if not n.offline and not n.drained and n.vm_capable is not False]
            memories = [n.mtotal for n in usable if n.mtotal is not None]
            disks = [n.dtotal for n in usable if n.dtotal is not None]
            largest_memory = max(memories) if memories else None
            largest_disk = max(disks) if disks else None
            rooms = [n.mtotal - (n.mnode or 0) for n in usable if n.mtotal is not None]
            memory_room = max(rooms) if rooms else None
            cpus = [n.ctotal for n in usable if n.ctotal is not None]
            largest_cpus = max(cpus) if cpus else None
        return cls(
            name=name,
            oses=frozenset(oses) if oses is not None else None,
            disk_templates=templates,
            policy=policy,
            policy_templates=policy_templates,
            largest_memory=largest_memory,
            largest_disk=largest_disk,
            memory_room=memory_room,
            largest_cpus=largest_cpus,
            networks=None if networks is None else pools_of(networks),
        )

    def offers_os(self, os_name: str) -> bool:
        return self.oses is None or os_name in self.oses

    def offers_template(self, template: str) -> bool:
        return (self.disk_templates is None or template in self.disk_templates) and (
            self.policy_templates is None or template in self.policy_templates
        )


#: the keys of refusals by the nodes' sizes (the others': the instance policy's keys, or None)
NODE_MEMORY, NODE_DISK, NODE_CPUS = "node-memory", "node-disk", "node-cpus"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a backend does not take a spec: the spec ``field`` at fault and the ``reason``;
    ``key`` what refused it (an instance policy key such as ``disk-size``, a node limit such as
    :data:`NODE_MEMORY`, or None)."""

    field: str
    reason: str
    key: str | None = None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_name(name: str) -> None:
    """Raise :class:`ValidationError` unless ``name`` is a hostname Ganeti accepts."""
    labels = name.rstrip(".").split(".") if name else []
    # (fullmatch: ``$`` would let a trailing newline through)
    if not labels or len(name) > _MAX_NAME or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValidationError(
            f"name {name!r} is not a valid Ganeti instance name: use a DNS hostname, labels of letters, "
            "digits and hyphens (not starting or ending with a hyphen) joined by dots, at most 63 "
            f"characters a label and {_MAX_NAME} in all",
            field="name",
        )


def spec_values(spec: InstanceSpec) -> list[tuple[str, str, int | None]]:
    """``(ipolicy key, spec field, value)`` of ``spec`` as Ganeti's policy check sees them."""
    beparams = spec.beparams
    memory_key = "beparams.maxmem" if "maxmem" in beparams else "beparams.memory"
    memory = beparams.get("maxmem", beparams.get("memory", DEFAULT_MEMORY_MIB))
    values: list[tuple[str, str, int | None]] = [
        ("memory-size", memory_key, memory if _is_int(memory) else None),
        ("cpu-count", "beparams.vcpus", _int_or_none(beparams.get("vcpus", 1))),
        ("nic-count", "nics", len(spec.nics)),
    ]
    if "spindle_use" in beparams:
        values.append(("spindle-use", "beparams.spindle_use", _int_or_none(beparams["spindle_use"])))
    if spec.disk_template != "diskless":
        values.append(("disk-count", "disks", len(spec.disks)))
        for index, disk in enumerate(spec.disks):
            values.append(("disk-size", f"disks[{index}].size", _int_or_none(disk.get("size"))))
    return values


def _int_or_none(value: Any) -> int | None:
    return value if _is_int(value) else None


def check_numbers(spec: InstanceSpec) -> None:
    """Raise :class:`ValidationError` for a memory, vCPU or disk size not a positive integer (MiB)."""
    beparams = spec.beparams
    checks: list[tuple[str, Any]] = [
        (f"beparams.{key}", beparams[key])
        for key in ("memory", "maxmem", "minmem", "vcpus")
        if key in beparams
    ]
    if spec.disk_template != "diskless":
        checks += [(f"disks[{i}].size", disk.get("size")) for i, disk in enumerate(spec.disks)]
    for field, value in checks:
        if not _is_int(value) or value <= 0:
            unit = "" if field == "beparams.vcpus" else " (MiB)"
            raise ValidationError(f"{field} {value!r}: must be a positive integer{unit}", field=field)


def refusals(catalog: Catalog, spec: InstanceSpec) -> list[Refusal]:
    """Why ``catalog``'s backend does not take ``spec`` (empty: it may; unknown parts pass)."""
    out: list[Refusal] = []
    if not catalog.offers_os(spec.os):
        out.append(Refusal("os", f"OS {spec.os} not offered"))
    if not catalog.offers_template(spec.disk_template):
        out.append(Refusal("disk_template", f"disk template {spec.disk_template} not enabled"))
    if catalog.networks is not None:
        out += [Refusal(field, reason) for field, reason in network_refusals(catalog.networks, spec)]
    values = spec_values(spec)
    if catalog.policy:
        best: list[Refusal] | None = None
        for pair in catalog.policy:
            errors = [
                Refusal(field, f"{key} value {value} is not in range [{low}, {high}]", key)
                for key, field, value in values
                if value is not None and key in pair.bounds
                for low, high in [pair.bounds[key]]
                if not low <= value <= high
            ]
            if best is None or len(errors) < len(best):
                best = errors
        out += best or []
    return out + _node_refusals(catalog, spec, values)


def _node_refusals(
    catalog: Catalog, spec: InstanceSpec, values: list[tuple[str, str, int | None]]
) -> list[Refusal]:
    """What no usable node of ``catalog`` can ever hold: more memory than its total less its own
    use (the most it can ever free), more vCPUs than its CPUs (placement's rule), more disk in all
    than its total (all of an instance's disks are on its node). Field: the size at fault."""
    out: list[Refusal] = []
    memory = values[0][2]
    room = catalog.memory_room
    if spec.start and memory is not None and room is not None and memory > room:
        out.append(
            Refusal(values[0][1], f"no node can ever free {memory} MiB memory (at most {room})", NODE_MEMORY)
        )
    vcpus = values[1][2]
    if vcpus is not None and catalog.largest_cpus is not None and vcpus > catalog.largest_cpus:
        out.append(
            Refusal(values[1][1], f"no node has {vcpus} CPUs (at most {catalog.largest_cpus})", NODE_CPUS)
        )
    if spec.disk_template != "diskless" and catalog.largest_disk is not None:
        sizes = [(field, v) for key, field, v in values if key == "disk-size" and v is not None]
        total = sum(v for _, v in sizes)
        if total > catalog.largest_disk:
            # one disk: its size is at fault; several: their sum on one node ("disks")
            field = sizes[0][0] if len(sizes) == 1 else "disks"
            out.append(
                Refusal(field, f"no node has {total} MiB disk (largest {catalog.largest_disk})", NODE_DISK)
            )
    return out


def _accepted(
    catalogs: Sequence[Catalog], field: str, spec: InstanceSpec, keys: frozenset[str | None] = frozenset()
) -> str:
    """What ``field`` would be accepted as, across ``catalogs`` (``keys``: what refused it)."""
    if field == "os":
        known = sorted({os for c in catalogs for os in c.oses or ()})
        return f"offered: {', '.join(known)}" if known else "no backend lists its OSes"
    if field.startswith("nics["):
        known = sorted({n for c in catalogs for n, p in (c.networks or {}).items() if p.connected})
        return f"networks: {', '.join(known)}" if known else "no backend has a network connected"
    if field == "disk_template":
        known = sorted(
            {t for c in catalogs if c.disk_templates for t in c.disk_templates if c.offers_template(t)}
        )
        return f"enabled: {', '.join(known)}" if known else "no backend lists its templates"
    key = next((k for k, f, _ in spec_values(spec) if f == field), None)
    if field == "disks" and "disk-count" not in keys:
        key = None  # refused for the room of all its disks on one node, not for how many they are
    ranges = [(pair.bounds[key], c.name) for c in catalogs for pair in c.policy if key and key in pair.bounds]
    unit = _UNITS.get(key or "", "")
    suffix = f" {unit}" if unit else (" disks" if key == "disk-count" else "")
    parts = []
    fit = largest_fit(catalogs, spec, field)
    if fit is not None:
        size, at, why = fit
        unit = "" if field == "beparams.vcpus" else " MiB" + (" in all" if field == "disks" else "")
        parts.append(f"the largest that can fit is {size}{unit} (backend {at}: {why})")
    if ranges:
        (low, _), low_at = min(ranges, key=lambda r: r[0][0])
        (_, high), high_at = max(ranges, key=lambda r: r[0][1])
        parts.append(
            f"the smallest any backend admits is {low}{suffix} (backend {low_at}'s instance policy), "
            f"the largest {high}{suffix} (backend {high_at}'s instance policy)"
        )
    return "; ".join(parts) or "see each backend's instance policy"


def largest_fit(catalogs: Sequence[Catalog], spec: InstanceSpec, field: str) -> tuple[int, str, str] | None:
    """The largest value of a size ``field`` (memory, vCPUs, a disk's size, ``disks``: all disks
    in all) that some backend of ``catalogs`` can ever take, the rest of ``spec`` as it is: its
    instance policy's largest and what its largest usable node can hold, the smaller; with the
    backend and what limits it there. None: not a size, or nothing known."""
    values = spec_values(spec)
    key = next((k for k, f, _ in values if f == field), None)
    if field == "disks":
        key = "disks"
    elif key not in ("memory-size", "cpu-count", "disk-size"):
        return None
    others = sum(v or 0 for k, f, v in values if k == "disk-size" and f != field)
    best: tuple[int, str, str] | None = None
    for catalog in catalogs:
        limits: list[tuple[int, str]] = []
        highs = [pair.bounds[key][1] for pair in catalog.policy if key in pair.bounds]
        if highs:
            limits.append((max(highs), "its instance policy's largest"))
        if key == "memory-size" and catalog.memory_room is not None:
            limits.append((catalog.memory_room, "its largest usable node less what the node uses itself"))
        elif key == "cpu-count" and catalog.largest_cpus is not None:
            limits.append((catalog.largest_cpus, "the CPUs of its largest usable node"))
        elif key == "disk-size" and catalog.largest_disk is not None:
            room = max(0, catalog.largest_disk - others)
            limits.append(
                (room, "its largest usable node's disk" + (", less the other disks" if others else ""))
            )
        elif key == "disks" and catalog.largest_disk is not None:
            limits.append((catalog.largest_disk, "its largest usable node's disk"))
        if limits:
            size, why = min(limits)
            if best is None or size > best[0]:
                best = (size, catalog.name, why)
    return best


def check_spec(spec: InstanceSpec, catalogs: Sequence[Catalog]) -> None:
    """Raise :class:`ValidationError` unless some backend of ``catalogs`` may take ``spec``.

    The error names the field that the fewest backends admit (``os``, ``disk_template``,
    ``beparams.memory``, ``disks[0].size``, ...) and what would be accepted. With no
    catalogs (none known) nothing is refused.
    """
    if not catalogs:
        return
    reasons = {c.name: refusals(c, spec) for c in catalogs}
    if any(not r for r in reasons.values()):
        return
    # the field refused by the most backends is the one to change; ties: the spec's order
    # (the disk count's field, "disks", is also the one of all disks on one node: last)
    order = ["name", "os", "disk_template"] + [f for _, f, _ in spec_values(spec) if f != "disks"] + ["disks"]
    counts: dict[str, int] = {}
    for refused in reasons.values():
        for field in dict.fromkeys(r.field for r in refused):
            counts[field] = counts.get(field, 0) + 1
    field = max(counts, key=lambda f: (counts[f], -order.index(f) if f in order else -len(order)))
    value = _field_value(spec, field)
    keys = frozenset(r.key for refused in reasons.values() for r in refused if r.field == field)
    detail = "; ".join(f"{name}: {', '.join(r.reason for r in refused)}" for name, refused in reasons.items())
    if counts[field] == len(catalogs):
        raise ValidationError(
            f"{field} {value}: no backend admits it; {_accepted(catalogs, field, spec, keys)} ({detail})",
            field=field,
        )
    raise ValidationError(
        f"no backend takes this spec as a whole ({detail}); change {field} "
        f"({_accepted(catalogs, field, spec, keys)})",
        field=field,
    )


def _field_value(spec: InstanceSpec, field: str) -> str:
    if field == "os":
        return spec.os
    if field == "disk_template":
        return spec.disk_template
    if field == "nics":
        return f"({len(spec.nics)} NICs)"
    if field.startswith("nics[") and "]." in field:
        index, key = field[len("nics[") :].split("].", 1)
        nic = spec.nics[int(index)] if index.isdigit() and int(index) < len(spec.nics) else {}
        return str(nic.get(key, "")) if isinstance(nic, Mapping) else ""
    if field == "disks":
        total = sum(v or 0 for key, _, v in spec_values(spec) if key == "disk-size")
        return f"({len(spec.disks)} disks, {total} MiB in all)"
    for key, name, value in spec_values(spec):
        if name == field:
            unit = _UNITS.get(key)
            return f"{value} {unit}" if unit else str(value)
    return ""
