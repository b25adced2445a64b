"""``OP_INSTANCE_CREATE`` as ``LUInstanceCreate`` runs it: its locks, its allocator, its two phases.

Locks (``LUInstanceCreate.ExpandNames``, ``DeclareLocks``): the new instance's lock, and

* with ``pnode`` (and ``snode`` for a mirrored template): node and node-res locks of those nodes;
* with an iallocator (given, or no ``pnode`` and none given: the cluster's default,
  ``CheckIAllocatorOrNode``): **all** node and node-res locks (``locking.ALL_SET``),
  exclusively, so it waits for every other job holding any node lock and blocks them all;
* with ``opportunistic_locking`` as well: only the node (then node-res) locks free now, at
  least ``opportunistic_locks_count`` (2 for ``drbd``, else 1) of them.

``CheckPrereq`` then runs the allocator (``_RunAllocator``) over all nodes, or over the
nodes it holds both locks of when opportunistic; finding none that fits, an opportunistic
create fails with ``ECODE_TEMP_NORES`` and the engine retries it with all locks
(``PrepareRetry``), any other with ``ECODE_NORES``. Then it releases every node lock but
the chosen nodes' (``ReleaseLocks(..., keep=...)``).

A crashed node (:mod:`._node_faults`): a create with ``pnode`` there fails in ``CheckHVParams``
(``OpExecError``, after the policy check, as ``CheckPrereq`` orders them); a create by an
iallocator fails while any node that is not offline does not answer (``IAllocator``'s input).

``Exec`` has two phases: the disks, holding the node and node-res locks (``op_times``
``"OP_INSTANCE_CREATE/disks"``), then ``ReleaseLocks`` of both levels (node locks once
the disks exist, node-res locks after wiping/imaging, which the fake does not do) and the
OS scripts and the start holding neither (the rest of ``op_times["OP_INSTANCE_CREATE"]``).
Without an ``"OP_INSTANCE_CREATE/disks"`` time the whole create holds its locks.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from synnefo_ganeti.testing._cluster import FakeInstance, OpFailure, parse_size
from synnefo_ganeti.testing._locks import ALL
from synnefo_ganeti.testing._macs import MacReservation
from synnefo_ganeti.testing._names import check_create_name, ping
from synnefo_ganeti.testing._node_faults import check_allocator_input, check_answers
from synnefo_ganeti.testing._ops_networks import create_nics
from synnefo_ganeti.testing._placement import (
    allocate,
    check_pnode,
    check_policy,
    check_room,
    check_snode,
    choose_node,
)
from synnefo_ganeti.testing._registry import Needs, opcode

if TYPE_CHECKING:
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeJob, FakeOp

__all__ = ["BEPARAMS_DEFAULTS", "DISKS_KEY", "MIRRORED"]

#: the backend parameters an instance gets where its create did not say
BEPARAMS_DEFAULTS = {"vcpus": 1, "auto_balance": True, "always_failover": False, "spindle_use": 1}
#: the ``op_times`` key of a create's locked phase (its disks)
DISKS_KEY = "OP_INSTANCE_CREATE/disks"
#: templates that need a second node (``constants.DTS_INT_MIRROR``)
MIRRORED = frozenset({"drbd"})


def _iallocator(cluster: FakeCluster, op: FakeOp) -> str | None:
    """``CheckIAllocatorOrNode``: the op's iallocator, the cluster's default without ``pnode``, else None."""
    p = op.luxid
    if p.get("iallocator") in (None, ".") and not p.get("pnode"):
        return cluster.default_iallocator
    return str(p["iallocator"]) if p.get("iallocator") else None


def _opportunistic(op: FakeOp) -> bool:
    """``opportunistic_locking``, until ``PrepareRetry`` turns it off."""
    return bool(op.resolved.get("opportunistic_locking", op.luxid.get("opportunistic_locking")))


def _create_locks(cluster: FakeCluster, op: FakeOp) -> Needs:
    """``LUInstanceCreate.ExpandNames`` and ``DeclareLocks``."""
    p = op.luxid
    name = str(p.get("instance_name"))
    if _iallocator(cluster, op) is None:
        nodes = [str(p.get("pnode"))]
        if p.get("snode") and p.get("disk_template") in MIRRORED:
            nodes.append(str(p["snode"]))
        return Needs(instance=name, node=nodes, node_res=list(nodes))
    count = (2 if p.get("disk_template") in MIRRORED else 1) if _opportunistic(op) else 0
    return Needs(instance=name, node=ALL, node_res=ALL, opportunistic=count)


def _run_allocator(cluster: FakeCluster, job: FakeJob, op: FakeOp, ialloc: str, memory: int,
                   disks: list[dict[str, Any]], template: str) -> str:  # fmt: skip
    """``LUInstanceCreate._RunAllocator``, then ``ReleaseLocks`` of every node but the chosen one."""
    name = str(op.luxid.get("instance_name"))
    opportunistic = _opportunistic(op)
    if opportunistic:  # only the nodes it holds both locks of
        candidates = cluster.locks.owned(op, "node") & cluster.locks.owned(op, "node-res")
    else:
        candidates = set(cluster.nodes)
    node = allocate(cluster, sorted(candidates), memory, disks, template)
    if node is None:
        info = f"Request failed: No valid allocation solutions for instance {name}"
        if opportunistic:
            cluster.log(
                job, op, f" - INFO: IAllocator '{ialloc}' failed on opportunistically acquired nodes: {info}"
            )
        raise OpFailure(
            "OpPrereqError",
            f"Can't compute nodes using iallocator '{ialloc}': {info}",
            "temp_insufficient_resources" if opportunistic else "insufficient_resources",
            prereq=False,
        )
    op.resolve(pnode=node.name, pnode_uuid=node.uuid)
    cluster.log(job, op, f" - INFO: Selected nodes for instance {name} via iallocator {ialloc}: {node.name}")
    return node.name


@opcode("OP_INSTANCE_CREATE", locks=_create_locks)
async def instance_create(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    p = op.luxid
    name = str(p["instance_name"])
    op.resolve(osparams_private=None, osparams_secret=None)
    address = check_create_name(cluster, op)  # CheckArguments: name_check (and the address to ping)
    if name in cluster.instances:
        raise OpFailure("OpPrereqError", f"Instance '{name}' is already in the cluster", "already_exists")
    template = str(p.get("disk_template"))
    if template not in cluster.disk_templates:
        raise OpFailure(
            "OpPrereqError",
            f"Cannot create an instance with disk template '{template}', as it's not enabled in cluster. "
            f"Enabled disk templates are: {','.join(cluster.disk_templates)}",
            "wrong_input",
        )
    if p.get("pnode") and p.get("iallocator"):
        raise OpFailure("OpPrereqError", "Do not specify both, iallocator and node", "wrong_input")
    ialloc = _iallocator(cluster, op)
    node = choose_node(cluster, p, name, check=False) if ialloc is None else None  # ExpandNames
    file_driver = p.get("file_driver") or ("loop" if template in ("file", "sharedfile") else None)
    resolved = {"pnode": node.name, "pnode_uuid": node.uuid} if node is not None else {"iallocator": ialloc}
    cluster.start_running(
        job, op, hypervisor=p.get("hypervisor") or cluster.hypervisor, file_driver=file_driver, **resolved
    )
    if node is not None:
        check_pnode(node)  # CheckPrereq
        snode = cluster.nodes.get(str(p.get("snode"))) if template in MIRRORED else None
        if snode is not None:
            check_snode(snode, node)  # CheckPrereq: the mirror node
    ping(cluster, address, name)  # CheckPrereq: ip_check
    # ComputeNics (CheckPrereq): a MAC given is checked and reserved, the others generated
    macs = MacReservation(cluster, create=True)
    nics = [dict(nic) | {"mac": macs.take(dict(nic))} for nic in p.get("nics") or []]
    # Once running, the executor has turned "memory" into maxmem/minmem (written with what
    # comes next); the private/secret OS parameters appear with the first log line.
    beparams = dict(p.get("beparams") or {})
    memory = beparams.pop("memory", None)
    for key in ("maxmem", "minmem"):
        if memory is not None:
            beparams.setdefault(key, memory)
    op.resolve(
        beparams={key: beparams[key] for key in ("maxmem", "minmem") if key in beparams}
        | {key: value for key, value in beparams.items() if key not in ("maxmem", "minmem")}
    )
    custom = {
        key: parse_size(key, value) if key in ("maxmem", "minmem") else value
        for key, value in beparams.items()
    }
    maxmem = int(custom.get("maxmem", 128))
    vcpus = custom.get("vcpus", 1)
    if not isinstance(vcpus, int) or isinstance(vcpus, bool):
        raise OpFailure("TypeEnforcementError", f"'vcpus' (value {vcpus}) is not a valid int", prereq=False)
    op.resolve(osparams_private={}, osparams_secret={})
    disks = [dict(d) for d in p.get("disks") or []]
    for index, disk in enumerate(disks):
        disk["size"] = parse_size(f"disk/{index}", disk.get("size"))
    needed = maxmem if p.get("start", True) else 0
    if node is None:
        assert ialloc is not None
        await check_allocator_input(cluster)  # IAllocator._ComputeDynamicNodeData
        node = cluster.nodes[_run_allocator(cluster, job, op, ialloc, needed, disks, template)]
    cluster.release(op, "node", keep=[node.name])
    cluster.release(op, "node-res", keep=[node.name])
    check_policy(cluster, maxmem, vcpus, template, disks)
    await check_answers(cluster, node, f"Hypervisor parameter validation failed on node {node.name}")
    if str(p.get("os_type")) not in cluster.oses:
        raise OpFailure(
            "OpExecError",
            f"OS Parameters validation failed on node {node.name}: Directory for OS {p.get('os_type')} not "
            "found in search path",
            prereq=False,
        )
    check_room(cluster, node, needed, disks, template, name)
    cluster.reserve(op, node.name, needed)
    if p.get("dry_run"):
        await cluster.work(
            job,
            op,
            [" - INFO: dry-run mode requested, not actually executing the operation"],
            cluster.op_time(op),
        )
        op.result = [node.uuid]
        return
    await _exec(cluster, job, op, node.name, maxmem, custom, disks, nics)


def _nic(nic: dict[str, Any], link: str) -> dict[str, Any]:
    """``ComputeNics`` (cmdlib/instance_utils.py), its MAC already chosen (:mod:`._macs`); an IP
    ``none`` is no IP."""
    ip = nic.get("ip")
    return {
        "mac": str(nic["mac"]),
        "uuid": str(uuid.uuid4()),
        "mode": nic.get("mode") or "bridged",
        "link": nic.get("link") or link,
        "ip": None if ip is None or str(ip).lower() == "none" else ip,
        "name": nic.get("name"),
        "network": nic.get("network"),
    }


async def _exec(cluster: FakeCluster, job: FakeJob, op: FakeOp, node: str, maxmem: int,
                custom: dict[str, Any], disks: list[dict[str, Any]],
                nics: list[dict[str, Any]]) -> None:  # fmt: skip
    """``LUInstanceCreate.Exec``: disks under the locks, then OS scripts and start without them."""
    p = op.luxid
    name = str(p["instance_name"])
    messages = [
        "* creating instance disks...",
        f"adding instance {name} to cluster config",
        "adding disks to cluster config",
    ]
    if p.get("start", True):
        messages.append("* starting instance...")
    total = cluster.op_time(op)
    locked = cluster.op_times.get(DISKS_KEY)
    split = locked is not None
    first = min(float(locked), total) if locked is not None else total / len(messages)
    await cluster.work(job, op, messages[:1], first)
    full = BEPARAMS_DEFAULTS | custom
    full.setdefault("minmem", maxmem)
    full.setdefault("maxmem", maxmem)
    full["memory"] = full["maxmem"]
    inst = FakeInstance(
        name=name, pnode=node, os=str(p.get("os_type")), disk_template=str(p.get("disk_template")),
        hypervisor=str(p.get("hypervisor") or cluster.hypervisor), beparams=full,
        custom_beparams={k: v for k, v in custom.items() if k != "memory"},
        nics=create_nics(cluster, node, nics, lambda nic: _nic(nic, cluster.link)),
        disks=[{"size": d["size"], "uuid": str(uuid.uuid4()), "name": d.get("name")} for d in disks],
        tags=list(p.get("tags") or []), hvparams=dict(p.get("hvparams") or {}), osparams=dict(p.get("osparams") or {}),
        admin_state="up" if p.get("start", True) else "down", oper_state=False,
    )  # fmt: skip
    cluster.instances[name] = inst
    if split:
        for message in messages[1:3]:
            cluster.log(job, op, message)
        cluster.release(op, "node")  # ReleaseLocks(self, locking.LEVEL_NODE): the disks exist
        cluster.release(op, "node-res")  # ReleaseLocks(self, locking.LEVEL_NODE_RES): wiped/imaged
        await cluster.work(job, op, messages[3:], total - first)
    else:
        await cluster.work(job, op, messages[1:], total - first)
    inst.oper_state = bool(p.get("start", True))
    op.result = [node]
