"""The fake cluster's state: nodes, instances, and the checks Ganeti makes on them.

Pure data and decisions; the job engine calls these from its ops. Failures are
raised as :class:`OpFailure` carrying exactly the result Ganeti 3.0 writes into the
failed op (``[ErrorType, [message, ecode]]``), with the messages Ganeti uses.
"""

from __future__ import annotations

import itertools
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FakeInstance", "FakeNode", "OpFailure", "free_capacity", "instance_status", "parse_size"]

_MAC_COUNTER = itertools.count(0x100000)


class OpFailure(Exception):
    """An op fails with Ganeti's result ``[kind, [message, ecode]]`` (or ``[kind, [message]]``)."""

    def __init__(self, kind: str, message: str, ecode: str | None = None, *, prereq: bool = True) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.ecode = ecode
        self.prereq = prereq  # failed before the op started executing (no exec_timestamp)

    @property
    def result(self) -> list[Any]:
        args: list[Any] = [self.message] if self.ecode is None else [self.message, self.ecode]
        return [self.kind, args]


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([mMgGtT]?)\s*$")


def parse_size(key: str, value: Any) -> int:
    """A Ganeti size (MiB): an int, or a string like ``512``, ``512M``, ``2G``; else TypeEnforcementError."""
    if isinstance(value, bool):
        raise OpFailure(
            "TypeEnforcementError",
            f"'{key}' (value {value}) is not a valid size. error: Invalid format",
            prereq=False,
        )
    if isinstance(value, int):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise OpFailure(
            "TypeEnforcementError",
            f"'{key}' (value {value}) is not a valid size. error: Invalid format",
            prereq=False,
        )
    number, unit = float(match.group(1)), match.group(2).lower()
    return int(number * {"": 1, "m": 1, "g": 1024, "t": 1024 * 1024}[unit])


@dataclass
class FakeNode:
    """A node: capacity in MiB and CPUs; ``mfree``/``dfree`` follow its instances.

    ``crashed``: the machine is gone (``FakeGaneti.crash_node``) while Ganeti's configuration
    still lists it, online: every RPC to it fails, so Ganeti reads no live data from it
    (``live`` false, as for an ``offline`` node, which Ganeti does not even ask).
    """

    name: str
    mtotal: int = 32768
    mnode: int = 1024
    dtotal: int = 512 * 1024
    ctotal: int = 8
    offline: bool = False
    drained: bool = False
    vm_capable: bool = True
    master: bool = False
    candidate: bool = True  # a master candidate (``master_candidate``), else a regular node
    uuid: str = field(default_factory=lambda: str(uuid.uuid4()))
    ip: str = "198.51.100.10"
    tags: list[str] = field(default_factory=list)
    ctime: float = field(default_factory=time.time)
    serial_no: int = 1
    ndparams: dict[str, Any] = field(default_factory=dict)  # the node's own, over the defaults
    crashed: bool = False

    @property
    def live(self) -> bool:
        """Whether Ganeti reads the node's live data: it is not offline and it answers RPC."""
        return not self.offline and not self.crashed


@dataclass
class FakeInstance:
    """An instance as the fake cluster keeps it."""

    name: str
    pnode: str
    os: str
    disk_template: str
    hypervisor: str
    beparams: dict[str, Any]
    custom_beparams: dict[str, Any]
    nics: list[dict[str, Any]]
    disks: list[dict[str, Any]]
    tags: list[str]
    admin_state: str = "up"
    oper_state: bool = True
    hvparams: dict[str, Any] = field(default_factory=dict)
    osparams: dict[str, Any] = field(default_factory=dict)  # its own (3.1's custom_osparams)
    uuid: str = field(default_factory=lambda: str(uuid.uuid4()))
    ctime: float = field(default_factory=time.time)
    mtime: float = field(default_factory=time.time)
    serial_no: int = 1

    @property
    def memory(self) -> int:
        return int(self.beparams.get("maxmem", 0))

    @property
    def disk_usage(self) -> int:
        return 0 if self.disk_template == "diskless" else sum(int(d["size"]) for d in self.disks)

    def touch(self) -> None:
        self.mtime = time.time()
        self.serial_no += 1


def new_mac(prefix: str = "aa:00:00") -> str:
    value = next(_MAC_COUNTER)
    return f"{prefix}:{value >> 16 & 0xFF:02x}:{value >> 8 & 0xFF:02x}:{value & 0xFF:02x}"


def instance_status(inst: FakeInstance, node: FakeNode | None) -> str:
    """``query._GetInstStatus``: ``ERROR_nodeoffline`` when the primary node is offline,
    ``ERROR_nodedown`` when it does not answer (``ctx.bad_nodes``), else from the admin state
    and whether it runs (``_GetLiveInstStatus``/``_GetDeadInstStatus``)."""
    if node is not None and node.offline:
        return "ERROR_nodeoffline"
    if node is not None and node.crashed:
        return "ERROR_nodedown"
    if inst.admin_state == "up":
        return "running" if inst.oper_state else "ERROR_down"
    return "ERROR_up" if inst.oper_state else "ADMIN_down"


