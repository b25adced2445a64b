"""Which failed ops blame a node, not the request: read from Ganeti 3.0's messages (pure code).

A create placed on a node that died, or that an operator marked offline or drained, fails
with a message naming that node; the same create placed on another node (or backend) may
succeed. The messages, from Ganeti 3.0's code:

* ``LUInstanceCreate.CheckPrereq`` (``cmdlib/instance_create.py``): "Cannot use offline primary
  node 'N'", "Cannot use drained primary node 'N'", "Cannot use non-vm_capable primary node 'N'"
  (``ECODE_STATE``); for the secondary ``CheckNodeOnline`` ("Can't use offline node: N",
  ``cmdlib/common.py``) and ``CheckNodeNotDrained`` ("Can't use drained node N",
  ``cmdlib/instance_utils.py``);
* RPC calls to the node that failed, through ``RpcResult.Raise`` (``rpc/node.py``: "<what>: <the
  failure>", the failure being pycurl's "Error <n>: <text>", e.g. "Error 7: Failed to connect
  to ... port 1811: Connection refused", or "Node is marked offline"): ``CheckHVParams``
  ("Hypervisor parameter validation failed on node N: ..."), ``CheckOSParams`` ("OS Parameters
  validation failed on node N: ..."; without an RPC failure that is the OS missing there, a
  reason of the backend: ``_settle.is_backend_error``), ``CheckNodeFreeMemory`` ("Can't get data
  from node N: ...", ``ECODE_ENVIRON``; "Can't compute free memory on node N", ``ECODE_ENVIRON``),
  ``IAllocator._ComputeDynamicNodeData`` ("Can't get data for node N: ...": a create that names
  an iallocator fails while any node not offline does not answer, whichever node it would have
  taken), ``CheckNicsBridgesExist`` ("Error checking bridges on destination node 'N': ...",
  ``ECODE_ENVIRON``), and in ``Exec`` before the instance is added to the configuration,
  ``CreateSingleBlockDev`` ("Can't create block device D on node N for instance I: ...") and
  ``CreateDisks`` ("Failed to create directory 'P' on node N: ...").

Those fail before ``LUInstanceCreate.Exec`` calls ``cfg.AddInstance``: Ganeti made no instance,
so the create may go elsewhere (:func:`is_node_error`). An RPC failure naming a node after that
("Could not add os for instance I on node N: ...", "Could not start instance: ...") leaves the
instance in Ganeti: the node is down all the same (:func:`node_fault`), but the request is not
placed again. Ganeti's "Not enough memory on node N" (``ECODE_NORES``) is a node without room,
not a node down: :func:`~synnefo_ganeti.store.requests._settle.is_capacity_error`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["NodeFault", "NodeFaultKind", "is_node_error", "named_node", "node_fault"]

#: "down" (it does not answer), "offline" (marked so), "drained" or "unusable" (not vm_capable)
NodeFaultKind = Literal["down", "offline", "drained", "unusable"]

#: what an RPC failure to a node says (``http/client.py``: pycurl's "Error <n>: <text>"; ``rpc/node.py``)
_RPC_FAILURE = re.compile(
    r"Error \d+: |Failed to connect|Couldn't connect|Could not connect|Connection (?:refused|reset|timed out)"
    r"|Operation timed out|No route to host|Empty reply from server|Recv failure|Could(?:n't| not) resolve"
    r"|Node is marked offline",
    re.IGNORECASE,
)
_OFFLINE_RPC = "node is marked offline"

_NODE = r"'?(?P<node>[A-Za-z0-9][A-Za-z0-9._-]*?)'?"

#: refusals of the node as it is in Ganeti's configuration (no RPC): kind, pattern
_STATE_REFUSALS: tuple[tuple[NodeFaultKind, re.Pattern[str]], ...] = (
    ("offline", re.compile(rf"Cannot use offline primary node {_NODE}(?:$|[\s:;,)])")),
    ("offline", re.compile(rf"Can't use offline node: {_NODE}(?:$|[\s:;,)])")),
    ("drained", re.compile(rf"Cannot use drained primary node {_NODE}(?:$|[\s:;,)])")),
    ("drained", re.compile(rf"Can't use drained node {_NODE}(?:$|[\s:;,)])")),
    ("unusable", re.compile(rf"Cannot use non-vm_capable primary node {_NODE}(?:$|[\s:;,)])")),
)

#: RPC failures before the instance is in Ganeti's configuration: the node named, then ": <failure>"
_BEFORE_INSTANCE = (
    re.compile(rf"Hypervisor parameter validation failed on node {_NODE}: (?P<rest>.*)", re.DOTALL),
    re.compile(rf"OS Parameters validation failed on node {_NODE}: (?P<rest>.*)", re.DOTALL),
    re.compile(rf"Error checking bridges on destination node {_NODE}: (?P<rest>.*)", re.DOTALL),
    re.compile(rf"Can't create block device \S+ on node {_NODE} for instance \S+: (?P<rest>.*)", re.DOTALL),
    re.compile(rf"Failed to create directory '[^']*' on node {_NODE}: (?P<rest>.*)", re.DOTALL),
)

#: the node's environment (ECODE_ENVIRON), whatever the failure after it: before the instance
_ENVIRON = (
    re.compile(rf"Can't get data from node {_NODE}: (?P<rest>.*)", re.DOTALL),
    # an iallocator's input (IAllocator._ComputeDynamicNodeData, in CheckPrereq): every node not
    # offline must answer, whichever the instance would go to
    re.compile(rf"Can't get data for node {_NODE}: (?P<rest>.*)", re.DOTALL),
    re.compile(rf"Can't get node instance info from node {_NODE}: (?P<rest>.*)", re.DOTALL),
    re.compile(rf"Can't compute free memory on node {_NODE}, result", re.DOTALL),
)

#: "node N" or "node 'N'" anywhere (the last one before an RPC failure is the node it was sent to)
_ANY_NODE = re.compile(r"node '?(?P<node>[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])'?")


@dataclass(frozen=True, slots=True)
class NodeFault:
    """A failed op's message blames ``node``: it is ``kind``; ``before_instance``: the op failed
    before a create added its instance to Ganeti's configuration (nothing was made)."""

    node: str
    kind: NodeFaultKind
    before_instance: bool


