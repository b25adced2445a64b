"""Node group opcodes (``cmdlib.group``): add, set params, rename, assign nodes, remove.

Locks: ``LUGroupAssignNodes`` locks the nodes it moves (node level); the others lock only
the group (not modelled). Results as Ganeti 3.0's: ``null``, the list of changes for
set-params, the new name for a rename.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synnefo_ganeti.testing._cluster import OpFailure
from synnefo_ganeti.testing._model import FakeGroup
from synnefo_ganeti.testing._registry import Needs, opcode

if TYPE_CHECKING:
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeJob, FakeOp

__all__: list[str] = []

_POLICIES = ("preferred", "last_resort", "unallocable")


def _check_policy(policy: Any) -> None:
    if policy is not None and policy not in _POLICIES:
        raise OpFailure(
            "TypeEnforcementError",
            f"'alloc_policy' (value {policy}) is not a valid allocation policy",
            prereq=False,
        )


@opcode("OP_GROUP_ADD")
async def group_add(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    p = op.luxid
    name = str(p.get("group_name"))
    _check_policy(p.get("alloc_policy"))
    cluster.start_running(job, op)  # holding its locks: the checks below are CheckPrereq's
    if name in cluster.model.groups:
        uuid = cluster.model.groups[name].uuid
        raise OpFailure(
            "OpPrereqError", f"Desired group name '{name}' already exists as a node group (UUID: {uuid})",
            "already_exists",
        )  # fmt: skip
    await cluster.work(job, op, [], cluster.op_time(op))
    if not p.get("dry_run"):
        cluster.model.groups[name] = FakeGroup(
            name=name, alloc_policy=str(p.get("alloc_policy") or "preferred"), tags=list(p.get("tags") or []),
            ndparams=dict(p.get("ndparams") or {}), ipolicy=dict(p.get("ipolicy") or {}),
            diskparams=dict(p.get("diskparams") or {}),
        )  # fmt: skip


@opcode("OP_GROUP_SET_PARAMS")
async def group_set_params(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    p = op.luxid
    group = cluster.model.group(str(p.get("group_name")))
    keys = ("alloc_policy", "ndparams", "diskparams", "hv_state", "disk_state", "ipolicy")
    if all(p.get(key) is None for key in keys):
        raise OpFailure("OpPrereqError", "Please pass at least one modification", "wrong_input")
    _check_policy(p.get("alloc_policy"))
    cluster.start_running(job, op)
    await cluster.work(job, op, [], cluster.op_time(op))
    changes: list[list[Any]] = []
    if p.get("alloc_policy") is not None:
        group.alloc_policy = str(p["alloc_policy"])
        changes.append(["alloc_policy", group.alloc_policy])
    for key in ("ndparams", "diskparams", "ipolicy"):
        if p.get(key) is not None:
            getattr(group, key).update(p[key])
            changes.append([key, dict(getattr(group, key))])
    group.touch()
    op.result = changes


@opcode("OP_GROUP_RENAME")
async def group_rename(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    group = cluster.model.group(str(op.luxid.get("group_name")))
    new = str(op.luxid.get("new_name"))
    cluster.start_running(job, op)
    if new in cluster.model.groups:
        uuid = cluster.model.groups[new].uuid
        raise OpFailure(
            "OpPrereqError", f"Desired new name '{new}' clashes with existing node group (UUID: {uuid})",
            "already_exists",
        )  # fmt: skip
    await cluster.work(job, op, [], cluster.op_time(op))
    if not op.luxid.get("dry_run"):
        model = cluster.model
        model.groups[new] = model.groups.pop(group.name)
        model.node_group = {
            node: new if name == group.name else name for node, name in model.node_group.items()
        }
        group.name = new
        group.touch()
    op.result = new


def _assign_locks(cluster: FakeCluster, op: FakeOp) -> Needs:
    """``LUGroupAssignNodes.ExpandNames``: the nodes moved (node level)."""
    return Needs(node=[str(n) for n in op.luxid.get("nodes") or [] if n in cluster.nodes])


@opcode("OP_GROUP_ASSIGN_NODES", locks=_assign_locks)
async def group_assign_nodes(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    group = cluster.model.group(str(op.luxid.get("group_name")))
    nodes = [str(n) for n in op.luxid.get("nodes") or []]
    for node in nodes:
        if node not in cluster.nodes:
            raise OpFailure("OpPrereqError", f"Node '{node}' not known", "unknown_entity")
    cluster.start_running(job, op, node_uuids=[cluster.nodes[n].uuid for n in nodes])
    await cluster.work(job, op, [], cluster.op_time(op))
    if not op.luxid.get("dry_run"):
        for node in nodes:
            cluster.model.node_group[node] = group.name
        group.touch()


@opcode("OP_GROUP_REMOVE")
async def group_remove(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    group = cluster.model.group(str(op.luxid.get("group_name")))
    cluster.start_running(job, op)
    nodes = sorted(cluster.nodes[n].uuid for n, g in cluster.model.node_group.items() if g == group.name)
    if nodes:
        raise OpFailure(
            "OpPrereqError", f"Group '{group.name}' not empty, has the following nodes: {', '.join(nodes)}",
            "wrong_state",
        )  # fmt: skip
    if len(cluster.model.groups) == 1:
        raise OpFailure(
            "OpPrereqError", f"Group '{group.name}' is the only group, cannot be removed", "wrong_state"
        )
    await cluster.work(job, op, [], cluster.op_time(op))
    if not op.luxid.get("dry_run"):
        cluster.model.groups.pop(group.name, None)
