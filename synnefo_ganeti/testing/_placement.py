"""Where an instance goes and whether it fits: the checks Ganeti makes when placing one.

* :func:`allocate`: like hail, for a create without ``pnode``, among the nodes it holds
  locks on (creates placed but not yet ended hold their memory in ``cluster.reserved``:
  the fake counts it where Ganeti's hail reads the nodes' live free memory);
* :func:`choose_node`: the op's ``pnode`` (checked) or the usable node with the most free memory;
* :func:`check_policy`: the instance policy (memory, CPUs, disk sizes; ``cluster.ipolicy``);
* :func:`check_room`: free memory and disk on the chosen node.

Failures are :class:`~._cluster.OpFailure` with Ganeti 3.0's messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from synnefo_ganeti.testing._cluster import FakeNode, OpFailure, free_capacity

if TYPE_CHECKING:
    from synnefo_ganeti.testing._engine import FakeCluster

__all__ = ["allocate", "check_pnode", "check_policy", "check_room", "check_snode", "choose_node", "free"]


def free(cluster: FakeCluster, node: FakeNode) -> tuple[int | None, int | None]:
    """Free memory and disk (MiB) on ``node``; ``None`` where the node does not say."""
    return free_capacity(node, cluster.instances.values())


def allocate(
    cluster: FakeCluster, candidates: Iterable[str], memory: int, disks: list[dict[str, Any]], template: str
) -> FakeNode | None:
    """Like hail: among ``candidates`` (the nodes the create holds locks on), the usable node
    with the most free memory that fits ``memory`` and the disks, counting what creates
    placed there and not yet ended hold (``cluster.reserved``); ``None`` when none fits."""
    needed = 0 if template == "diskless" else sum(d["size"] for d in disks)
    fits = []
    for name in candidates:
        node = cluster.nodes.get(name)
        if node is None or not node.live or node.drained or not node.vm_capable:
            continue  # hail leaves out offline nodes; a crashed one has failed the create before
        mfree, dfree = free(cluster, node)
        room = (mfree or 0) - cluster.reserved.get(name, 0)
        if room >= memory and (not needed or dfree is None or dfree >= needed):
            fits.append((room, name, node))
    return max(fits, key=lambda fit: (fit[0], fit[1]))[2] if fits else None


def check_pnode(node: FakeNode) -> None:
    """``LUInstanceCreate.CheckPrereq``: the primary node neither offline nor drained, and
    vm_capable (the op holds its locks and runs: the real job files have its ``exec_timestamp``)."""
    if node.offline:
        raise OpFailure("OpPrereqError", f"Cannot use offline primary node '{node.name}'", "wrong_state")
    if node.drained:
        raise OpFailure("OpPrereqError", f"Cannot use drained primary node '{node.name}'", "wrong_state")
    if not node.vm_capable:
        raise OpFailure(
            "OpPrereqError", f"Cannot use non-vm_capable primary node '{node.name}'", "wrong_state"
        )


def check_snode(node: FakeNode, pnode: FakeNode) -> None:
    """``LUInstanceCreate.CheckPrereq`` for a mirrored template's secondary: not the primary, then
    ``CheckNodeOnline`` (``cmdlib/common.py``), ``CheckNodeNotDrained`` and ``CheckNodeVmCapable``
    (``cmdlib/instance_utils.py``; Ganeti 3.0's message names the node's uuid there)."""
    if node.name == pnode.name:
        raise OpFailure("OpPrereqError", "The secondary node cannot be the primary node", "wrong_input")
    if node.offline:
        raise OpFailure("OpPrereqError", f"Can't use offline node: {node.name}", "wrong_state")
    if node.drained:
        raise OpFailure("OpPrereqError", f"Can't use drained node {node.name}", "wrong_state")
    if not node.vm_capable:
        raise OpFailure("OpPrereqError", f"Can't use non-vm_capable node {node.uuid}", "wrong_state")


def choose_node(cluster: FakeCluster, p: dict[str, Any], name: str, *, check: bool = True) -> FakeNode:
    """The op's ``pnode`` (unknown: ``ExpandNames``' failure; offline or drained: :func:`check_pnode`
    unless ``check`` is false), or the usable node with the most free memory."""
    wanted = p.get("pnode")
    if wanted:
        node = cluster.nodes.get(str(wanted))
        if node is None:
            raise OpFailure("OpPrereqError", f"Node '{wanted}' not known", "unknown_entity")
        if check:
            check_pnode(node)
        return node
    usable = [n for n in cluster.nodes.values() if n.live and not n.drained and n.vm_capable]
    if not usable:
        raise OpFailure(
            "OpPrereqError",
            f"Can't compute nodes using iallocator 'hail': Request failed: No valid allocation solutions "
            f"for instance {name}",
            "insufficient_resources",
        )
    return max(usable, key=lambda n: (free(cluster, n)[0] or 0, n.name))


def check_policy(
    cluster: FakeCluster, memory: int, vcpus: int, template: str, disks: list[dict[str, Any]]
) -> None:
    problems = []
    bounds = cluster.ipolicy
    checks = [("memory-size", memory), ("cpu-count", vcpus)]
    if template != "diskless":
        checks += [(f"disk-size/{i}", d["size"]) for i, d in enumerate(disks)]
    for key, value in checks:
        low, high = bounds[key.split("/")[0]]
        if not low <= value <= high:
            problems.append(f"{key} value {value} is not in range [{low}, {high}]")
    if problems:
        raise OpFailure(
            "OpPrereqError",
            f"Instance allocation to group {cluster.group_uuid} (default) violates policy: {', '.join(problems)}",
            "wrong_input",
            prereq=False,
        )


def check_room(
    cluster: FakeCluster, node: FakeNode, memory: int, disks: list[dict[str, Any]], template: str, name: str
) -> None:
    mfree, dfree = free(cluster, node)
    if mfree is not None:
        mfree -= cluster.reserved.get(node.name, 0)
    if memory and mfree is not None and memory > mfree:
        raise OpFailure(
            "OpPrereqError",
            f"Not enough memory on node {node.name} for starting instance {name}: needed {memory} MiB, "
            f"available {mfree} MiB",
            "insufficient_resources",
            prereq=False,
        )
    needed = 0 if template == "diskless" else sum(d["size"] for d in disks)
    if needed and dfree is not None and needed > dfree:
        raise OpFailure(
            "OpPrereqError",
            f"Not enough disk space on target node {node.name} vg xenvg: required {needed} MiB, available "
            f"{dfree} MiB",
            "insufficient_resources",
            prereq=False,
        )
