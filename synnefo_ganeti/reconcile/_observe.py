"""What the control plane expects of an instance, what Ganeti reports, and how they differ.

Pure functions shared by the facade (which records the expectation from the spec at
create) and the reconciler (which compares it with ``/2/instances?bulk=1``). Only what
the expectation names is compared: an instance created with ``beparams={"memory": 512}``
is checked for its memory, not for Ganeti's defaults of everything else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from synnefo_ganeti.rapi import Instance, InstanceSpec

__all__ = [
    "BEPARAM_KEYS",
    "NIC_KEYS",
    "beparams_differ",
    "disks_differ",
    "expected_beparams",
    "expected_disks",
    "expected_nics",
    "nics_differ",
    "observed_beparams",
    "observed_disks",
    "observed_nics",
    "tags_differ",
]

BEPARAM_KEYS = ("maxmem", "minmem", "vcpus", "auto_balance", "always_failover", "spindle_use")
NIC_KEYS = ("mac", "ip", "mode", "link", "network", "name")


def expected_beparams(beparams: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's beparams as Ganeti 3.0 reports them (``memory`` sets both maxmem and minmem)."""
    expected = {key: beparams[key] for key in BEPARAM_KEYS if key in beparams}
    if "memory" in beparams:
        expected.setdefault("maxmem", beparams["memory"])
        expected.setdefault("minmem", beparams["memory"])
    return expected


def observed_beparams(instance: Instance) -> dict[str, Any]:
    return {key: instance.beparams[key] for key in BEPARAM_KEYS if key in instance.beparams}


def beparams_differ(expected: Mapping[str, Any] | None, instance: Instance) -> dict[str, tuple[Any, Any]]:
    """key -> (expected, Ganeti's) for each expected beparam Ganeti reports otherwise."""
    if not expected:
        return {}
    observed = observed_beparams(instance)
    return {key: (value, observed.get(key)) for key, value in expected.items() if observed.get(key) != value}


def expected_nics(nics: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{key: nic[key] for key in NIC_KEYS if nic.get(key) is not None} for nic in nics]


def observed_nics(instance: Instance) -> list[dict[str, Any]]:
    count = len(instance.nic_macs)

    def at(values: list[Any], index: int) -> Any:
        return values[index] if index < len(values) else None

    nics = []
    for index in range(count):
        nic = {
            "mac": at(instance.nic_macs, index),
            "ip": at(instance.nic_ips, index),
            "mode": at(instance.nic_modes, index),
            "link": at(instance.nic_links, index),
            "network": at(instance.nic_networks, index),
        }
        nics.append({key: value for key, value in nic.items() if value is not None})
    return nics


def nics_differ(expected: list[dict[str, Any]] | None, instance: Instance) -> str | None:
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


def observed_disks(instance: Instance) -> list[dict[str, Any]]:
    return [{"size": size} for size in instance.disk_sizes]


def disks_differ(expected: list[dict[str, Any]] | None, instance: Instance) -> str | None:
    if expected is None:
        return None
    want = [disk.get("size") for disk in expected]
    have = list(instance.disk_sizes)
    if want != have:
        return f"disk sizes expected {want}, Ganeti reports {have}"
    return None


def tags_differ(expected: list[str] | None, instance: Instance) -> str | None:
    if expected is None:
        return None
    want, have = set(expected), set(instance.tags)
    if want == have:
        return None
    parts = []
    if want - have:
        parts.append(f"missing in Ganeti: {', '.join(sorted(want - have))}")
    if have - want:
        parts.append(f"only in Ganeti: {', '.join(sorted(have - want))}")
    return "; ".join(parts)


def expectation(spec: InstanceSpec, tags: list[str]) -> dict[str, Any]:
    """The columns the facade records for a new instance."""
    return {
        "os": spec.os,
        "disk_template": spec.disk_template,
        "beparams": expected_beparams(spec.beparams),
        "nics": expected_nics(spec.nics),
        "disks": expected_disks(spec.disks),
        "tags": sorted(set(tags)),
    }
