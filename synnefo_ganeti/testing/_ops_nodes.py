"""Node opcodes (``cmdlib.node``): set params (role, drain, offline, ndparams), powercycle,
evacuate, migrate, and the storage units; and the cluster's redistribute-config and set-params.

Locks as ``ExpandNames`` asks: the node's lock (exclusive for set-params, shared for a
storage query); evacuate and migrate lock the node shared and submit one child job per
instance, their result ``{"jobs": [[true, id], ...]}`` as Ganeti 3.0's. The master's role
cannot change (``The master role can be changed only via master-failover``), nor can it be
power-cycled without ``force``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synnefo_ganeti.errors import ConflictError, NotFoundError
from synnefo_ganeti.testing import _opcodes
from synnefo_ganeti.testing._cluster import OpFailure, free_capacity
from synnefo_ganeti.testing._node_faults import check_answers, warn_hooks
from synnefo_ganeti.testing._ops_moves import best_node
from synnefo_ganeti.testing._registry import Needs, opcode

if TYPE_CHECKING:
    from synnefo_ganeti.testing._cluster import FakeInstance, FakeNode
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeJob, FakeOp

__all__ = ["master_failover"]

_STORAGE_TYPES = ("file", "sharedfile", "lvm-pv", "lvm-vg", "diskless", "gluster", "rados", "ext")


def node_of(cluster: FakeCluster, op: FakeOp) -> FakeNode:
    name = str(op.luxid.get("node_name"))
    node = cluster.nodes.get(name)
    if node is None:
        raise OpFailure("OpPrereqError", f"Node '{name}' not known", "unknown_entity")
    op.resolve(node_uuid=node.uuid)  # ExpandNames resolved it: a CheckPrereq failure shows it
    return node


def _node_lock(cluster: FakeCluster, op: FakeOp) -> Needs:
    name = str(op.luxid.get("node_name"))
    return Needs(node=[name] if name in cluster.nodes else [])


def _node_shared(cluster: FakeCluster, op: FakeOp) -> Needs:
    names = [str(n) for n in op.luxid.get("nodes") or [op.luxid.get("node_name")] if n in cluster.nodes]
    return Needs(node=names, shared=True)


def _decide_self_promotion(cluster: FakeCluster) -> bool:
    """``_DecideSelfPromotion``: fewer master candidates (the master is one) than the nodes that
    could be one plus this one, up to the cluster's ``candidate_pool_size`` (10)."""
    pool = int(cluster.model.cluster_params.get("candidate_pool_size") or 10)
    usable = [n for n in cluster.nodes.values() if not n.offline and not n.drained]
    candidates = [n for n in usable if n.master or n.candidate]
    return len(candidates) < min(len(usable) + 1, pool)


