"""Network opcodes (``cmdlib.network``): add, set params, connect, disconnect, remove, and 3.1's rename.

The address pool is :class:`._model.AddressPool` (Ganeti's ``network.AddressPool``): a new
network reserves its network, broadcast and gateway addresses and ``add_reserved_ips``
externally; set-params adds and removes external reservations. Network and group locks
are not modelled. Every result is ``null``, as Ganeti 3.0's.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from synnefo_ganeti.testing._cluster import OpFailure, new_mac
from synnefo_ganeti.testing._macs import MacReservation
from synnefo_ganeti.testing._model import AddressPool, FakeNetwork
from synnefo_ganeti.testing._registry import opcode

if TYPE_CHECKING:
    from synnefo_ganeti.testing._cluster import FakeInstance
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeJob, FakeOp

__all__ = ["create_nics", "nic_mods", "release_nics"]


@opcode("OP_NETWORK_ADD")
async def network_add(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    p = op.luxid
    name = str(p.get("network_name"))
    if not p.get("network"):
        raise OpFailure("OpPrereqError", "Network must be given", "wrong_input")
    if name in cluster.model.networks:  # LUNetworkAdd.CheckPrereq: after the locks, running
        cluster.start_running(job, op)
        uuid = cluster.model.networks[name].uuid
        raise OpFailure(
            "OpPrereqError", f"Desired network name '{name}' already exists as a network (UUID: {uuid})",
            "already_exists",
        )  # fmt: skip
    pool = AddressPool(str(p["network"]))
    pool.reserve(str(pool.network[0]), external=True)
    pool.reserve(str(pool.network[-1]), external=True)
    gateway = p.get("gateway")
    if gateway is not None:
        pool.reserve(str(gateway), external=True)
    for address in p.get("add_reserved_ips") or []:
        pool.reserve(str(address), external=True)
    cluster.start_running(job, op)
    await cluster.work(job, op, [], cluster.op_time(op))
    if not p.get("dry_run"):
        cluster.model.networks[name] = FakeNetwork(
            name=name, pool=pool, gateway=gateway, network6=p.get("network6"), gateway6=p.get("gateway6"),
            mac_prefix=p.get("mac_prefix"), tags=list(p.get("tags") or []),
        )  # fmt: skip


@opcode("OP_NETWORK_SET_PARAMS")
async def network_set_params(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    p = op.luxid
    net = cluster.model.network(str(p.get("network_name")))
    if p.get("gateway") and (p.get("add_reserved_ips") or p.get("remove_reserved_ips")):
        raise OpFailure("OpPrereqError", "Cannot modify gateway and reserved ips at once", "wrong_input")
    gateway = p.get("gateway")
    cluster.start_running(job, op)  # holding its locks: CheckPrereq
    if gateway and gateway != "none" and net.pool.is_reserved(str(gateway)):
        raise OpFailure("OpPrereqError", f"Gateway IP address '{gateway}' is already reserved", "wrong_state")
    await cluster.work(job, op, [], cluster.op_time(op))
    if p.get("dry_run"):
        return
    # LUNetworkSetParams.Exec: a failed (un)reservation is a warning, not an error
    for address in p.get("add_reserved_ips") or []:
        try:
            net.pool.reserve(str(address), external=True)
        except OpFailure as exc:
            cluster.log(job, op, f"Cannot reserve IP {address}. {exc.message}")
    for address in p.get("remove_reserved_ips") or []:
        try:
            net.pool.release(str(address), external=True)
        except OpFailure as exc:
            cluster.log(job, op, f"Cannot unreserve IP {address}. {exc.message}")
    if gateway:
        if net.gateway:
            net.pool.release(net.gateway, external=True)
        net.gateway = None if gateway == "none" else str(gateway)
        if net.gateway:
            net.pool.reserve(net.gateway, external=True)
    for key in ("mac_prefix", "network6", "gateway6"):
        if p.get(key):
            setattr(net, key, None if p[key] == "none" else p[key])
    net.touch()


@opcode("OP_NETWORK_CONNECT")
async def network_connect(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    p = op.luxid
    net = cluster.model.network(str(p.get("network_name")))
    group = cluster.model.group(str(p.get("group_name")))
    cluster.start_running(job, op, network_uuid=net.uuid, group_uuid=group.uuid)
    await cluster.work(job, op, [], cluster.op_time(op))
    if net.name in group.networks:  # LUNetworkConnect: already connected is a warning, nothing done
        cluster.log(job, op, f"Network '{net.name}' is already mapped to group '{group.name}'")
        return
    if not p.get("dry_run"):
        group.networks[net.name] = [str(p.get("network_mode")), str(p.get("network_link")),
                                    str(p.get("network_vlan") or "")]  # fmt: skip
        group.touch()
        net.touch()


@opcode("OP_NETWORK_DISCONNECT")
async def network_disconnect(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    p = op.luxid
    net = cluster.model.network(str(p.get("network_name")))
    group = cluster.model.group(str(p.get("group_name")))
    users = [inst for inst in cluster.instances.values()
             if cluster.model.node_group.get(inst.pnode) == group.name
             and any(nic.get("network") == net.name for nic in inst.nics)]  # fmt: skip
    if users:  # LUNetworkDisconnect.CheckPrereq
        cluster.start_running(job, op, network_uuid=net.uuid, group_uuid=group.uuid)
        raise OpFailure(
            "OpPrereqError", "Conflicting IP addresses found;  remove/modify the corresponding network interfaces",
            "wrong_state",
        )  # fmt: skip
    cluster.start_running(job, op, network_uuid=net.uuid, group_uuid=group.uuid)
    await cluster.work(job, op, [], cluster.op_time(op))
    if net.name not in group.networks:
        cluster.log(job, op, f"Network '{net.name}' is not mapped to group '{group.name}'")
        return
    if not p.get("dry_run"):
        group.networks.pop(net.name, None)
        group.touch()
        net.touch()


@opcode("OP_NETWORK_REMOVE")
async def network_remove(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    net = cluster.model.network(str(op.luxid.get("network_name")))
    cluster.start_running(job, op, network_uuid=net.uuid)
    if any(net.name in group.networks for group in cluster.model.groups.values()):
        raise OpFailure("OpPrereqError", "Network still connected", "wrong_state")
    await cluster.work(job, op, [], cluster.op_time(op))
    if not op.luxid.get("dry_run"):
        cluster.model.networks.pop(net.name, None)


@opcode("OP_NETWORK_RENAME")
async def network_rename(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    """Ganeti 3.1's ``LUNetworkRename`` (``lib/cmdlib/network.py`` at v3.1.0; only the 3.1 fake
    routes to it): ``ExpandNames`` looks the network up (``Network 'X' not found``),
    ``CheckPrereq`` refuses a name another network has (itself included), ``Exec`` renames it;
    result the new name. Groups' connections and NICs follow (Ganeti keeps them by UUID)."""
    p = op.luxid
    net = cluster.model.network(str(p.get("network_name")))
    new = str(p.get("new_name"))
    cluster.start_running(job, op)
    clash = cluster.model.networks.get(new)
    if clash is not None:
        raise OpFailure(
            "OpPrereqError", f"Desired new name '{new}' clashes with existing network (UUID: {clash.uuid})",
            "already_exists",
        )  # fmt: skip
    await cluster.work(job, op, [], cluster.op_time(op))
    if not p.get("dry_run"):
        old = net.name
        cluster.model.networks[new] = cluster.model.networks.pop(old)
        net.name = new
        for group in cluster.model.groups.values():
            if old in group.networks:
                group.networks[new] = group.networks.pop(old)
        for inst in cluster.instances.values():
            for nic in inst.nics:
                if nic.get("network") == old:
                    nic["network"] = new
        net.touch()
    op.result = new


