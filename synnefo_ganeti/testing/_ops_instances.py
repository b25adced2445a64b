"""The instance opcodes but create (:mod:`._ops_create`): remove, start, stop, reboot, modify, multi-allocate.

Each locks what its LU's ``ExpandNames``/``DeclareLocks`` ask for (``_ExpandAndLockInstance``:
the instance, exclusively; ``_LockInstancesNodes``: its nodes, the fake's instances having
a primary node only):

* remove (``LUInstanceRemove``): the instance, node and node-res locks of its nodes;
* startup (``LUInstanceStartup``): the instance, the node-res lock of its primary node;
* shutdown, reboot (``LUInstanceShutdown``, ``LUInstanceReboot``): the instance only;
* set-params (``LUInstanceSetParams``): the instance, its nodes' node locks, and their
  node-res locks only for a disk template change;
* multi-allocate (``LUInstanceMultiAlloc``): node and node-res locks shared (``ShareAll``):
  all of them with an iallocator, else the instances' ``pnode``/``snode``.

What each writes, fails with and when, is Ganeti 3.0's (see tests/fixtures/ganeti-3.0-queue
and tests/unit/test_fake_fidelity.py); on a primary node that is offline or crashed, as
:mod:`._node_faults` describes (tests/fixtures/ganeti-3.0-nodefail).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synnefo_ganeti.testing import _opcodes
from synnefo_ganeti.testing._cluster import OpFailure, parse_size
from synnefo_ganeti.testing._disk_mods import disk_mods
from synnefo_ganeti.testing._hotplug import check_hotplug
from synnefo_ganeti.testing._locks import ALL
from synnefo_ganeti.testing._node_faults import (
    ENVIRON,
    check_allocator_input,
    check_answers,
    check_online,
    warn_hooks,
)
from synnefo_ganeti.testing._ops_networks import nic_mods, release_nics
from synnefo_ganeti.testing._placement import check_room, choose_node
from synnefo_ganeti.testing._registry import Needs, opcode

if TYPE_CHECKING:
    from synnefo_ganeti.testing._cluster import FakeNode
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeJob, FakeOp

__all__: list[str] = []


def _nodes(cluster: FakeCluster, op: FakeOp) -> list[str]:
    """``_LockInstancesNodes``: the nodes of the op's instance (none if it is unknown)."""
    inst = cluster.instances.get(str(op.luxid.get("instance_name")))
    return [inst.pnode] if inst is not None else []


def _instance_only(cluster: FakeCluster, op: FakeOp) -> Needs:
    """``_ExpandAndLockInstance``: LUInstanceShutdown, LUInstanceReboot."""
    return Needs(instance=str(op.luxid.get("instance_name")))


def _remove_locks(cluster: FakeCluster, op: FakeOp) -> Needs:
    """``LUInstanceRemove.ExpandNames``/``DeclareLocks``: node and node-res locks of its nodes."""
    nodes = _nodes(cluster, op)
    return Needs(instance=str(op.luxid.get("instance_name")), node=nodes, node_res=list(nodes))


def _startup_locks(cluster: FakeCluster, op: FakeOp) -> Needs:
    """``LUInstanceStartup.DeclareLocks``: the node-res lock of its primary node, no node lock."""
    return Needs(instance=str(op.luxid.get("instance_name")), node_res=_nodes(cluster, op))


def _set_params_locks(cluster: FakeCluster, op: FakeOp) -> Needs:
    """``LUInstanceSetParams.DeclareLocks``: its nodes; node-res only for a disk template change."""
    nodes = _nodes(cluster, op)
    node_res = list(nodes) if op.luxid.get("disk_template") else None
    return Needs(instance=str(op.luxid.get("instance_name")), node=nodes, node_res=node_res)


def _multi_alloc_locks(cluster: FakeCluster, op: FakeOp) -> Needs:
    """``LUInstanceMultiAlloc.ExpandNames``: shared; all nodes with an iallocator, else the named ones."""
    instances = [dict(item) for item in op.luxid.get("instances") or []]
    if op.luxid.get("iallocator") or any(not item.get("pnode") for item in instances):
        return Needs(node=ALL, node_res=ALL, shared=True)
    nodes = [str(n) for item in instances for n in (item.get("pnode"), item.get("snode")) if n]
    return Needs(node=nodes, node_res=list(nodes), shared=True)