@opcode("OP_NODE_SET_PARAMS", locks=_node_lock)
async def node_set_params(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    p = op.luxid
    node = node_of(cluster, op)
    flags = {key: p.get(key) for key in ("master_candidate", "offline", "drained")}
    if node.master and any(value is not None for value in flags.values()):  # CheckPrereq
        cluster.start_running(job, op, node_uuid=node.uuid)
        raise OpFailure(
            "OpPrereqError", "The master role can be changed only via master-failover", "wrong_input"
        )
    if sum(1 for value in flags.values() if value) > 1:
        raise OpFailure(
            "OpPrereqError", "Can't set the node into more than one state at the same time", "wrong_input"
        )
    if not any(p.get(key) is not None for key in (*flags, "ndparams", "master_capable", "vm_capable",
                                                   "secondary_ip", "powered", "hv_state", "disk_state")):  # fmt: skip
        raise OpFailure("OpPrereqError", "Please pass at least one modification", "wrong_input")
    cluster.start_running(job, op, node_uuid=node.uuid)
    leaves = (flags["offline"] is False and node.offline) or (flags["drained"] is False and node.drained)
    if leaves and flags["master_candidate"] is None and _decide_self_promotion(cluster):
        flags["master_candidate"] = True
        cluster.log(job, op, " - INFO: Auto-promoting node to master candidate")
    if node.offline and (flags["offline"] is False or flags["master_candidate"] or flags["drained"]):
        # out of offline: CheckPrereq asks the node its version (call_version)
        await check_answers(cluster, node, f"Node {node.name} is being de-offlined but fails to report its version",
                            prereq=True, ecode="wrong_state")  # fmt: skip
        cluster.log(job, op, " - WARNING: Transitioning node from offline to online state without using re-add. "
                             "Please make sure the node is healthy!")  # fmt: skip
    await warn_hooks(cluster, job, op, node)  # the pre-hooks run on the master and the node
    await cluster.work(job, op, [], cluster.op_time(op))
    changes: list[list[Any]] = []
    if p.get("dry_run"):
        op.result = changes
        return
    # LUNodeSetParams: the new role from the flags set, then one line per flag changed, in
    # _FLAGS order (master_candidate, drained, offline)
    old = (node.candidate and not node.offline and not node.drained, node.drained, node.offline)
    if flags["master_candidate"]:
        new = (True, False, False)
    elif flags["drained"]:
        new = (False, True, False)
    elif flags["offline"]:
        new = (False, False, True)
    elif False in flags.values():
        new = (False, False, False)
    else:
        new = old
    for was, now, key in zip(old, new, ("master_candidate", "drained", "offline"), strict=True):
        if was != now:
            changes.append([key, str(now)])
    node.candidate, node.drained, node.offline = new
    node.ndparams.update(p.get("ndparams") or {})  # LUNodeSetParams.Exec: no line in the result
    if p.get("vm_capable") is not None:
        node.vm_capable = bool(p["vm_capable"])
        changes.append(["vm_capable", str(node.vm_capable)])
    node.serial_no += 1
    op.result = changes


@opcode("OP_NODE_POWERCYCLE", locks=_node_lock)
async def node_powercycle(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    node = node_of(cluster, op)
    if node.master and not op.luxid.get("force"):
        raise OpFailure(
            "OpPrereqError", "The node is the master and the force parameter was not set", "wrong_input"
        )
    cluster.start_running(job, op, node_uuid=node.uuid)
    await cluster.work(job, op, [], cluster.op_time(op))
    op.result = "Rebooting the fake node"


def _submit_children(
    cluster: FakeCluster, op: FakeOp, children: list[tuple[str, dict[str, Any]]]
) -> list[list[Any]]:
    """One job per ``(OP_ID, params)``, as ``mcpu._ProcessResult`` submits a ``ResultWithJobs``:
    each child op carries ``Submitted by OP_ID`` and the parent's reason trail, and no ``dry_run``;
    the result is ``[[true, job id], ...]``."""
    ids = []
    for op_id, params in children:
        params = {"dry_run": None, "comment": f"Submitted by {op.op_id}"} | params
        ids.append(
            cluster.submit([(op_id, params)], resource="-", parent_reason=op.luxid.get("reason") or [])
        )
    return [[True, job_id] for job_id in ids]


def _primaries(cluster: FakeCluster, node: FakeNode) -> list[FakeInstance]:
    """``_GetNodePrimaryInstances``: the node's primary instances, by name."""
    return sorted((i for i in cluster.instances.values() if i.pnode == node.name), key=lambda i: i.name)


@opcode("OP_NODE_MIGRATE", locks=_node_shared)
async def node_migrate(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    """``LUNodeMigrate.Exec``: one ``OP_INSTANCE_MIGRATE`` job per primary instance, passing the
    op's mode, live, iallocator, target node, runtime changes and ipolicy flags on."""
    node = node_of(cluster, op)
    cluster.start_running(job, op, node_uuid=node.uuid)
    await cluster.work(job, op, [], cluster.op_time(op))
    passed = ("mode", "live", "iallocator", "target_node", "allow_runtime_changes", "ignore_ipolicy")
    params = {key: op.luxid.get(key) for key in passed if op.luxid.get(key) is not None}
    children = [
        ("OP_INSTANCE_MIGRATE", {"instance_name": i.name} | params) for i in _primaries(cluster, node)
    ]
    op.result = {"jobs": _submit_children(cluster, op, children)}


@opcode("OP_NODE_EVACUATE", locks=_node_shared)
async def node_evacuate(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    """``LUNodeEvacuate``: with an iallocator, the primaries move where it says, one
    ``OP_INSTANCE_MIGRATE`` job each (hail's ``iMoveToJob`` for externally mirrored instances:
    a target node, no runtime changes, failover allowed, hypervisor versions ignored)."""
    node = node_of(cluster, op)
    mode = op.luxid.get("mode")
    if not op.luxid.get("remote_node") and not op.luxid.get("iallocator"):  # CheckArguments: the default one
        op.resolve(iallocator=cluster.default_iallocator)
    if mode == "all":
        raise OpFailure(
            "OpPrereqError",
            "Due to an issue with the iallocator interface it is not possible to evacuate all instances at once; "
            "specify explicitly whether to evacuate primary or secondary instances",
            "wrong_input",
        )
    cluster.start_running(job, op, node_uuid=node.uuid)
    instances = [] if mode == "secondary-only" else _primaries(cluster, node)
    if instances:
        cluster.log(job, op, f" - INFO: Evacuating instances from node '{node.name}': "
                             f"{', '.join(i.name for i in instances)}")  # fmt: skip
    else:
        cluster.log(job, op, f" - INFO: No instances to evacuate from node '{node.name}'")
    planned: dict[str, int] = {}
    children: list[tuple[str, dict[str, Any]]] = []
    for inst in instances:
        target = best_node(cluster, inst, [node.name], planned)
        if target is None:
            raise OpFailure(
                "OpPrereqError",
                f"Can't compute node evacuation using iallocator '{op.luxid.get('iallocator')}': "
                f"Request failed: no node has room for instance {inst.name}",
                "insufficient_resources",
            )
        planned[target] = planned.get(target, 0) + inst.memory
        children.append(("OP_INSTANCE_MIGRATE", {"instance_name": inst.name, "target_node": target,
                                                  "allow_runtime_changes": False, "allow_failover": True,
                                                  "ignore_hvversions": True}))  # fmt: skip
    if children:
        moves = ", ".join(f"{p['instance_name']} (to {p['target_node']})" for _, p in children)
        cluster.log(job, op, f" - INFO: Instances to be moved: {moves}")
    await cluster.work(job, op, [], cluster.op_time(op))
    op.result = {"jobs": _submit_children(cluster, op, children)}


def _storage_type(op: FakeOp) -> str:
    kind = str(op.luxid.get("storage_type") or "file")
    if kind not in _STORAGE_TYPES:
        raise OpFailure("OpPrereqError", f"Unknown storage type: {kind}", "wrong_input")
    return kind


@opcode("OP_NODE_QUERY_STORAGE", locks=_node_shared)
async def node_query_storage(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    _storage_type(op)
    fields = [str(f) for f in op.luxid.get("output_fields") or []]
    names = [str(n) for n in op.luxid.get("nodes") or []]
    for name in names:
        if name not in cluster.nodes:
            raise OpFailure("OpPrereqError", f"Node '{name}' not known", "unknown_entity")
    cluster.start_running(job, op, node_uuids=[cluster.nodes[n].uuid for n in names])
    await cluster.work(job, op, [], cluster.op_time(op))
    rows = []
    for name in names:
        node = cluster.nodes[name]
        _, dfree = free_capacity(node, cluster.instances.values())
        values = {"name": "/srv/ganeti/file-storage", "node": name, "type": "file", "size": node.dtotal,
                  "used": node.dtotal - (dfree or 0), "free": dfree or 0, "allocatable": True}  # fmt: skip
        rows.append([values.get(field) for field in fields])
    op.result = rows


@opcode("OP_NODE_MODIFY_STORAGE", locks=_node_lock)
async def node_modify_storage(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    node_of(cluster, op)
    kind = _storage_type(op)
    raise OpFailure("OpPrereqError", f"Storage units of type '{kind}' can not be modified", "wrong_input")


@opcode("OP_REPAIR_NODE_STORAGE", locks=_node_lock)
async def node_repair_storage(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    node_of(cluster, op)
    kind = _storage_type(op)
    raise OpFailure("OpPrereqError", f"Storage units of type '{kind}' can not be repaired", "wrong_input")


@opcode("OP_CLUSTER_REDIST_CONF")
async def cluster_redist_conf(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    cluster.start_running(job, op)
    await cluster.work(job, op, [], cluster.op_time(op))


@opcode("OP_CLUSTER_SET_PARAMS")
async def cluster_set_params(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    cluster.start_running(job, op)
    await cluster.work(job, op, [], cluster.op_time(op))
    if op.luxid.get("dry_run"):
        return
    defaults = _opcodes.LUXID["OP_CLUSTER_SET_PARAMS"]
    changes = {key: value for key, value in op.luxid.items()
               if key not in _opcodes.GENERIC and value is not None and value != defaults.get(key)}  # fmt: skip
    cluster.model.cluster_params.update(changes)
    if isinstance(changes.get("max_running_jobs"), int):
        cluster.max_running_jobs = int(changes["max_running_jobs"])


def master_failover(cluster: FakeCluster, name: str) -> None:
    """``gnt-cluster master-failover`` run on node ``name`` (``bootstrap.MasterFailover``; no job,
    no RAPI call): the node must be a master candidate other than the master; the old master
    stays a master candidate. Ganeti's refusals raise :class:`ConflictError` (the node is already
    the master, or not a candidate) or :class:`NotFoundError` (no such node)."""
    node = cluster.nodes.get(name)
    if node is None:
        raise NotFoundError(
            f"no node {name!r} in the fake cluster; its nodes: {', '.join(sorted(cluster.nodes))}"
        )
    old = next(n for n in cluster.nodes.values() if n.master)
    if node is old:
        raise ConflictError(
            "This commands must be run on the node where you want the new master to be."
            f" {name} is already the master"
        )
    if not node.candidate or node.offline or node.drained:
        raise ConflictError(
            f"{name} is not among the nodes marked as master candidates; only these can become"
            " masters: make it one first (set_node_role(..., 'master-candidate'))"
        )
    old.master, old.candidate = False, True
    node.master = True
    old.serial_no += 1
    node.serial_no += 1