def instance_view(inst: FakeInstance, link: str, node: FakeNode | None = None) -> dict[str, Any]:
    """``GET /2/instances/NAME`` (and each item of ``?bulk=1``), keys as Ganeti 3.0 gives them.

    ``node``: its primary node; when Ganeti reads no live data from it (offline or crashed),
    the live fields (``oper_state``, ``oper_ram``, ``oper_vcpus``) are ``null``
    (``query._GetInstOperState``, ``_GetInstLiveData``: ``_FS_NODATA``, which RAPI's bulk
    listing gives as ``null``) and ``status`` says why (:func:`instance_status`)."""
    running: bool | None = inst.oper_state if node is None or node.live else None
    status = instance_status(inst, node)
    return {
        "name": inst.name,
        "admin_state": inst.admin_state,
        "os": inst.os,
        "pnode": inst.pnode,
        "snodes": [],
        "disk_template": inst.disk_template,
        "nic.ips": [nic.get("ip") for nic in inst.nics],
        "nic.macs": [nic["mac"] for nic in inst.nics],
        "nic.modes": [nic.get("mode", "bridged") for nic in inst.nics],
        "nic.uuids": [nic["uuid"] for nic in inst.nics],
        "nic.names": [nic.get("name") for nic in inst.nics],
        "nic.links": [nic.get("link", link) for nic in inst.nics],
        "nic.networks": [nic.get("network_uuid", nic.get("network")) for nic in inst.nics],
        "nic.networks.names": [nic.get("network") for nic in inst.nics],
        "nic.bridges": [nic.get("link", link) for nic in inst.nics],
        "network_port": None,
        "disk.sizes": [int(d["size"]) for d in inst.disks],
        "disk.spindles": [None for _ in inst.disks],
        "disk_usage": inst.disk_usage,
        "disk.uuids": [d["uuid"] for d in inst.disks],
        "disk.names": [d.get("name") for d in inst.disks],
        "beparams": dict(inst.beparams),
        "hvparams": dict(inst.hvparams),
        "oper_state": running,
        "oper_ram": inst.memory if running else None,
        "oper_vcpus": inst.beparams.get("vcpus") if running else None,
        "status": status,
        "custom_hvparams": dict(inst.hvparams),
        "custom_beparams": dict(inst.custom_beparams),
        "custom_nicparams": [dict(nic.get("nicparams") or {}) for nic in inst.nics],
        "ctime": inst.ctime,
        "mtime": inst.mtime,
        "uuid": inst.uuid,
        "serial_no": inst.serial_no,
        "tags": list(inst.tags),
    }


def free_capacity(node: FakeNode, instances: Iterable[FakeInstance]) -> tuple[int | None, int | None]:
    """Free memory (running instances count) and disk on a node, in MiB; ``None`` when Ganeti
    reads no live data from it (offline, or crashed)."""
    if not node.live:
        return None, None
    used_memory = used_disk = 0
    for inst in instances:
        if inst.pnode == node.name:
            used_memory += inst.memory if inst.oper_state else 0
            used_disk += inst.disk_usage
    return node.mtotal - node.mnode - used_memory, node.dtotal - used_disk


def node_role(node: FakeNode) -> str:
    """Ganeti's node role letter: master, offline, drained, (master) candidate, regular."""
    if node.master:
        return "M"
    if node.offline or node.drained:
        return "O" if node.offline else "D"
    return "C" if node.candidate else "R"


def node_view(node: FakeNode, instances: list[FakeInstance], group_uuid: str) -> dict[str, Any]:
    """``GET /2/nodes?bulk=1`` items. The live figures (``query._NODE_LIVE_FIELDS``: memory,
    disk, CPUs) are ``null`` for a node Ganeti reads no live data from, offline or crashed
    (``_GetLiveNodeField``: ``_FS_OFFLINE``, ``_FS_NODATA``), as recorded in
    tests/fixtures/ganeti-3.0-nodefail; the rest (role, instances, ``offline``) stays."""
    mine = [inst for inst in instances if inst.pnode == node.name]
    mfree, dfree = free_capacity(node, mine)
    live = node.live
    return {
        "name": node.name,
        "offline": node.offline,
        "master_candidate": node.master or (node.candidate and not node.offline and not node.drained),
        "drained": node.drained,
        "dtotal": node.dtotal if live else None,
        "dfree": dfree,
        "sptotal": None,
        "spfree": None,
        "mtotal": node.mtotal if live else None,
        "mnode": node.mnode if live else None,
        "mfree": mfree,
        "pinst_cnt": len(mine),
        "sinst_cnt": 0,
        "ctotal": node.ctotal if live else None,
        "cnos": node.ctotal if live else None,
        "cnodes": 1 if live else None,
        "csockets": 1 if live else None,
        "pip": node.ip,
        "sip": node.ip,
        "role": node_role(node),
        "pinst_list": sorted(inst.name for inst in mine),
        "sinst_list": [],
        "master_capable": True,
        "vm_capable": node.vm_capable,
        "ndparams": {
            "oob_program": "",
            "spindle_count": 1,
            "exclusive_storage": False,
            "ovs": False,
            "ovs_name": "switch1",
            "ovs_link": "",
            "ssh_port": 22,
            "cpu_speed": 1,
        }
        | node.ndparams,
        "group.uuid": group_uuid,
        "ctime": node.ctime,
        "mtime": node.ctime,
        "uuid": node.uuid,
        "serial_no": node.serial_no,
        "tags": list(node.tags),
    }
