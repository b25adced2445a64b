"""RAPI views of groups, networks, filters, an instance's console and its detailed info.

Keys and their order are ``rlib2``'s (``G_FIELDS``, ``NET_FIELDS``, ``FILTER_RULE_FIELDS``);
the values Ganeti computes from its defaults (a group's ipolicy, diskparams, ndparams)
start from the answer recorded from Ganeti 3.0 (data/group.json).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from synnefo_ganeti.testing._model import FakeFilter, FakeGroup, FakeNetwork

if TYPE_CHECKING:
    from synnefo_ganeti.testing._cluster import FakeInstance
    from synnefo_ganeti.testing._engine import FakeCluster

__all__ = ["console_view", "filter_view", "group_view", "instance_info", "network_view"]

_GROUP: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "group.json").read_text())


def _merged(base: dict[str, Any], custom: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in custom.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def group_view(cluster: FakeCluster, group: FakeGroup) -> dict[str, Any]:
    """``GET /2/groups/NAME``: ``G_FIELDS``; the filled params are the cluster's with the group's own on top."""
    nodes = sorted(node for node, name in cluster.model.node_group.items() if name == group.name)
    low = {key: bounds[0] for key, bounds in cluster.ipolicy.items()}
    high = {key: bounds[1] for key, bounds in cluster.ipolicy.items()}
    ipolicy = dict(_GROUP["ipolicy"], minmax=[{"min": low, "max": high}], **{"disk-templates": list(cluster.disk_templates)})  # fmt: skip
    return {
        "alloc_policy": group.alloc_policy,
        "name": group.name,
        "node_cnt": len(nodes),
        "node_list": nodes,
        "ipolicy": _merged(ipolicy, group.ipolicy),
        "custom_ipolicy": copy.deepcopy(group.ipolicy),
        "diskparams": _merged(_GROUP["diskparams"], group.diskparams),
        "custom_diskparams": copy.deepcopy(group.diskparams),
        "ndparams": _merged(_GROUP["ndparams"], group.ndparams),
        "custom_ndparams": copy.deepcopy(group.ndparams),
        "ctime": group.ctime,
        "mtime": group.mtime,
        "uuid": group.uuid,
        "serial_no": group.serial_no,
        "tags": list(group.tags),
    }


def network_instances(cluster: FakeCluster, net: FakeNetwork) -> list[str]:
    return sorted(
        inst.name
        for inst in cluster.instances.values()
        if any(nic.get("network") == net.name for nic in inst.nics)
    )


def network_view(cluster: FakeCluster, net: FakeNetwork) -> dict[str, Any]:
    """``GET /2/networks/NAME``: ``NET_FIELDS``."""
    groups = [[group.name, *group.networks[net.name]] for group in cluster.model.groups.values()
              if net.name in group.networks]  # fmt: skip
    return {
        "name": net.name,
        "network": net.network,
        "gateway": net.gateway,
        "network6": net.network6,
        "gateway6": net.gateway6,
        "mac_prefix": net.mac_prefix,
        "free_count": net.pool.free_count,
        "reserved_count": net.pool.reserved_count,
        "map": net.pool.map,
        "group_list": groups,
        "inst_list": network_instances(cluster, net),
        "external_reservations": ", ".join(net.pool.external()),
        "ctime": net.ctime,
        "mtime": net.mtime,
        "uuid": net.uuid,
        "serial_no": net.serial_no,
        "tags": list(net.tags),
    }


def filter_view(rule: FakeFilter) -> dict[str, Any]:
    """``GET /2/filters/UUID``: ``FILTER_RULE_FIELDS``."""
    return {
        "watermark": rule.watermark,
        "priority": rule.priority,
        "predicates": rule.predicates,
        "action": rule.action,
        "reason_trail": rule.reason_trail,
        "uuid": rule.uuid,
    }


def console_view(inst: FakeInstance) -> dict[str, Any]:
    """``GET /2/instances/NAME/console``: the fake hypervisor's ``InstanceConsole`` (a message)."""
    return {"instance": inst.name, "kind": "msg", "message": "Console not available for fake hypervisor"}


def _disk_info(cluster: FakeCluster, inst: FakeInstance, index: int, disk: dict[str, Any]) -> dict[str, Any]:
    path = f"/srv/ganeti/file-storage/{inst.name}/{disk['uuid']}.file.disk{index}"
    return {
        "iv_name": f"disk/{index}", "dev_type": inst.disk_template,
        "logical_id": ["loop", path] if inst.disk_template == "file" else None,
        "drbd_info": None, "pstatus": None, "sstatus": None, "children": [], "mode": disk.get("mode", "rw"),
        "size": int(disk["size"]), "spindles": None, "name": disk.get("name"), "uuid": disk["uuid"],
    }  # fmt: skip


def _nic_info(cluster: FakeCluster, nic: dict[str, Any]) -> list[Any]:
    net = cluster.model.networks.get(str(nic.get("network"))) if nic.get("network") else None
    net_info = None
    if net is not None:
        net_info = {
            "name": net.name, "serial_no": net.serial_no, "network": net.network, "gateway": net.gateway,
            "reservations": "".join("1" if b else "0" for b in net.pool.reservations),
            "ext_reservations": "".join("1" if b else "0" for b in net.pool.ext_reservations),
            "ctime": net.ctime, "mtime": net.mtime, "uuid": net.uuid, "tags": list(net.tags),
        }  # fmt: skip
    return [nic.get("name"), nic["uuid"], nic.get("ip"), nic["mac"], nic.get("mode", "bridged"),
            nic.get("link", cluster.link), nic.get("vlan", ""), net.uuid if net else None, net_info]  # fmt: skip


def instance_info(cluster: FakeCluster, inst: FakeInstance, *, static: bool) -> dict[str, Any]:
    """The result of ``OP_INSTANCE_QUERY_DATA`` for one instance (``cmdlib.instance_query``)."""
    group = cluster.model.group_of(inst.pnode)
    run_state = None if static else ("up" if inst.oper_state else "down")
    be_actual = {"always_failover": False, "auto_balance": True, "maxmem": inst.memory,
                 "minmem": int(inst.beparams.get("minmem", inst.memory)), "spindle_use": 1,
                 "vcpus": int(inst.beparams.get("vcpus", 1))}  # fmt: skip
    return {
        "name": inst.name, "config_state": inst.admin_state, "run_state": run_state, "pnode": inst.pnode,
        "pnode_group_uuid": group.uuid, "pnode_group_name": group.name, "snodes": [], "snodes_group_uuids": [],
        "snodes_group_names": [], "os": inst.os, "nics": [_nic_info(cluster, nic) for nic in inst.nics],
        "disk_template": inst.disk_template,
        "disks": [_disk_info(cluster, inst, i, d) for i, d in enumerate(inst.disks)],
        "hypervisor": inst.hypervisor, "network_port": None, "hv_instance": dict(inst.hvparams),
        "hv_actual": dict(inst.hvparams), "be_instance": dict(inst.custom_beparams), "be_actual": be_actual,
        "os_instance": {}, "os_actual": {}, "serial_no": inst.serial_no, "mtime": inst.mtime,
        "ctime": inst.ctime, "uuid": inst.uuid,
    }  # fmt: skip