@opcode("OP_INSTANCE_REMOVE", locks=_remove_locks)
async def instance_remove(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    inst = cluster.op_instance(op)
    node = cluster.nodes[inst.pnode]
    cluster.start_running(job, op, instance_uuid=inst.uuid)
    if not op.luxid.get("ignore_failures"):  # LUInstanceRemove.Exec: call_instance_shutdown, Raise
        what = f"Could not shutdown instance {inst.name} on node {node.name}"
        if node.offline:
            raise OpFailure("OpExecError", f"{what}: Node is marked offline", prereq=False)
        await check_answers(cluster, node, what)
    await cluster.work(job, op, [], cluster.op_time(op))
    if not op.luxid.get("dry_run"):
        release_nics(cluster, inst)
        cluster.instances.pop(inst.name, None)


@opcode("OP_INSTANCE_SHUTDOWN", locks=_instance_only)
async def instance_shutdown(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    inst = cluster.op_instance(op)
    node = cluster.nodes[inst.pnode]
    cluster.start_running(job, op, instance_uuid=inst.uuid)
    skip_node = node.offline and bool(op.luxid.get("ignore_offline_nodes"))
    if not skip_node:
        check_online(node)  # LUInstanceShutdown.CheckPrereq
    await warn_hooks(cluster, job, op, node)
    remember = not op.luxid.get("dry_run") and not op.luxid.get("no_remember")
    if node.crashed and not skip_node:
        if remember:  # Exec marks it down first, then asks the node, which fails
            inst.admin_state = "down"
            inst.touch()
        await check_answers(cluster, node, f"Could not shutdown instance '{inst.name}'")
    if skip_node:
        cluster.log(job, op, " - INFO: Primary node offline, marked instance as stopped")
    await cluster.work(job, op, [], cluster.op_time(op))
    if not op.luxid.get("dry_run"):
        inst.oper_state = False
        if remember:
            inst.admin_state = "down"
        inst.touch()


def _check_node_for_start(inst_node: FakeNode, op: FakeOp) -> bool:
    """``CheckPrereq`` of startup and reboot: the node online (or ``ignore_offline_nodes``, for a
    startup); True when the op skips the node (offline and ignored)."""
    if inst_node.offline and op.op_id == "OP_INSTANCE_STARTUP" and op.luxid.get("ignore_offline_nodes"):
        return True
    check_online(inst_node)
    return False


@opcode("OP_INSTANCE_STARTUP", locks=_startup_locks)
async def instance_startup(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    inst = cluster.op_instance(op)
    node = cluster.nodes[inst.pnode]
    cluster.start_running(job, op, instance_uuid=inst.uuid)
    if not _check_node_for_start(node, op):
        # CheckInstanceBridgesExist, then call_instance_info (both raise ECODE_ENVIRON)
        await check_answers(cluster, node, f"Error checking bridges on destination node '{node.name}'",
                            prereq=True, ecode=ENVIRON)  # fmt: skip
        if not inst.oper_state:
            check_room(cluster, node, inst.memory, [], "diskless", inst.name)
    await cluster.work(job, op, [], cluster.op_time(op))
    if not op.luxid.get("dry_run"):
        inst.oper_state = True
        inst.admin_state = "up"
        inst.touch()


@opcode("OP_INSTANCE_REBOOT", locks=_instance_only)
async def instance_reboot(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    inst = cluster.op_instance(op)
    if inst.admin_state != "up":
        raise OpFailure(
            "OpPrereqError", f"Instance {inst.name} is marked to be down, cannot reboot", "wrong_state"
        )
    node = cluster.nodes[inst.pnode]
    cluster.start_running(job, op, instance_uuid=inst.uuid)
    _check_node_for_start(node, op)  # LUInstanceReboot.CheckPrereq: CheckNodeOnline, bridges
    await check_answers(cluster, node, f"Error checking bridges on destination node '{node.name}'",
                        prereq=True, ecode=ENVIRON)  # fmt: skip
    await cluster.work(job, op, [], cluster.op_time(op))
    if not op.luxid.get("dry_run"):
        inst.oper_state = True


@opcode("OP_INSTANCE_SET_PARAMS", locks=_set_params_locks)
async def instance_set_params(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    inst = cluster.op_instance(op)
    p = op.luxid
    beparams = dict(p.get("beparams") or {})
    if not any(p.get(key) for key in ("beparams", "hvparams", "nics", "disks", "osparams", "os_name")):
        raise OpFailure("OpPrereqError", "No changes submitted", "wrong_input")
    hotplug_lines = check_hotplug(cluster, op, inst)  # CheckPrereq: _CheckHotplug first
    nic_changes, commit_nics, resolved_nics = nic_mods(cluster, inst, list(p.get("nics") or []))
    disk_changes, commit_disks = disk_mods(cluster, inst, list(p.get("disks") or []))
    cluster.start_running(job, op, instance_uuid=inst.uuid, nics=resolved_nics)
    for line in hotplug_lines:
        cluster.log(job, op, line)
    requested = list(beparams)  # Exec's result lines name the op's own keys (be/memory, as both labs)
    if "memory" in beparams:
        memory = beparams.pop("memory")
        beparams.setdefault("maxmem", memory)
        beparams.setdefault("minmem", memory)
    for key, value in beparams.items():
        if key in ("maxmem", "minmem"):
            value = parse_size(key, value)
        elif key == "vcpus" and (not isinstance(value, int) or isinstance(value, bool)):
            raise OpFailure(
                "TypeEnforcementError", f"'vcpus' (value {value}) is not a valid int", prereq=False
            )
        beparams[key] = value
    changes = [[f"be/{key}", beparams["maxmem" if key == "memory" else key]] for key in requested]
    changes += [[f"hv/{key}", value] for key, value in (p.get("hvparams") or {}).items()]
    changes += [[f"os/{key}", value] for key, value in (p.get("osparams") or {}).items()]
    changes += nic_changes + disk_changes
    await cluster.work(job, op, [], cluster.op_time(op))
    if not p.get("dry_run"):
        inst.beparams.update(beparams)
        inst.beparams["memory"] = inst.beparams.get("maxmem", inst.memory)
        inst.custom_beparams.update(beparams)
        inst.hvparams.update(p.get("hvparams") or {})
        inst.osparams.update(p.get("osparams") or {})
        commit_nics()
        commit_disks()
        inst.touch()
    op.result = changes


@opcode("OP_INSTANCE_MULTI_ALLOC", locks=_multi_alloc_locks)
async def instance_multi_alloc(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    instances = op.luxid.get("instances") or []
    if op.luxid.get("iallocator") or any(not item.get("pnode") for item in instances):
        await check_allocator_input(cluster)  # LUInstanceMultiAlloc.CheckPrereq runs the allocator
    children: list[dict[str, Any]] = []
    resolved_children: list[dict[str, Any]] = []
    for body in op.luxid.get("instances") or []:
        params = dict(body) | {"comment": "Submitted by OP_INSTANCE_MULTI_ALLOC"}
        node = choose_node(cluster, params, str(params.get("instance_name")))
        if not params.get("pnode"):  # the allocator ran: its node goes into the create, and
            # "memory" came back upgraded from its request (objects.UpgradeBeParams)
            beparams = dict(params.get("beparams") or {})
            if "memory" in beparams:
                memory = beparams.pop("memory")
                beparams = {"maxmem": memory, "minmem": memory} | beparams
            params |= {"beparams": beparams, "pnode": node.name, "iallocator": None}
        children.append(params)
        child = _opcodes.luxid_input("OP_INSTANCE_CREATE", params, op.luxid["reason"], dry_run=False,
                                     version=cluster.model.version)  # fmt: skip
        resolved = _opcodes.resolved_input(
            child,
            {"pnode": node.name, "pnode_uuid": node.uuid, "hypervisor": params.get("hypervisor") or cluster.hypervisor,
             "helper_startup_timeout": None, "helper_shutdown_timeout": None},
        )  # fmt: skip
        resolved_children.append(resolved | {"dry_run": None})
    cluster.start_running(job, op, instances=resolved_children, iallocator=op.luxid.get("iallocator"))
    await cluster.work(job, op, [], cluster.op_time(op))
    dry_run = bool(op.luxid.get("dry_run"))
    # mcpu._ProcessResult: no dry_run of their own (unless the parent's), the parent's trail
    ids = [cluster.submit([("OP_INSTANCE_CREATE", {"dry_run": True if dry_run else None} | child)],
                          resource="instances_multi_alloc", parent_reason=op.luxid.get("reason") or [])
           for child in children]  # fmt: skip
    op.result = {
        "allocatable": [str(child.get("instance_name")) for child in children],
        "failed": [],
        "jobs": [[True, job_id] for job_id in ids],
    }