def _rpc_kind(rest: str) -> NodeFaultKind | None:
    if _RPC_FAILURE.search(rest) is None:
        return None
    return "offline" if _OFFLINE_RPC in rest.lower() else "down"


def node_fault(message: str | None) -> NodeFault | None:
    """The node a failed op's message blames, or None (the message blames no node).

    Any op's: a create's refusal of an offline, drained or not vm_capable node, or an RPC to a
    node that failed (a node that does not answer). See the module for the messages."""
    if not message:
        return None
    for kind, pattern in _STATE_REFUSALS:
        found = pattern.search(message)
        if found is not None:
            return NodeFault(found["node"].rstrip("."), kind, before_instance=True)
    for pattern in _BEFORE_INSTANCE:
        found = pattern.search(message)
        if found is not None:
            rpc = _rpc_kind(found["rest"])
            if rpc is not None:
                return NodeFault(found["node"].rstrip("."), rpc, before_instance=True)
    for pattern in _ENVIRON:
        found = pattern.search(message)
        if found is not None:
            rest = found.groupdict().get("rest") or ""
            return NodeFault(found["node"].rstrip("."), _rpc_kind(rest) or "down", before_instance=True)
    failure = _RPC_FAILURE.search(message)
    if failure is None:
        return None
    named = [m for m in _ANY_NODE.finditer(message, 0, failure.start())]
    if not named:
        return None
    kind = _rpc_kind(message[failure.start() :]) or "down"
    return NodeFault(named[-1]["node"].rstrip("."), kind, before_instance=False)


def is_node_error(message: str | None) -> str | None:
    """The node a failed create's message blames when Ganeti made no instance (the create may go
    to another node or backend); None when the message blames the request, the backend or
    nothing, or when the instance may exist in Ganeti (see the module)."""
    fault = node_fault(message)
    return fault.node if fault is not None and fault.before_instance else None


def named_node(message: str | None) -> str | None:
    """The node a failed op's message names first ("... on node N ..."), whatever the failure."""
    fault = node_fault(message)
    if fault is not None:
        return fault.node
    found = _ANY_NODE.search(message or "")
    return None if found is None else found["node"].rstrip(".")
