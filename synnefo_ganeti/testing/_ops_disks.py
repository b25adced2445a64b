"""Instance disk opcodes and the detailed query (``cmdlib.instance_storage``, ``instance_query``):
query data, grow disk, activate, deactivate, recreate and replace disks.

Locks as each LU's ``ExpandNames``/``DeclareLocks``: the instance (exclusive) and its nodes'
node locks (``_LockInstancesNodes``), plus their node-res locks for grow and recreate; the
detailed query locks the nodes shared. The fake's instances have no secondary node, so
replace-disks fails as Ganeti 3.0 does for a non-DRBD instance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from synnefo_ganeti.testing._cluster import FakeInstance, OpFailure, parse_size
from synnefo_ganeti.testing._registry import Needs, opcode
from synnefo_ganeti.testing._views import instance_info

if TYPE_CHECKING:
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeJob, FakeOp

__all__ = ["check_down", "instance_locks", "instance_node_res_locks", "instance_of"]


def _nodes(cluster: FakeCluster, op: FakeOp) -> list[str]:
    inst = cluster.instances.get(str(op.luxid.get("instance_name")))
    return [inst.pnode] if inst is not None else []


def instance_locks(cluster: FakeCluster, op: FakeOp) -> Needs:
    """``_ExpandAndLockInstance`` and ``_LockInstancesNodes``: the instance and its nodes."""
    return Needs(instance=str(op.luxid.get("instance_name")), node=_nodes(cluster, op))


def instance_node_res_locks(cluster: FakeCluster, op: FakeOp) -> Needs:
    """The instance, its nodes, and their node-res locks."""
    nodes = _nodes(cluster, op)
    return Needs(instance=str(op.luxid.get("instance_name")), node=nodes, node_res=list(nodes))


def instance_of(cluster: FakeCluster, op: FakeOp) -> FakeInstance:
    """The op's instance, its uuid resolved as ``ExpandNames`` does (a CheckPrereq failure shows it)."""
    inst = cluster.op_instance(op)
    op.resolve(instance_uuid=inst.uuid)
    return inst


def check_down(inst: FakeInstance, action: str) -> None:
    """``CheckInstanceState(..., INSTANCE_DOWN, msg=...)``."""
    if inst.admin_state == "up":
        raise OpFailure(
            "OpPrereqError", f"Instance '{inst.name}' is marked to be up, {action}", "wrong_state"
        )


def _query_locks(cluster: FakeCluster, op: FakeOp) -> Needs:
    if not op.luxid.get("use_locking"):
        return Needs()
    names = [str(n) for n in op.luxid.get("instances") or []]
    nodes = sorted({cluster.instances[n].pnode for n in names if n in cluster.instances})
    return Needs(node=nodes, shared=True)


@opcode("OP_INSTANCE_QUERY_DATA", locks=_query_locks)
async def instance_query_data(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    names = [str(n) for n in op.luxid.get("instances") or []] or sorted(cluster.instances)
    for name in names:
        if name not in cluster.instances:
            raise OpFailure("OpPrereqError", f"Instance '{name}' not known", "unknown_entity")
    cluster.start_running(job, op)
    await cluster.work(job, op, [], cluster.op_time(op))
    static = bool(op.luxid.get("static"))
    op.result = {name: instance_info(cluster, cluster.instances[name], static=static) for name in names}


@opcode("OP_INSTANCE_GROW_DISK", locks=instance_node_res_locks)
async def instance_grow_disk(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    inst = instance_of(cluster, op)
    cluster.start_running(job, op, instance_uuid=inst.uuid)  # holding its locks: CheckPrereq
    index = op.luxid.get("disk")
    if not isinstance(index, int) or not 0 <= index < len(inst.disks):
        raise OpFailure("OpPrereqError", f"Invalid disk index: {index}", "wrong_input")
    disk = inst.disks[index]
    amount = parse_size("amount", op.luxid.get("amount"))
    current = int(disk["size"])
    target = amount if op.luxid.get("absolute") else current + amount
    if op.luxid.get("absolute") and amount < current:
        raise OpFailure("OpPrereqError", f"Requested size ({amount}) is smaller than current disk size "
                        f"({current})", "wrong_input")  # fmt: skip
    if amount < 0:
        raise OpFailure("OpPrereqError", f"Requested increment ({amount}) is negative", "wrong_input")
    await cluster.work(job, op, [f"Growing disk {index} of instance '{inst.name}' by {target - current}M "
                                 f"to {target}M"], cluster.op_time(op))  # fmt: skip
    if not op.luxid.get("dry_run"):
        disk["size"] = target
        inst.touch()


@opcode("OP_INSTANCE_ACTIVATE_DISKS", locks=instance_locks)
async def instance_activate_disks(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    inst = instance_of(cluster, op)
    cluster.start_running(job, op, instance_uuid=inst.uuid)
    await cluster.work(job, op, [], cluster.op_time(op))
    op.result = [[inst.pnode, f"disk/{i}", f"/srv/ganeti/file-storage/{inst.name}/{d['uuid']}.file.disk{i}"]
                 for i, d in enumerate(inst.disks)]  # fmt: skip


@opcode("OP_INSTANCE_DEACTIVATE_DISKS", locks=instance_locks)
async def instance_deactivate_disks(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    inst = instance_of(cluster, op)
    cluster.start_running(job, op, instance_uuid=inst.uuid)
    if inst.oper_state and not op.luxid.get("force"):
        raise OpFailure("OpPrereqError", "Instance is running, can't shutdown block devices.", "wrong_state")
    await cluster.work(job, op, [], cluster.op_time(op))


@opcode("OP_INSTANCE_RECREATE_DISKS", locks=instance_node_res_locks)
async def instance_recreate_disks(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    inst = instance_of(cluster, op)
    cluster.start_running(job, op, instance_uuid=inst.uuid)  # its checks are CheckPrereq's
    if not inst.disks:
        raise OpFailure("OpPrereqError", f"Instance '{inst.name}' has no disks", "wrong_input")
    check_down(inst, "cannot recreate disks")
    await cluster.work(job, op, [], cluster.op_time(op))
    nodes = op.luxid.get("nodes") or [inst.pnode]
    if inst.disk_template in ("file", "sharedfile") and inst.pnode in nodes:
        # the disk files are still there: FileStorage.Create refuses (Ganeti 3.0 on the testbed)
        disk, path = inst.disks[0], f"/srv/ganeti/file-storage/{inst.name}/{inst.disks[0]['uuid']}.file.disk0"
        raise OpFailure(
            "OpExecError",
            f"Can't create block device <Disk(type={inst.disk_template}, logical_id=('loop', '{path}'), children=[],"
            f" visible as /dev/disk/0, size={disk.get('size')}m)> on node {inst.pnode} for instance {inst.name}:"
            f" Can't create block device: {path}: can't create: [Errno 17] File exists: '{path}'",
            prereq=False,
        )
    if not op.luxid.get("dry_run"):
        inst.touch()


@opcode("OP_INSTANCE_REPLACE_DISKS", locks=instance_locks)
async def instance_replace_disks(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    inst = instance_of(cluster, op)
    cluster.start_running(job, op, instance_uuid=inst.uuid)  # TLReplaceDisks.CheckPrereq
    raise OpFailure(
        "OpPrereqError",
        "The instance has a strange layout, expected one secondary but found 0",
        "internal_error",
    )
