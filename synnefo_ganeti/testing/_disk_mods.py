"""The disk changes of ``OP_INSTANCE_SET_PARAMS`` (``gnt-instance modify --disk add|remove``).

Follows ``LUInstanceSetParams`` of Ganeti 3.0 (``cmdlib/instance_set_params.py``):
``_VerifyDiskModification`` (an added disk takes the instance's template; a diskless
instance has none to give: ``"Must specify disk type on diskless instance"``), then
``CheckPrereq`` (removing a disk from a running instance needs hotplug, which only KVM
offers: ``_CheckHotplug`` turns ``hotplug_if_possible`` off elsewhere, and the remove fails
``"can't remove volume from a running instance without using hotplug"``), then
``_CreateNewDisk`` and ``_RemoveDisk``. A modification is ``[op, params]`` or
``[op, index, params]`` (``-1``: the end).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from synnefo_ganeti.testing._cluster import OpFailure, parse_size
from synnefo_ganeti.testing._placement import check_room

if TYPE_CHECKING:
    from synnefo_ganeti.testing._cluster import FakeInstance
    from synnefo_ganeti.testing._engine import FakeCluster

__all__ = ["disk_mods"]


def disk_mods(
    cluster: FakeCluster, inst: FakeInstance, mods: list[Any]
) -> tuple[list[list[Any]], Callable[[], None]]:
    """The result lines Ganeti writes for ``mods`` and a function applying them."""
    disks = [dict(disk) for disk in inst.disks]
    changes: list[list[Any]] = []
    added: list[dict[str, Any]] = []
    for mod in mods:
        if not isinstance(mod, list | tuple) or len(mod) not in (2, 3):
            raise OpFailure("OpPrereqError", f"Invalid disk modification {mod!r}", "wrong_input")
        action, params = str(mod[0]), dict(mod[-1] or {})
        index = int(mod[1]) if len(mod) == 3 and str(mod[1]).lstrip("-").isdigit() else -1
        if action == "add":
            if inst.disk_template == "diskless" and not params.get("dev_type"):
                raise OpFailure("OpPrereqError", "Must specify disk type on diskless instance", "wrong_input")
            size = parse_size("size", params.get("size"))
            disk = {"size": size, "uuid": str(uuid.uuid4()), "name": params.get("name")}
            at = len(disks) if index == -1 else index
            disks.insert(at, disk)
            added.append(disk)
            changes.append([f"disk/{at}", f"add:size={size},mode={params.get('mode') or 'rw'}"])
        elif action == "remove":
            if inst.admin_state == "up":
                raise OpFailure(
                    "OpPrereqError",
                    f"Instance '{inst.name}' is marked to be up, can't remove volume from a running "
                    "instance without using hotplug",
                    "wrong_state",
                )
            if not disks or not -len(disks) <= index < len(disks):
                raise OpFailure("OpPrereqError", f"Invalid disk index {index}", "wrong_input")
            disks.pop(index)
            changes.append([f"disk/{index if index >= 0 else len(disks)}", "remove"])
        else:
            raise OpFailure(
                "OpPrereqError", f"Disk modification '{action}' is not supported by the fake", "wrong_input"
            )
    if added:
        check_room(cluster, cluster.nodes[inst.pnode], 0, added, inst.disk_template, inst.name)

    def commit() -> None:
        inst.disks = disks

    return changes, commit
