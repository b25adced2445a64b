"""What an operator reads of a node (``nodes list``, ``nodes show``): pure code, no I/O.

:func:`node_info` joins three reads into one :class:`NodeInfo`: Ganeti's node
(``GET /2/nodes?bulk=1``: its role letter, CPUs, memory, disk, instances, group uuid), the
node groups' names (``GET /2/groups?bulk=1``) and the dispatcher's last read of the node as
stored in ``backend_nodes`` (up, down or offline, since when; None when it never read it).
:class:`BackendNodes` is one backend's answer: its nodes, or why it did not answer.

Roles follow Ganeti's ``role`` field (``query.py`` ``_GetNodeRole``: the master "M", a master
candidate "C", a drained node "D", an offline one "O", any other "R"); a Ganeti that lacks the
field gets the role from the node's flags. :func:`master_refusal` reads Ganeti 3.0's refusal to
change the master's flags (``LUNodeSetParams.CheckPrereq``, ``cmdlib/node.py``: "The master role
can be changed only via master-failover").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from synnefo_ganeti._serial import to_jsonable
from synnefo_ganeti.rapi import Node

__all__ = ["ROLES", "BackendNodes", "NodeInfo", "NodeRoleName", "master_refusal", "node_info", "node_role"]

NodeRoleName = Literal["master", "candidate", "regular", "drained", "offline"]

#: Ganeti's role letters (``constants.py`` ``NR_*``) -> our names
ROLES: Final[dict[str, NodeRoleName]] = {
    "M": "master",
    "C": "candidate",
    "R": "regular",
    "D": "drained",
    "O": "offline",
}

_MASTER_REFUSAL: Final = "can be changed only via master-failover"


def node_role(node: Node) -> NodeRoleName:
    """The node's role: Ganeti's letter when it gives one, else from its flags (offline, drained,
    candidate; the master is not told apart without the letter: a candidate)."""
    if node.role in ROLES:
        return ROLES[node.role]
    if node.offline:
        return "offline"
    if node.drained:
        return "drained"
    return "candidate" if node.master_candidate else "regular"


def master_refusal(message: str | None) -> bool:
    """Ganeti refused a change of the node's flags because it is the master."""
    return message is not None and _MASTER_REFUSAL in message


def _used(total: int | None, free: int | None) -> int | None:
    return None if total is None or free is None else total - free


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node of one backend as an operator reads it.

    ``state`` is the dispatcher's last read ("up", "down" or "offline"; None when no dispatcher
    read it), ``state_since`` when it entered that state, ``state_seen_at`` when it was last read,
    ``state_detail`` the first sign of a node not up. Memory and disk are MiB (None where Ganeti
    does not say: a node that does not answer has no live figures). ``read_at`` is when Ganeti
    was asked for these figures: they are "as of" then.
    """

    backend: str
    name: str
    role: NodeRoleName
    drained: bool
    offline: bool
    state: str | None
    state_since: datetime | None
    state_seen_at: datetime | None
    state_detail: str | None
    cpus: int | None
    memory_total: int | None
    memory_used: int | None
    memory_free: int | None
    disk_total: int | None
    disk_used: int | None
    disk_free: int | None
    primary_instances: tuple[str, ...]
    secondary_instances: tuple[str, ...]
    group: str | None
    read_at: datetime

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        return result


@dataclass(frozen=True, slots=True)
class BackendNodes:
    """One backend's nodes (sorted by name), or ``error``: why it did not answer (no nodes then)."""

    backend: str
    nodes: tuple[NodeInfo, ...]
    error: str | None
    read_at: datetime

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        return result


def node_info(
    backend: str,
    node: Node,
    *,
    read_at: datetime,
    groups: dict[str, str] | None = None,
    stored: dict[str, Any] | None = None,
) -> NodeInfo:
    """``node`` of ``backend`` read at ``read_at``; ``groups``: group uuid -> name; ``stored``: the
    node's ``backend_nodes`` row (name, state, since, seen_at, detail), None when never read."""
    stored = stored or {}
    group = node.group_uuid
    return NodeInfo(
        backend=backend,
        name=node.name,
        role=node_role(node),
        drained=node.drained,
        offline=node.offline,
        state=stored.get("state"),
        state_since=stored.get("since"),
        state_seen_at=stored.get("seen_at"),
        state_detail=stored.get("detail"),
        cpus=node.ctotal,
        memory_total=node.mtotal,
        memory_used=_used(node.mtotal, node.mfree),
        memory_free=node.mfree,
        disk_total=node.dtotal,
        disk_used=_used(node.dtotal, node.dfree),
        disk_free=node.dfree,
        primary_instances=tuple(sorted(node.pinst_list)),
        secondary_instances=tuple(sorted(node.sinst_list)),
        group=(groups or {}).get(group, group) if group is not None else None,
        read_at=read_at,
    )
