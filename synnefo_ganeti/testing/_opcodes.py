"""Opcode inputs as Ganeti 3.0 writes them into job files, taken from real job files.

An op's ``input`` goes through three forms (see tests/fixtures/ganeti-3.0-queue):

* ``luxid``: as submitted (the queued versions, written by luxid): the generic
  fields first (``dry_run, priority, depends, comment, reason, OP_ID``), then the
  opcode's own, only those RAPI filled in;
* ``waiting``: the same keys, written by the job's executor: own fields first,
  generic fields last;
* ``resolved``: from ``running`` on, the executor adds what it resolved (uuids,
  defaults, ``debug_level``): the full key list of :data:`RESOLVED`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from synnefo_ganeti.testing._versions import VersionProfile

__all__ = ["GENERIC", "LUXID", "RESOLVED", "SURFACE_OPS", "summary"]

GENERIC = ("dry_run", "debug_level", "priority", "depends", "comment", "reason", "OP_ID")

# Each opcode's own fields as luxid writes them for a RAPI submission, with RAPI's defaults.
LUXID: dict[str, dict[str, Any]] = {
    "OP_INSTANCE_CREATE": {
        "instance_name": None, "force_variant": False, "wait_for_sync": True, "name_check": True,
        "ignore_ipolicy": False, "opportunistic_locking": False, "beparams": {}, "disks": [],
        "disk_template": None, "hvparams": {}, "hypervisor": None, "identify_defaults": False,
        "ip_check": True, "conflicts_check": True, "mode": "create", "nics": [{}], "osparams": {},
        "os_type": None, "pnode": None, "source_shutdown_timeout": 120, "compress": "none", "start": True,
        "forthcoming": False, "commit": False, "tags": [], "instance_communication": False,
    },
    "OP_INSTANCE_SHUTDOWN": {
        "instance_name": None, "force": False, "ignore_offline_nodes": False, "timeout": 120,
        "no_remember": False,
    },
    "OP_INSTANCE_STARTUP": {
        "instance_name": None, "force": False, "ignore_offline_nodes": False, "hvparams": {}, "beparams": {},
        "no_remember": False, "startup_paused": False,
    },
    "OP_INSTANCE_REBOOT": {
        "instance_name": None, "ignore_secondaries": False, "reboot_type": "soft", "shutdown_timeout": 120,
    },
    "OP_INSTANCE_REMOVE": {"instance_name": None, "shutdown_timeout": 120, "ignore_failures": False},
    "OP_INSTANCE_SET_PARAMS": {
        "instance_name": None, "force": False, "force_variant": False, "ignore_ipolicy": False, "nics": [],
        "disks": [], "beparams": {}, "hvparams": {}, "ext_params": {}, "osparams": {}, "wait_for_sync": True,
        "conflicts_check": True, "hotplug": False, "hotplug_if_possible": False,
    },
    "OP_INSTANCE_MULTI_ALLOC": {"opportunistic_locking": False, "instances": []},
    "OP_TEST_DELAY": {
        "duration": 0.0, "on_master": True, "on_nodes": [], "repeat": 0, "interruptible": False,
        "no_locks": False,
    },
}  # fmt: skip

# The full input from ``running`` on: key order and defaults as the executor writes them.
RESOLVED: dict[str, dict[str, Any]] = {
    "OP_INSTANCE_CREATE": {
        "instance_name": None, "force_variant": False, "wait_for_sync": True, "name_check": True,
        "ignore_ipolicy": False, "opportunistic_locking": False, "beparams": {}, "disks": [],
        "disk_template": None, "group_name": None, "file_driver": None, "file_storage_dir": None, "hvparams": {},
        "hypervisor": None, "iallocator": None, "identify_defaults": False, "ip_check": True,
        "conflicts_check": True, "mode": "create", "nics": [{}], "no_install": None, "osparams": {},
        "osparams_private": {}, "osparams_secret": {}, "os_type": None, "pnode": None, "pnode_uuid": None,
        "snode": None, "snode_uuid": None, "source_handshake": None, "source_instance_name": None,
        "source_shutdown_timeout": 120, "source_x509_ca": None, "src_node": None, "src_node_uuid": None,
        "src_path": None, "compress": "none", "start": True, "forthcoming": False, "commit": False, "tags": [],
        "instance_communication": False, "helper_startup_timeout": 300, "helper_shutdown_timeout": 7200,
    },
    "OP_INSTANCE_SHUTDOWN": {
        "instance_name": None, "instance_uuid": None, "force": False, "ignore_offline_nodes": False,
        "timeout": 120, "no_remember": False, "admin_state_source": "admin",
    },
    "OP_INSTANCE_STARTUP": {
        "instance_name": None, "instance_uuid": None, "force": False, "ignore_offline_nodes": False,
        "hvparams": {}, "beparams": {}, "no_remember": False, "startup_paused": False, "shutdown_timeout": 120,
    },
    "OP_INSTANCE_REBOOT": {
        "instance_name": None, "instance_uuid": None, "ignore_secondaries": False, "reboot_type": "soft",
        "shutdown_timeout": 120,
    },
    "OP_INSTANCE_REMOVE": {
        "instance_name": None, "instance_uuid": None, "shutdown_timeout": 120, "ignore_failures": False,
    },
    "OP_INSTANCE_SET_PARAMS": {
        "instance_name": None, "instance_uuid": None, "force": False, "force_variant": False,
        "ignore_ipolicy": False, "nics": [], "disks": [], "beparams": {}, "hvparams": {}, "ext_params": {},
        "osparams": {}, "osparams_private": None, "wait_for_sync": True, "offline": None, "conflicts_check": True,
        "hotplug": False, "hotplug_if_possible": False, "instance_communication": None,
    },
    "OP_INSTANCE_MULTI_ALLOC": {"opportunistic_locking": False, "iallocator": None, "instances": []},
    "OP_TEST_DELAY": {
        "duration": 0.0, "on_master": True, "on_nodes": [], "on_node_uuids": [], "repeat": 0,
        "interruptible": False, "no_locks": False,
    },
}  # fmt: skip

_SUMMARY_FIELD = {
    "OP_INSTANCE_CREATE": "instance_name",
    "OP_INSTANCE_SHUTDOWN": "instance_name",
    "OP_INSTANCE_STARTUP": "instance_name",
    "OP_INSTANCE_REBOOT": "instance_name",
    "OP_INSTANCE_REMOVE": "instance_name",
    "OP_INSTANCE_SET_PARAMS": "instance_name",
    "OP_TEST_DELAY": "duration",
}


# Every other opcode, from Ganeti 3.0's own ``opcodes`` module (scripts/gen-fake-opcodes.py):
# its parameters in job-file order with their defaults, and the field its summary names.
_GANETI_OPCODES: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "opcodes.json").read_text())
#: the opcodes of the rest of the RAPI the fake executes (_ops_disks, _ops_groups, _ops_moves,
#: _ops_networks, _ops_nodes, _ops_tags): each has a handler
SURFACE_OPS = (
    "OP_BACKUP_EXPORT", "OP_BACKUP_PREPARE", "OP_CLUSTER_REDIST_CONF", "OP_CLUSTER_SET_PARAMS", "OP_GROUP_ADD",
    "OP_GROUP_ASSIGN_NODES", "OP_GROUP_REMOVE", "OP_GROUP_RENAME", "OP_GROUP_SET_PARAMS",
    "OP_INSTANCE_ACTIVATE_DISKS", "OP_INSTANCE_DEACTIVATE_DISKS", "OP_INSTANCE_FAILOVER", "OP_INSTANCE_GROW_DISK",
    "OP_INSTANCE_MIGRATE", "OP_INSTANCE_QUERY_DATA", "OP_INSTANCE_RECREATE_DISKS", "OP_INSTANCE_REINSTALL",
    "OP_INSTANCE_RENAME", "OP_INSTANCE_REPLACE_DISKS", "OP_NETWORK_ADD", "OP_NETWORK_CONNECT",
    "OP_NETWORK_DISCONNECT", "OP_NETWORK_REMOVE", "OP_NETWORK_SET_PARAMS", "OP_NODE_EVACUATE", "OP_NODE_MIGRATE",
    "OP_NODE_MODIFY_STORAGE", "OP_NODE_POWERCYCLE", "OP_NODE_QUERY_STORAGE", "OP_NODE_SET_PARAMS",
    "OP_REPAIR_NODE_STORAGE", "OP_TAGS_DEL", "OP_TAGS_SET",
)  # fmt: skip
for _op_id in SURFACE_OPS:
    _spec = _GANETI_OPCODES[_op_id]
    if _op_id not in RESOLVED:
        RESOLVED[_op_id] = {name: default for name, default in _spec["params"]}
        # luxid's form lacks what only the executor resolves (uuids) and the private params
        LUXID[_op_id] = {name: default for name, default in _spec["params"]
                         if not name.endswith(("_uuid", "_uuids")) and "private" not in name}  # fmt: skip
        if _spec["summary"]:
            _SUMMARY_FIELD[_op_id] = _spec["summary"]
# Ganeti 3.1's OpNetworkRename (src/Ganeti/OpCodes.hs at v3.1.0: pNetworkName, pNewName, no summary
# field); only the 3.1 fake serves its route (_versions)
LUXID["OP_NETWORK_RENAME"] = {"network_name": None, "new_name": None}
RESOLVED["OP_NETWORK_RENAME"] = {"network_name": None, "new_name": None}
# set-params' resolved form has every parameter, the unset ones null (a real job file: tests/fixtures/
# ganeti-3.0-queue/surface/job-88...): the defaults above, in Ganeti's order
RESOLVED["OP_INSTANCE_SET_PARAMS"] = {
    name: RESOLVED["OP_INSTANCE_SET_PARAMS"].get(name, default)
    for name, default in _GANETI_OPCODES["OP_INSTANCE_SET_PARAMS"]["params"]
}


def summary(op_input: dict[str, Any]) -> str:
    """Ganeti's op summary, as in ``GET /2/jobs/ID``: ``INSTANCE_CREATE(name)``."""
    op_id = str(op_input["OP_ID"])
    name = op_id.removeprefix("OP_")
    field = _SUMMARY_FIELD.get(op_id)
    if field is None or op_input.get(field) is None:
        return name
    return f"{name}({op_input[field]})"