def nic_mods(
    cluster: FakeCluster, inst: FakeInstance, mods: list[Any]
) -> tuple[list[list[Any]], Callable[[], None], list[list[Any]]]:
    """``LUInstanceSetParams`` NIC changes (``[op, params]`` or ``[op, index, params]``): the result
    lines Ganeti writes and a function applying them. An added NIC on a network takes the mode
    and link the network has in the node's group, and ``ip=pool`` the pool's first free address;
    a removed one gives its address back; an added NIC's ``mac`` is its own (:mod:`._macs`).
    Also the modifications as the executor resolves them
    (``[op, index, params]``, an added NIC's MAC and IP filled in)."""
    nics = [dict(nic) for nic in inst.nics]
    macs = MacReservation(cluster, create=False)
    changes: list[list[Any]] = []
    reserve: list[tuple[FakeNetwork, str]] = []
    release: list[tuple[FakeNetwork, str]] = []
    resolved: list[list[Any]] = []
    for mod in mods:
        if not isinstance(mod, list | tuple) or len(mod) not in (2, 3):
            raise OpFailure("OpPrereqError", f"Invalid NIC modification {mod!r}", "wrong_input")
        action, params = str(mod[0]), dict(mod[-1] or {})
        index = int(mod[1]) if len(mod) == 3 and str(mod[1]).lstrip("-").isdigit() else -1
        if action == "add":
            nic = _new_nic(cluster, inst.pnode, params | {"mac": macs.take(params)}, reserve, None)
            resolved.append([action, index, params | {"ip": nic["ip"], "mac": nic["mac"]}])
            nics.append(nic) if index == -1 else nics.insert(index, nic)
            at = len(nics) - 1 if index == -1 else index
            # _CreateNewNic: "add:mac=%s,ip=%s,mode=%s,link=%s,network=%s" (network None without one)
            desc = f"mac={nic['mac']},ip={nic['ip']},mode={nic['mode']},link={nic['link']},network={nic['network']}"
            changes.append([f"nic.{at}", f"add:{desc}"])
        elif action == "remove":
            if not nics:
                raise OpFailure("OpPrereqError", "Instance has no NICs to remove", "wrong_input")
            at = index if index >= 0 else len(nics) - 1
            nic = nics.pop(at)
            if nic.get("network") and nic.get("ip"):
                release.append((cluster.model.network(str(nic["network"])), str(nic["ip"])))
            changes.append([f"NIC/{at}", "remove"])
            resolved.append([action, index, params])
        else:
            raise OpFailure(
                "OpPrereqError", f"NIC modification '{action}' is not supported by the fake", "wrong_input"
            )

    def commit() -> None:
        for net, ip in release:
            net.pool.release(ip)
        for net, ip in reserve:
            net.pool.reserve(ip)
        inst.nics = nics

    return changes, commit, resolved


