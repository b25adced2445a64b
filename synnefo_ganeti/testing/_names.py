"""Instance names as Ganeti checks them: ``name_check`` and ``ip_check`` of a create or a rename.

Ganeti resolves the name (``netutils.GetHostname``, the master's resolver) and pings the
address's noded port (``netutils.TcpPing(ip, DEFAULT_NODED_PORT)``) to see whether it is in use.
The fake's resolver knows the nodes' names and what ``FakeGaneti(hosts={name: ip})`` (the
cluster's ``model.hosts``) adds; every other name does not resolve, with the answer the 3.0 lab
gave for a name it did not know (its resolver unreachable: ``Temporary failure in name
resolution``, ``resolver_error``). An address is in use when a node has it (noded listens there).

Whether the checks run is the opcode's: Ganeti 2.16 and 3.0 default both to true, 3.1 to false
(``pNameCheck``, ``pIpCheck``; :mod:`._versions`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from synnefo_ganeti.testing._cluster import OpFailure

if TYPE_CHECKING:
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeOp

__all__ = ["check_create_name", "check_rename_name", "ping", "resolve"]


def resolve(cluster: FakeCluster, name: str) -> str:
    """``netutils.GetHostname(name=name)``: the name's address, or Ganeti's ``resolver_error``."""
    address = cluster.model.hosts.get(name)
    if address is None and name in cluster.nodes:
        address = cluster.nodes[name].ip
    if address is None:
        raise OpFailure(
            "OpPrereqError",
            f"The given name ({name}) does not resolve: Temporary failure in name resolution",
            "resolver_error",
        )
    return address


def ping(cluster: FakeCluster, address: str | None, name: str) -> None:
    """``TcpPing(ip, DEFAULT_NODED_PORT)`` answered: the address is taken (``None``: no check)."""
    if address is not None and any(node.ip == address for node in cluster.nodes.values()):
        raise OpFailure("OpPrereqError", f"IP {address} of instance {name} already in use", "not_unique")


def check_create_name(cluster: FakeCluster, op: FakeOp) -> str | None:
    """``LUInstanceCreate.CheckArguments``: the name resolved (``CheckHostnameSane``) when
    ``name_check``; returns the address ``CheckPrereq`` pings (:func:`ping`) when ``ip_check``."""
    name = str(op.luxid.get("instance_name"))
    if op.luxid.get("ip_check") and not op.luxid.get("name_check"):
        raise OpFailure("OpPrereqError", "Cannot do IP address check without a name check", "wrong_input")
    address = resolve(cluster, name) if op.luxid.get("name_check") else None
    return address if op.luxid.get("ip_check") else None


def check_rename_name(cluster: FakeCluster, op: FakeOp) -> None:
    """``LUInstanceRename.CheckArguments`` and ``_PerformChecksAndResolveNewName`` (``ExpandNames``)."""
    if op.luxid.get("ip_check") and not op.luxid.get("name_check"):
        raise OpFailure("OpPrereqError", "IP address check requires a name check", "wrong_input")
    if op.luxid.get("name_check"):
        new = str(op.luxid.get("new_name"))
        address = resolve(cluster, new)
        ping(cluster, address if op.luxid.get("ip_check") else None, new)