def luxid_input(
    op_id: str, params: dict[str, Any], reason: list[Any], *, dry_run: bool, cli: bool = False,
    version: VersionProfile | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The submitted form: generic fields, then the opcode's own (defaults filled, extras kept).

    A RAPI submission carries no ``debug_level``; a gnt-* command line's does. ``version``: the
    Ganeti whose opcode it is (its defaults, the parameters it lacks left out; default 3.0).
    """
    params = dict(params)
    comment = params.pop("comment", None)
    defaults = LUXID[op_id]
    if version is not None:
        removed = version.removed(op_id)
        defaults = {key: version.defaults(op_id).get(key, default)
                    for key, default in defaults.items() if key not in removed}  # fmt: skip
    own = {key: params.get(key, default) for key, default in defaults.items()}
    own.update({key: value for key, value in params.items() if key not in own})
    own = {key: value for key, value in own.items() if value is not None or key in params}
    head: dict[str, Any] = {"dry_run": dry_run}
    if cli:
        head["debug_level"] = 0
    head |= {"priority": 0, "depends": None, "comment": comment, "reason": reason, "OP_ID": op_id}
    return head | own


def waiting_input(luxid: dict[str, Any]) -> dict[str, Any]:
    """The executor's first write: the same keys, own fields first."""
    own = {key: value for key, value in luxid.items() if key not in GENERIC}
    return own | {key: luxid[key] for key in GENERIC if key in luxid}


def rapi_input(current: dict[str, Any]) -> dict[str, Any]:
    """An op as ``GET /2/jobs/ID`` shows it: luxid re-serialises the opcode, generic fields
    first and optional fields that are unset (``null``) left out."""
    # a GET resource's op (``/2/instances/NAME/info``) has no dry_run: left out, as unset
    head = {
        key: current[key]
        for key in GENERIC
        if key in current and (key != "dry_run" or current[key] is not None)
    }
    return head | {key: value for key, value in current.items() if key not in GENERIC and value is not None}


def resolved_input(luxid: dict[str, Any], resolved: dict[str, Any]) -> dict[str, Any]:
    """From ``running`` on: the full key list, resolved values, ``debug_level`` among the generic fields.

    A parameter every submitted form carries (it has a default, :data:`LUXID`) but this one lacks
    is one this op's Ganeti version does not have (3.1's set-params: ``hotplug_if_possible``):
    left out here too.
    """
    op_id = str(luxid["OP_ID"])
    submitted = LUXID.get(op_id, {})
    template = {key: default for key, default in RESOLVED[op_id].items()
                if key in luxid or submitted.get(key) is None}  # fmt: skip
    own = {key: resolved.get(key, luxid.get(key, default)) for key, default in template.items()}
    own.update({key: value for key, value in luxid.items() if key not in own and key not in GENERIC})
    tail = {
        "dry_run": luxid["dry_run"],
        "debug_level": 0,
        "priority": luxid["priority"],
        "depends": luxid["depends"],
        "comment": luxid["comment"],
        "reason": luxid["reason"],
        "OP_ID": op_id,
    }
    return own | tail
