"""Synnefo's snf-dispatcher message parsing, ported (test helper), to check our eventd messages.

Only what decides how a message is parsed, taken from grnet/synnefo v0.21 (commit d06ec8c78);
the database writes are left out and what the handler would write is returned instead:

* routing: ``snf-cyclades-app/synnefo/logic/queues.py`` (``BINDINGS``: ``KEY_OP`` ->
  ``update_db``, ``KEY_NETWORK`` -> ``update_network``, ``KEY_CLUSTER`` -> ``update_cluster``;
  the prefix is ``BACKEND_PREFIX_ID.split('-')[0]``) and ``dispatcher.py``
  ``handle_request`` (the ``eventd.heartbeat`` reply: ``json.loads(body)["cluster"]``);
* ``callbacks.py``: ``handle_message_delivery`` (``json.loads``; ``ValueError`` and
  ``KeyError`` nack, anything else rejects, else ack), ``instance_from_msg`` /
  ``network_from_msg`` (the id from the name; an unknown name is ignored, acked),
  ``if_update_required`` (``merge_time(msg['event_time'])``, a bad time is a ``KeyError``),
  ``update_db``, ``update_network``, ``update_cluster`` (their field reads);
* ``backend.py``: ``process_op_status`` / ``process_network_status`` (a status not in
  ``BACKEND_STATUSES`` raises), ``parse_instance_nics``, ``parse_instance_disks``,
  ``update_hvparams`` (their reads of ``instance_nics``, ``instance_disks``,
  ``instance_hvparams``);
* ``synnefo/lib/utils.py`` ``merge_time``; ``logic/utils.py`` ``id_from_instance_name``,
  ``id_from_network_name``, ``id_from_nic_name``, ``id_from_disk_name``.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from typing import Any

BACKEND_PREFIX_ID = "snf-"
PREFIX = BACKEND_PREFIX_ID.split("-")[0]
KEY_OP = f"ganeti.{PREFIX}.event.op"
KEY_NETWORK = f"ganeti.{PREFIX}.event.network"
KEY_CLUSTER = "ganeti.event.cluster"
EVENTD_HEARTBEAT_ROUTING_KEY = "eventd.heartbeat"
#: models.py BACKEND_STATUSES
BACKEND_STATUSES = ("queued", "waiting", "canceling", "running", "canceled", "success", "error")
JOB_STATUS_FINALIZED = frozenset({"canceled", "success", "error"})
UNKNOWN_NIC_PREFIX = "unknown-nic-"
UNKNOWN_DISK_PREFIX = "unknown-disk-"


class InvalidBackendIdError(ValueError):
    """VirtualMachine / Network ``InvalidBackendIdError`` (a name Cyclades did not make)."""


class InvalidBackendMsgError(Exception):
    """VirtualMachine / Network ``InvalidBackendMsgError``."""


@dataclass
class Delivery:
    """What the dispatcher did with one message: ``ack``, ``nack`` or ``reject``, and what it read."""

    outcome: str = "ack"
    handler: str | None = None
    ignored: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)


def merge_time(timetuple: Any) -> datetime.datetime:
    """synnefo/lib/utils.py ``merge_time``."""
    (seconds, microseconds) = timetuple
    assert seconds >= 0, f"Seconds must be larger than or equal to 0, but are {seconds}"
    assert 0 <= microseconds <= 999999, f"Microseconds must be 0-999999, but are {microseconds}"
    return datetime.datetime.fromtimestamp(float(seconds) + float(microseconds) * 0.000001)


def _id_from(name: Any, infix: str) -> int:
    """logic/utils.py ``id_from_instance_name`` (infix ``""``), ``id_from_network_name`` (``net-``),
    ``id_from_nic_name`` (``nic-``), ``id_from_disk_name`` (``vol-``)."""
    sname = str(name)
    if not sname.startswith(BACKEND_PREFIX_ID):
        raise InvalidBackendIdError(sname)
    ns = sname.replace(BACKEND_PREFIX_ID + infix, "", 1)
    if not ns.isdigit():
        raise InvalidBackendIdError(sname)
    return int(ns)


def handler_for(routing_key: str) -> str | None:
    """queues.py ``BINDINGS`` (topic keys without wildcards: an exact match)."""
    return {
        KEY_OP: "update_db",
        KEY_NETWORK: "update_network",
        KEY_CLUSTER: "update_cluster",
        EVENTD_HEARTBEAT_ROUTING_KEY: "heartbeat",
    }.get(routing_key)


def deliver(routing_key: str, body: bytes) -> Delivery:
    """callbacks.py ``handle_message_delivery`` around the handler the key is bound to."""
    delivery = Delivery(handler=handler_for(routing_key))
    if delivery.handler is None:
        delivery.ignored = "no binding"
        return delivery
    try:
        msg = json.loads(body)
        {
            "update_db": _update_db,
            "update_network": _update_network,
            "update_cluster": _update_cluster,
            "heartbeat": _heartbeat,
        }[delivery.handler](msg, delivery)
    except ValueError:  # json errors, and InvalidBackendIdError outside the decorators
        delivery.outcome = "nack"
    except KeyError:
        delivery.outcome = "nack"
    except Exception:
        delivery.outcome = "reject"
    return delivery


def _event_time(msg: dict[str, Any]) -> datetime.datetime:
    """callbacks.py ``if_update_required``: a malformed time raises ``KeyError``."""
    try:
        return merge_time(msg["event_time"])
    except Exception:
        raise KeyError("event_time") from None


def _parse_nics(nics: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """backend.py ``parse_instance_nics`` (without the Network row: its id instead)."""
    parsed: dict[Any, dict[str, Any]] = {}
    for index, gnic in enumerate(nics):
        name = gnic.get("name", None)
        nic_id: Any = _id_from(name, "nic-") if name is not None else UNKNOWN_NIC_PREFIX + str(index)
        network_id = _id_from(gnic.get("network", ""), "net-")
        parsed[nic_id] = {
            "index": index,
            "network": network_id,
            "mac": gnic.get("mac"),
            "ipv4_address": gnic.get("ip"),
            "firewall": gnic.get("firewall"),
        }
    return parsed


def _parse_disks(disks: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """backend.py ``parse_instance_disks``."""
    parsed: dict[Any, dict[str, Any]] = {}
    for index, gdisk in enumerate(disks):
        name = gdisk.get("name", None)
        disk_id: Any = _id_from(name, "vol-") if name is not None else UNKNOWN_DISK_PREFIX + str(index)
        parsed[disk_id] = {"index": index, "size": gdisk["size"] >> 10, "uuid": gdisk["uuid"]}
    return parsed


def _update_db(msg: dict[str, Any], delivery: Delivery) -> None:
    """callbacks.py ``instance_from_msg`` + ``if_update_required`` + ``update_db`` +
    backend.py ``process_op_status`` (its reads)."""
    try:
        vm_id = _id_from(msg["instance"], "")
    except InvalidBackendIdError:
        delivery.ignored = "unknown instance"
        return
    event_time = _event_time(msg)
    if msg["type"] != "ganeti-op-status":
        delivery.ignored = "unknown type"
        return
    fields = {
        "vm_id": vm_id,
        "event_time": event_time,
        "operation": msg["operation"],
        "status": msg["status"],
        "jobId": msg["jobId"],
        "logmsg": msg["logmsg"],
        "nics": msg.get("instance_nics"),
        "disks": msg.get("instance_disks"),
        "hvparams": msg.get("instance_hvparams"),
        "job_fields": msg.get("job_fields", {}),
        "result": msg.get("result", []),
        "tags": msg.get("tags"),
    }
    if fields["status"] not in BACKEND_STATUSES:
        raise InvalidBackendMsgError(fields["operation"], fields["status"])
    job_fields = fields["job_fields"]
    if (
        fields["operation"] == "OP_INSTANCE_CREATE"
        and fields["status"] == "error"
        and job_fields.get("opportunistic_locking", False)
    ):
        try:
            fields["error_code"] = fields["result"][1][1]
        except IndexError:
            fields["error_code"] = None
    if fields["status"] in JOB_STATUS_FINALIZED:
        try:
            if fields["nics"] is not None:
                fields["parsed_nics"] = _parse_nics(fields["nics"])
            if fields["disks"] is not None:
                fields["parsed_disks"] = _parse_disks(fields["disks"])
        except InvalidBackendIdError:  # instance_from_msg: Network.InvalidBackendIdError is logged
            delivery.ignored = "unknown network"
            return
        if fields["hvparams"] is not None:  # update_hvparams
            fields["parsed_hvparams"] = (
                fields["hvparams"]["boot_order"],
                fields["hvparams"]["cdrom_image_path"],
            )
    delivery.fields = fields


def _update_network(msg: dict[str, Any], delivery: Delivery) -> None:
    """callbacks.py ``network_from_msg`` + ``if_update_required`` + ``update_network``."""
    try:
        network_id = _id_from(msg["network"], "net-")
    except InvalidBackendIdError:
        delivery.ignored = "unknown network"
        return
    cluster = msg["cluster"]
    event_time = _event_time(msg)
    if msg["type"] != "ganeti-network-status":
        delivery.ignored = "unknown type"
        return
    fields = {
        "network_id": network_id,
        "cluster": cluster,
        "event_time": event_time,
        "operation": msg["operation"],
        "status": msg["status"],
        "jobId": msg["jobId"],
        "job_fields": msg.get("job_fields", {}),
    }
    if fields["operation"] != "OP_NETWORK_SET_PARAMS":
        fields["logmsg"] = msg["logmsg"]
        if fields["status"] not in BACKEND_STATUSES:  # process_network_status
            raise InvalidBackendMsgError(fields["operation"], fields["status"])
    delivery.fields = fields


def _update_cluster(msg: dict[str, Any], delivery: Delivery) -> None:
    """callbacks.py ``update_cluster``."""
    delivery.fields = {"operation": msg.get("operation"), "cluster": msg.get("cluster")}
    if delivery.fields["cluster"] is None or delivery.fields["operation"] != "OP_CLUSTER_SET_PARAMS":
        delivery.ignored = "not a cluster modification"


def _heartbeat(msg: dict[str, Any], delivery: Delivery) -> None:
    """dispatcher.py ``handle_request``: the heartbeat's ``cluster``."""
    delivery.fields = {"cluster": msg["cluster"]}
