"""Instance opcodes that move, rename, reinstall or export it (``cmdlib.instance``,
``instance_migration``, ``backup``): migrate, failover, rename, reinstall, prepare-export, export.

Locks: migrate and failover take the instance, its nodes and their node-res locks, and
the target's (all nodes with an iallocator); rename the instance; reinstall the instance
and its nodes; export the instance and every node, shared. A ``diskless`` or ``sharedfile``
instance moves (Ganeti's ``DTS_EXT_MIRROR``); a ``file`` one cannot. Without a target node the
iallocator picks one (``TLMigrateInstance._RunAllocator``; here: the node with the most free
memory, as hail's balancing does on equal nodes), or fails as Ganeti 3.0's with no other node.
Rename and reinstall want the instance down.

A primary node that gives no live data (offline, or crashed: :mod:`._node_faults`), or an
instance that does not run there: a migration cannot ask whether the instance is migratable
(``TLMigrateInstance.CheckPrereq``: ``Can't migrate, please use failover``, with the RPC's error
or ``backend.GetInstanceMigratable``'s ``Instance <name> is not running``; a fallback to failover
with ``allow_failover``, at once for an instance marked down). A drained target is refused
(``CheckNodeNotDrained``: ``Can't use drained node <node>``); a
failover cannot shut the instance down there (``_ExecFailover``) and goes on only with
``ignore_consistency`` or the node offline, with a warning; it then starts the instance on the
target if it is marked up.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from synnefo_ganeti.testing._cluster import OpFailure, free_capacity
from synnefo_ganeti.testing._locks import ALL
from synnefo_ganeti.testing._names import check_rename_name
from synnefo_ganeti.testing._node_faults import check_answers, rpc_error
from synnefo_ganeti.testing._ops_disks import check_down, instance_locks, instance_of
from synnefo_ganeti.testing._registry import Needs, opcode

if TYPE_CHECKING:
    from synnefo_ganeti.testing._cluster import FakeInstance
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeJob, FakeOp

__all__ = ["best_node"]

_EXT_MIRROR = ("diskless", "sharedfile", "rbd", "ext", "blockdev", "gluster")


def _move_locks(cluster: FakeCluster, op: FakeOp) -> Needs:
    target = op.luxid.get("target_node")
    inst = cluster.instances.get(str(op.luxid.get("instance_name")))
    if not target:
        return Needs(instance=str(op.luxid.get("instance_name")), node=ALL, node_res=ALL)
    nodes = sorted({str(target), *([inst.pnode] if inst else [])} & set(cluster.nodes))
    return Needs(instance=str(op.luxid.get("instance_name")), node=nodes, node_res=list(nodes))


def best_node(
    cluster: FakeCluster, inst: FakeInstance, exclude: Iterable[str], planned: dict[str, int]
) -> str | None:
    """Where an iallocator would put ``inst``: an online, undrained, vm-capable node not in
    ``exclude`` with room for its memory and the most free memory (``planned``: MiB already
    promised to each node by earlier moves of the same plan); ``None`` when none fits."""
    skip = set(exclude)
    fits = []
    for node in cluster.nodes.values():
        if node.name in skip or not node.live or node.drained or not node.vm_capable:
            continue
        free, _ = free_capacity(node, cluster.instances.values())
        room = (free or 0) - planned.get(node.name, 0)
        if room >= inst.memory:
            fits.append((-room, node.name))
    return min(fits)[1] if fits else None


async def _move(cluster: FakeCluster, job: FakeJob, op: FakeOp, failover: bool) -> None:
    """``TLMigrateInstance.CheckPrereq`` and ``Exec`` for an externally mirrored instance."""
    inst = instance_of(cluster, op)
    target = op.luxid.get("target_node")
    if not failover and inst.admin_state != "up" and op.luxid.get("allow_failover"):
        failover = True  # CheckPrereq: "Instance is marked down or offline, fallback allowed"
    if not target and not op.luxid.get("iallocator"):  # CheckArguments: the cluster's default iallocator
        op.resolve(iallocator=cluster.default_iallocator)
    if target:
        if target not in cluster.nodes:
            raise OpFailure("OpPrereqError", f"Node '{target}' not known", "unknown_entity")
        op.resolve(target_node_uuid=cluster.nodes[str(target)].uuid)  # ExpandNames
    cluster.start_running(job, op, instance_uuid=inst.uuid)
    if inst.disk_template not in _EXT_MIRROR:
        raise OpFailure(
            "OpPrereqError",
            f"Instance's disk layout '{inst.disk_template}' does not allow {'failovers' if failover else 'migrations'}",
            "wrong_state",
        )
    if not target:
        iallocator = op.luxid.get("iallocator") or cluster.default_iallocator
        target = best_node(cluster, inst, [inst.pnode], {})
        if target is None:
            raise OpFailure(
                "OpPrereqError",
                f"Can't compute nodes using iallocator '{iallocator}': Request failed: Can't find any good node: ",
                "insufficient_resources",
            )
        cluster.log(
            job, op, f" - INFO: Selected nodes for instance {inst.name} via iallocator {iallocator}: {target}"
        )
    if target == inst.pnode:
        raise OpFailure(
            "OpPrereqError", f"Cannot migrate instance {inst.name} to its primary ({target})", "wrong_state"
        )
    source = cluster.nodes[inst.pnode]
    cleanup = bool(op.luxid.get("cleanup"))
    if not cleanup and cluster.nodes[str(target)].drained:  # CheckNodeNotDrained
        raise OpFailure("OpPrereqError", f"Can't use drained node {target}", "wrong_state")
    # call_instance_migratable fails: the node does not answer, or the instance does not run
    if not failover and not cleanup and (not source.live or not inst.oper_state):
        if op.luxid.get("allow_failover"):
            cluster.log(job, op, " - INFO: Can't migrate, instance offline, fallback to failover")
            failover = True
        else:
            what = "Can't migrate, please use failover"
            if source.offline:
                raise OpFailure("OpPrereqError", f"{what}: Node is marked offline", "wrong_state")
            await check_answers(cluster, source, what, prereq=True, ecode="wrong_state")
            # backend.GetInstanceMigratable: the hypervisor does not list it
            raise OpFailure("OpPrereqError", f"{what}: Instance {inst.name} is not running", "wrong_state")
    if not failover and not op.luxid.get("mode"):  # the hypervisor's migration_mode (fake: live)
        op.resolve(mode="live")
    what = f"Failover instance {inst.name}" if failover else f"Migrating instance {inst.name}"
    if failover and not source.live:  # _ExecFailover: call_instance_shutdown on the source fails
        if not (op.luxid.get("ignore_consistency") or source.offline):
            await check_answers(
                cluster, source, f"Could not shutdown instance {inst.name} on node {source.name}"
            )
        error = "Node is marked offline" if source.offline else rpc_error(source)
        cluster.log(job, op, f" - WARNING: Could not shutdown instance {inst.name} on node {source.name}, "
                             f"proceeding anyway; please make sure node {source.name} is down; error details: {error}")  # fmt: skip
    await cluster.work(job, op, [what], cluster.op_time(op))
    if not op.luxid.get("dry_run"):
        inst.pnode = str(target)
        if failover and inst.admin_state == "up":
            inst.oper_state = True  # started on the target node
        inst.touch()


@opcode("OP_INSTANCE_MIGRATE", locks=_move_locks)
async def instance_migrate(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    await _move(cluster, job, op, failover=False)


@opcode("OP_INSTANCE_FAILOVER", locks=_move_locks)
async def instance_failover(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    await _move(cluster, job, op, failover=True)


def _instance_only(cluster: FakeCluster, op: FakeOp) -> Needs:
    return Needs(instance=str(op.luxid.get("instance_name")))


@opcode("OP_INSTANCE_RENAME", locks=_instance_only)
async def instance_rename(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    inst = instance_of(cluster, op)
    check_rename_name(cluster, op)  # ExpandNames: name_check, ip_check
    new = str(op.luxid.get("new_name"))
    cluster.start_running(job, op, instance_uuid=inst.uuid)  # holding its locks: CheckPrereq
    check_down(inst, "cannot rename")
    if new in cluster.instances:
        raise OpFailure("OpPrereqError", f"Instance '{new}' is already in the cluster", "already_exists")
    await cluster.work(job, op, [], cluster.op_time(op))
    if not op.luxid.get("dry_run"):
        cluster.instances.pop(inst.name)
        inst.name = new
        cluster.instances[new] = inst
        inst.touch()
    op.result = new


@opcode("OP_INSTANCE_REINSTALL", locks=instance_locks)
async def instance_reinstall(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    inst = instance_of(cluster, op)
    os_type = op.luxid.get("os_type")
    params = {key: op.luxid.get(key) or {} for key in ("osparams", "osparams_private", "osparams_secret")}
    cluster.start_running(job, op, instance_uuid=inst.uuid, os_type=os_type or inst.os, **params)
    if not inst.disks:  # LUInstanceReinstall.CheckPrereq
        raise OpFailure("OpPrereqError", f"Instance '{inst.name}' has no disks", "wrong_input")
    check_down(inst, "cannot reinstall")
    if os_type and str(os_type).split("+")[0] not in cluster.oses:
        raise OpFailure(
            "OpPrereqError", f"OS '{os_type}' not in supported OS list for node {inst.pnode}", "invalid"
        )
    await cluster.work(job, op, [], cluster.op_time(op))
    if not op.luxid.get("dry_run"):
        inst.os = str(os_type or inst.os)
        inst.touch()


@opcode("OP_BACKUP_PREPARE", locks=_instance_only)
async def backup_prepare(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    inst = instance_of(cluster, op)
    if op.luxid.get("mode") not in ("local", "remote"):
        raise OpFailure("OpPrereqError", f"Unknown export mode {op.luxid.get('mode')!r}", "wrong_input")
    cluster.start_running(job, op, instance_uuid=inst.uuid)
    await cluster.work(job, op, [], cluster.op_time(op))


def _export_locks(cluster: FakeCluster, op: FakeOp) -> Needs:
    return Needs(instance=str(op.luxid.get("instance_name")), node=ALL, shared=True)


@opcode("OP_BACKUP_EXPORT", locks=_export_locks)
async def backup_export(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    inst = instance_of(cluster, op)
    target = str(op.luxid.get("target_node") or inst.pnode)
    if target not in cluster.nodes:
        raise OpFailure("OpPrereqError", f"Node '{target}' not known", "unknown_entity")
    cluster.start_running(job, op, instance_uuid=inst.uuid, target_node_uuid=cluster.nodes[target].uuid)
    lines = [f"Shutting down instance {inst.name}", f"Activating disks for {inst.name}"]
    for i, _ in enumerate(inst.disks):
        lines += [f"Exporting disk/{i} from {inst.pnode} to {target}", f"disk/{i} finished sending data"]
    lines += [f"Finalizing export on {target}", f"Deactivating disks for {inst.name}"]
    await cluster.work(job, op, lines, cluster.op_time(op))
    if not op.luxid.get("dry_run"):
        cluster.model.exports[inst.name] = target
    op.result = [True, [True for _ in inst.disks]]
