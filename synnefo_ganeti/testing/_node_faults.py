"""A node that crashed: what Ganeti 3.0 reads of it and what its ops do, and crash/restore.

A crashed node (``FakeNode.crashed``) is a machine gone while Ganeti's configuration still
lists it online: every RPC to it fails. Followed from Ganeti's code and from what the
3-node lab showed when a node was killed (tests/fixtures/ganeti-3.0-nodefail, recorded by
scripts/record-node-failure.py):

* ``rpc/node.py``: an RPC to a node that does not answer fails after
  ``RPC_CONNECT_TIMEOUT`` (5 s) with curl's message, ``Error 28: Failed to connect to
  <ip> port 1811 after 5000 ms: Timeout was reached`` (the lab also showed ``Error 7: ...
  Couldn't connect to server`` once the address was known unreachable);
  ``RpcResult.Raise(msg)`` fails the op with ``OpExecError("<msg>: <error>")`` (no ecode),
  or ``OpPrereqError`` with an ecode when called with ``prereq=True``. The fake waits
  ``cluster.rpc_timeout`` seconds (0 unless set: the lab waits 5 s) before failing.
* reads (``query._GetLiveNodeField``, ``_GetInstStatus``): the node's live figures are
  ``null``, its instances ``ERROR_nodedown`` (:mod:`._cluster`, :mod:`._query`); each read that
  needs its live data waits the RPC timeout (the lab: 5.0 s per ``GET /2/nodes?bulk=1``).
* ``LUInstanceCreate.CheckPrereq`` with ``pnode`` on it: ``CheckHVParams`` fails
  (``Hypervisor parameter validation failed on node <node>: <error>``, ``OpExecError``).
* an iallocator's input (``IAllocator._ComputeDynamicNodeData``) asks every vm-capable node
  that is not offline for its data: one that does not answer fails the create
  (``Can't get data for node <node>: <error>``): with a node crashed and not marked offline,
  no create by hail succeeds, and none is ever placed on it.
* ops on its instances: shutdown (``Could not shutdown instance '<name>'``), startup and
  reboot (``Error checking node``/``bridges`` in ``CheckPrereq``, ``environment_error``),
  remove (``Could not shutdown instance <name> on node <node>``, unless ``ignore_failures``),
  failover (``TLMigrateInstance._ExecFailover``: proceeds only with ``ignore_consistency`` or
  the node offline); marking it online again (``LUNodeSetParams``: ``call_version``) fails.

The master cannot crash here: the fake's RAPI runs on it (stop the fake, or answer 502s with
``inject_fault``, then ``master_failover``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

from synnefo_ganeti.errors import ConflictError, NotFoundError
from synnefo_ganeti.testing._cluster import OpFailure

if TYPE_CHECKING:
    from synnefo_ganeti.testing._cluster import FakeNode
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeJob, FakeOp

__all__ = [
    "ENVIRON",
    "RPC_PORT",
    "check_allocator_input",
    "check_answers",
    "check_online",
    "crash_node",
    "restore_node",
    "rpc_error",
    "wait_for_live_data",
    "warn_hooks",
]

#: noded's port (``constants.DEFAULT_NODED_PORT``)
RPC_PORT = 1811
#: ``errors.ECODE_ENVIRON``
ENVIRON = "environment_error"
#: ``constants.RPC_CONNECT_TIMEOUT`` in ms, as curl's message says it
_CONNECT_TIMEOUT_MS = 5000


def rpc_error(node: FakeNode) -> str:
    """The ``fail_msg`` of an RPC to a node that does not answer (curl's connect timeout)."""
    return (
        f"Error 28: Failed to connect to {node.ip} port {RPC_PORT} after {_CONNECT_TIMEOUT_MS} ms: "
        "Timeout was reached"
    )


async def check_answers(
    cluster: FakeCluster, node: FakeNode, message: str, *, prereq: bool = False, ecode: str | None = None
) -> None:
    """An RPC the op makes to ``node``: nothing when it answers; when it crashed, wait the RPC
    timeout and fail as ``RpcResult.Raise(message, prereq=prereq, ecode=ecode)``."""
    if not node.crashed:
        return
    if cluster.rpc_timeout > 0:
        await asyncio.sleep(cluster.rpc_timeout)
    kind = "OpPrereqError" if prereq else "OpExecError"
    raise OpFailure(kind, f"{message}: {rpc_error(node)}", ecode, prereq=False)


async def warn_hooks(cluster: FakeCluster, job: FakeJob, op: FakeOp, node: FakeNode) -> None:
    """The LU's pre-hooks run on ``node`` too (``HooksMaster.RunPhase``): when it crashed, the
    RPC times out and the op logs ``Communication failure to node <uuid>: <error>`` and goes on."""
    if not node.crashed:
        return
    if cluster.rpc_timeout > 0:
        await asyncio.sleep(cluster.rpc_timeout)
    cluster.log(job, op, f" - WARNING: Communication failure to node {node.uuid}: {rpc_error(node)}")


def check_online(node: FakeNode, message: str = "Can't use offline node") -> None:
    """``CheckNodeOnline``: an offline node fails the op (``wrong_state``)."""
    if node.offline:
        raise OpFailure("OpPrereqError", f"{message}: {node.name}", "wrong_state")


async def check_allocator_input(cluster: FakeCluster) -> None:
    """``IAllocator._ComputeDynamicNodeData``: every vm-capable node not offline must answer
    ``call_node_info``; the first that does not fails the op (``Can't get data for node``)."""
    for node in cluster.nodes.values():
        if node.vm_capable and not node.offline:
            await check_answers(cluster, node, f"Can't get data for node {node.name}")


async def wait_for_live_data(cluster: FakeCluster, names: Iterable[str] | None = None) -> None:
    """A read of live data from ``names`` (every node when None): Ganeti waits the RPC timeout
    of a node that does not answer (the lab: 5.0 s per ``GET /2/nodes?bulk=1``), all in parallel."""
    if cluster.rpc_timeout <= 0:
        return
    nodes = cluster.nodes.values() if names is None else (cluster.nodes.get(n) for n in names)
    if any(node is not None and node.crashed for node in nodes):
        await asyncio.sleep(cluster.rpc_timeout)


def _node(cluster: FakeCluster, name: str) -> FakeNode:
    node = cluster.nodes.get(name)
    if node is None:
        raise NotFoundError(
            f"no node {name!r} in the fake cluster; its nodes: {', '.join(sorted(cluster.nodes))}"
        )
    return node


def crash_node(cluster: FakeCluster, name: str) -> None:
    """The node's machine dies (``crash-node-multi.sh``): it stays in the configuration, online,
    but answers no RPC; the instances it ran are gone with it (they read ``ERROR_nodedown``
    until it is back, then ``ERROR_down``, as the lab's did). The master cannot crash here
    (:class:`ConflictError`); an unknown node is :class:`NotFoundError`. Crashing a crashed node
    changes nothing."""
    node = _node(cluster, name)
    if node.master:
        raise ConflictError(
            f"{name} is the master: the fake's RAPI runs there; model its death by stopping the fake "
            "(or inject_fault('502')) and master_failover() to another node"
        )
    node.crashed = True
    for inst in cluster.instances.values():
        if inst.pnode == name:
            inst.oper_state = False


def restore_node(cluster: FakeCluster, name: str) -> None:
    """The node is back (``up-multi.sh``: its daemons restarted): Ganeti reads it again at once;
    its instances stay stopped (their admin state is unchanged: ``ERROR_down`` for those that
    should run). A node marked offline stays offline until it is marked online."""
    _node(cluster, name).crashed = False