def create_nics(
    cluster: FakeCluster,
    pnode: str,
    nics: list[dict[str, Any]],
    plain: Callable[[dict[str, Any]], dict[str, Any]],
) -> list[dict[str, Any]]:
    """A create's NICs: ``plain`` makes one without a network; one on a network takes its
    address (``ip=pool``: the first free one) and its mode and link from the group's connection."""
    reserve: list[tuple[FakeNetwork, str]] = []
    made = [
        _new_nic(cluster, pnode, nic, reserve, index) if nic.get("network") else plain(nic)
        for index, nic in enumerate(nics)
    ]
    for net, ip in reserve:
        net.pool.reserve(ip)
    return made


def release_nics(cluster: FakeCluster, inst: FakeInstance) -> None:
    """A removed instance gives its NICs' addresses back to their networks' pools."""
    for nic in inst.nics:
        net = cluster.model.networks.get(str(nic.get("network")))
        if net is not None and nic.get("ip") and net.pool.is_reserved(str(nic["ip"])):
            net.pool.release(str(nic["ip"]))


def _new_nic(
    cluster: FakeCluster,
    pnode: str,
    params: dict[str, Any],
    reserve: list[tuple[FakeNetwork, str]],
    index: int | None,
) -> dict[str, Any]:
    """A NIC made or added (``index``: its place in a create; None: added by ``LUInstanceSetParams``),
    with Ganeti's refusals of each: ``LUInstanceCreate.CheckPrereq`` and ``_PrepareNicModification``
    word them differently."""
    ip = params.get("ip")
    mac = params.get("mac")
    nic: dict[str, Any] = {"mac": new_mac() if mac in (None, "auto", "generate") else str(mac), "uuid": str(uuid.uuid4()), "name": params.get("name"),
                           "mode": params.get("mode") or "bridged", "link": params.get("link") or cluster.link,
                           "ip": None if ip in (None, "none") else str(ip), "network": None}  # fmt: skip
    if params.get("network"):
        net = cluster.model.network(str(params["network"]))
        group = cluster.model.group_of(pnode)
        if net.name not in group.networks:  # GetGroupNetParams is None
            raise OpFailure(
                "OpPrereqError",
                f"No netparams found for network {net.name}. Probably not connected to node's {pnode} nodegroup"
                if index is not None
                else f"No netparams found for the network {net.name}, probably not connected",
                "wrong_input",
            )
        mode, link, vlan = group.networks[net.name]
        taken = {address for n, address in reserve if n is net}
        if ip == "pool":
            free = [
                str(a) for a in net.pool.network if not net.pool.is_reserved(str(a)) and str(a) not in taken
            ]
            if not free:  # GenerateIp: a ReservationError
                which = f" for NIC {index}" if index is not None else ""
                raise OpFailure(
                    "OpPrereqError", f"Unable to get a free IP{which} from the address pool", "wrong_state"
                )
            nic["ip"] = free[0]
        elif nic["ip"] is not None and (net.pool.is_reserved(nic["ip"]) or nic["ip"] in taken):
            raise OpFailure(
                "OpPrereqError",
                f"IP address {nic['ip']} already in use or does not belong to network {net.name}"
                if index is not None
                else f"IP {nic['ip']} not available in network {net.name}",
                "not_unique",
            )
        if nic["ip"] is not None:
            reserve.append((net, nic["ip"]))
        nic.update(mode=mode, link=link, network=net.name, network_uuid=net.uuid,
                   nicparams={"mode": mode, "link": link, "vlan": vlan})  # fmt: skip
    elif ip == "pool":
        raise OpFailure("OpPrereqError", "if ip=pool, parameter network must be passed too", "wrong_input")
    return nic
