"""``OP_TAGS_SET`` and ``OP_TAGS_DEL`` (``cmdlib.tags``): tags of the cluster, an instance, a node,
a group or a network.

Locks as ``TagsLU.ExpandNames``: the instance's lock for an instance, the node's for a node
(group and network locks are not modelled, nor the cluster's). Each tag is checked as
``objects.TaggableObject.ValidateTag`` (``TagError``); deleting a tag the object lacks fails
with ``Tag(s) 'x' not found``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from synnefo_ganeti.testing._cluster import OpFailure
from synnefo_ganeti.testing._registry import Needs, opcode

if TYPE_CHECKING:
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeJob, FakeOp

__all__ = ["tags_of"]

_VALID = re.compile(r"^[\w.+*/:@-]+$")
_MAX_LEN, _MAX_TAGS = 128, 4096
KINDS = ("cluster", "instance", "node", "nodegroup", "network")


def tags_of(cluster: FakeCluster, kind: str, name: str | None) -> list[str]:
    """The tag list of an object (the list itself, to change in place); Ganeti's error if unknown."""
    target: Any
    if kind == "cluster":
        return cluster.model.tags
    if kind == "instance":
        target = cluster.instances.get(str(name))
    elif kind == "node":
        target = cluster.nodes.get(str(name))
    elif kind == "nodegroup":
        target = cluster.model.groups.get(str(name))
    elif kind == "network":
        target = cluster.model.networks.get(str(name))
    else:
        raise OpFailure("OpPrereqError", f"Wrong tag type requested ({kind})", "wrong_input")
    if target is None:
        label = {"nodegroup": "Group", "network": "Network", "node": "Node", "instance": "Instance"}[kind]
        raise OpFailure("OpPrereqError", f"{label} '{name}' not known", "unknown_entity")
    tags: list[str] = target.tags
    return tags


def _locks(cluster: FakeCluster, op: FakeOp) -> Needs:
    kind, name = op.luxid.get("kind"), op.luxid.get("name")
    if kind == "instance":
        return Needs(instance=str(name))
    if kind == "node":
        return Needs(node=[str(name)] if name in cluster.nodes else [])
    return Needs()


def _validate(tags: list[Any]) -> None:
    for tag in tags:
        if not isinstance(tag, str):
            raise OpFailure("TagError", "Invalid tag type (not a string)")
        if len(tag) > _MAX_LEN:
            raise OpFailure("TagError", f"Tag too long (>{_MAX_LEN} characters)")
        if not tag:
            raise OpFailure("TagError", "Tags cannot be empty")
        if not _VALID.match(tag):
            raise OpFailure("TagError", "Tag contains invalid characters")


@opcode("OP_TAGS_SET", locks=_locks)
async def tags_set(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    tags = list(op.luxid.get("tags") or [])
    current = tags_of(cluster, str(op.luxid.get("kind")), op.luxid.get("name"))  # ExpandNames
    cluster.start_running(job, op)  # holding its locks: the checks below are CheckPrereq's
    _validate(tags)
    if len(set(current) | set(tags)) > _MAX_TAGS:
        raise OpFailure("TagError", "Too many tags")
    await cluster.work(job, op, [], cluster.op_time(op))
    if not op.luxid.get("dry_run"):
        current.extend(tag for tag in dict.fromkeys(tags) if tag not in current)


@opcode("OP_TAGS_DEL", locks=_locks)
async def tags_del(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    tags = list(op.luxid.get("tags") or [])
    current = tags_of(cluster, str(op.luxid.get("kind")), op.luxid.get("name"))
    cluster.start_running(job, op)
    _validate(tags)
    missing = sorted(set(tags) - set(current))
    if missing:
        names = ", ".join(f"'{tag}'" for tag in missing)
        raise OpFailure("OpPrereqError", f"Tag(s) {names} not found", "unknown_entity")
    await cluster.work(job, op, [], cluster.op_time(op))
    if not op.luxid.get("dry_run"):
        current[:] = [tag for tag in current if tag not in tags]
