"""Synnefo's ``snf-ganeti-eventd`` messages, from two versions of a Ganeti job file.

Pure code (no I/O): the caller reads the job file, keeps the version it saw last, asks the
RAPI for an instance's NICs, disks and hvparams where :func:`instances_needing_info` says a
message carries them, and publishes what :func:`eventd_messages` returns. Each message is a
``(routing_key, body)`` pair; the body is what eventd passes to ``json.dumps``.

Ported from grnet/synnefo v0.21 (commit d06ec8c78, "Update python version files to 0.21"),
``snf-cyclades-gtools/synnefo/ganeti/eventd.py``:

* ``JobFileHandler.process_IN_MOVED_TO``: one message per op, by the second word of its
  ``OP_ID`` (``INSTANCE``, ``NETWORK``, ``CLUSTER``, ``TAGS``; any other op, such as
  ``OP_TEST_DELAY``, sends nothing). Every message then gets ``event_time``, ``operation``
  (the ``OP_ID``), ``status`` (the op's status, Ganeti's string), ``cluster`` (the cluster's
  name, an argument here as eventd reads it from ssconf), ``logmsg`` (``op.log[-1][-1]``: the
  text of the op's last log entry, ``None`` without one), ``result`` (the op's raw result)
  and ``jobId`` (an int). A failed ``OP_INSTANCE_CREATE`` has its whole opcode input as
  ``job_fields`` (``op.Serialize()["input"]``, ``OP_ID`` included), so Cyclades can retry it.
* ``get_time_from_status``: ``event_time`` is ``[seconds, microseconds]`` as Ganeti stores
  timestamps: queued, the job's received time; waiting or canceling, the op's start; running,
  its exec time; final, its end; each but the first falling back to the job's end.
* ``process_instance_op``: ``{"type": "ganeti-op-status", "instance", "operation",
  "job_fields", "tags"}`` on ``ganeti.<prefix>.event.op``, the prefix being the instance
  name up to its first ``-`` (``prefix_from_name``). The instance is ``instance_name``, or
  the one name in ``instances`` (``OP_INSTANCE_QUERY_DATA``); none or several: no message.
  ``tags`` is the opcode's ``tags`` or ``[]``. ``job_fields``: for set-params and create,
  the op's ``nics``, ``disks``, ``hvparams`` and ``beparams``; for ``OP_INSTANCE_SNAPSHOT``,
  its ``disks`` with the first reason's text as the first disk's ``snapshot_info`` (when the
  first reason entry comes from ``gnt:user``); else ``{}``. A successful create or startup,
  or a set-params or grow-disk that succeeded or failed, carries ``instance_nics``,
  ``instance_disks`` and ``instance_hvparams`` (``get_instance_info``, see
  :class:`InstanceInfo`).
* ``process_network_op``: ``{"operation", "type": "ganeti-network-status", "network",
  "job_fields"}`` on ``ganeti.<prefix>.event.network``, ``job_fields`` holding ``subnet``
  (the op's ``network``), ``gateway``, ``add_reserved_ips``, ``remove_reserved_ips`` and
  ``group_name``; an op without ``network_name`` sends nothing.
* ``process_cluster_op``: only ``OP_CLUSTER_SET_PARAMS``, ``{"operation", "type":
  "ganeti-cluster-status"}`` on ``ganeti.event.cluster``.
* ``process_tag_op``: on an instance, once finished, ``{"type": "ganeti-op-status",
  "instance": name, "tags", "job_fields": {"dry_run"}}`` on the instance's op key; on the
  cluster, a dry-run ``OP_TAGS_SET`` whose first tag starts with ``snf:eventd:heartbeat``,
  when waiting, answers ``{"type": "eventd-heartbeat", "cluster"}`` on ``eventd.heartbeat``
  (snf-dispatcher's status check).

Where this differs from eventd, on purpose (issue 32 item 2):

* Each op's status change gives one message, the first time it is seen, not one per file
  write: eventd publishes every op of a job on each write, so a job's queued ops were sent
  three times and a running op once per log line. The message of a status carries the log's
  last line at the time the status was seen; later lines of the same status are not sent.
  The ops whose status changed in one version come in the order :func:`job_events` gives
  (time order), not in op order.
* Where eventd crashes on a file, the op sends nothing here and the other ops are unaffected
  (eventd lost the rest of the file): an ``OP_INSTANCE_MULTI_ALLOC`` of one instance
  (``instances`` holds an opcode, not a name; the child create jobs carry each instance), a
  tag op without ``kind`` or ``tags`` (``OP_TAGS_SEARCH``, ``OP_TAGS_GET``).
* eventd's enrichment and instance tag messages test for ``"cancelled"``, a status Ganeti
  never writes (it writes ``canceled``): a canceled op gets no ``instance_*`` fields and a
  canceled instance tag op no message. That is kept, so Cyclades sees what it saw before.
* Temp files (``*.tmp``, ``*.new``) and the master check are the caller's: this module only
  sees parsed ``job-N`` versions (:func:`~synnefo_ganeti.jobs.parse_job_file`).
* A message needing instance info that the caller could not get (the instance is gone) is
  sent without the three ``instance_*`` keys; Cyclades' ``update_db`` then leaves the NICs,
  disks and hvparams alone. eventd sent nothing for that op: luxid's ``OpPrereqError`` sent
  ``get_instance_info`` to config.data, whose instances are keyed by uuid, and the
  ``KeyError`` was swallowed by ``process_IN_MOVED_TO``'s ``except KeyError``
  (tests/unit/test_eventd_vs_synnefo.py).
* A log entry whose message is not a string (Ganeti's remote-import entries) is given as
  the JSON text :func:`~synnefo_ganeti.jobs.parse_job_file` makes of it, not the object.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from synnefo_ganeti.jobs import EventKind, JobFile, JobStatus, OpState, job_events

if TYPE_CHECKING:
    from synnefo_ganeti.jobs import JobSummary
    from synnefo_ganeti.rapi import Instance

__all__ = [
    "HEARTBEAT_ROUTING_KEY",
    "EventdMessage",
    "InstanceInfo",
    "eventd_messages",
    "eventd_time",
    "instances_needing_info",
    "needs_instance_info",
]

log = logging.getLogger(__name__)

HEARTBEAT_ROUTING_KEY = "eventd.heartbeat"
CLUSTER_ROUTING_KEY = "ganeti.event.cluster"
HEARTBEAT_TAG_PREFIX = "snf:eventd:heartbeat"

#: eventd's ``["success", "error", "cancelled"]``: "cancelled" is no Ganeti status
_EVENTD_FINISHED = frozenset({JobStatus.SUCCESS, JobStatus.ERROR})
_WITH_JOB_FIELDS = frozenset({"OP_INSTANCE_SET_PARAMS", "OP_INSTANCE_CREATE"})


class EventdMessage(NamedTuple):
    """One message as eventd publishes it: its routing key and its JSON body."""

    routing_key: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """An instance's NICs, disks and hvparams, shaped as eventd's ``get_instance_info`` does.

    eventd asks luxid for ``nic.names``, ``nic.networks.names``, ``nic.ips``, ``nic.macs``,
    ``nic.modes``, ``nic.links``, ``nic.uuids``, ``tags``, ``disk.names``, ``disk.sizes``,
    ``disk.uuids``, ``hv/boot_order`` and ``hv/cdrom_image_path``; ``GET /2/instances/NAME``
    answers the same fields (the hvparams as one filled dict). Each NIC is ``{"name",
    "network", "ip", "mac", "mode", "link", "uuid"}``, plus ``firewall`` from an instance tag
    ``synnefo:network:<nic name>:<mode>``; each disk ``{"name", "size", "uuid"}`` (MiB).
    eventd's other branch (reading config.data on a node that is not the master) is not
    ported: only the master publishes.
    """

    nics: tuple[dict[str, Any], ...]
    disks: tuple[dict[str, Any], ...]
    hvparams: dict[str, Any]

    @classmethod
    def from_rapi(cls, instance: Mapping[str, Any] | Instance) -> InstanceInfo:
        """From ``GET /2/instances/NAME``: the raw dict, or the client's ``Instance`` (its
        extras hold ``nic.names``, ``nic.uuids`` and ``disk.names``)."""
        data: Mapping[str, Any] = (
            instance if isinstance(instance, Mapping) else instance.model_dump(by_alias=True)
        )

        def column(key: str) -> list[Any]:
            return list(data.get(key) or [])

        nic_keys = ("name", "network", "ip", "mac", "mode", "link", "uuid")
        nic_columns = [
            column(key)
            for key in (
                "nic.names",
                "nic.networks.names",
                "nic.ips",
                "nic.macs",
                "nic.modes",
                "nic.links",
                "nic.uuids",
            )
        ]
        nics = [dict(zip(nic_keys, row, strict=False)) for row in zip(*nic_columns, strict=False)]
        disk_columns = [column(key) for key in ("disk.names", "disk.sizes", "disk.uuids")]
        disks = [
            dict(zip(("name", "size", "uuid"), row, strict=False)) for row in zip(*disk_columns, strict=False)
        ]
        hv = data.get("hvparams") or {}
        hvparams = {"boot_order": hv.get("boot_order"), "cdrom_image_path": hv.get("cdrom_image_path")}
        for tag in column("tags"):
            parts = str(tag).split(":")
            if parts[0:2] != ["synnefo", "network"]:
                continue
            if len(parts) != 4:
                log.warning(
                    "instance %s: malformed synnefo tag %r (eventd: synnefo:network:NIC:MODE)",
                    data.get("name"),
                    tag,
                )
                continue
            for nic in nics:
                if nic["name"] == parts[2]:
                    nic.setdefault("firewall", parts[3])
        return cls(nics=tuple(nics), disks=tuple(disks), hvparams=hvparams)


def eventd_time(seconds: float | None) -> list[int] | None:
    """A time as eventd sends it: Ganeti's ``[seconds, microseconds]``.

    The parser keeps times as floats; ``seconds + usec / 1e6`` is within a quarter of a
    microsecond of the exact value up to 2**32 s (year 2106), so rounding the fraction gives
    back Ganeti's two integers exactly (tests check it on every recorded timestamp).
    """
    if seconds is None:
        return None
    whole = math.floor(seconds)
    micro = round((seconds - whole) * 1_000_000)
    if micro == 1_000_000:
        whole, micro = whole + 1, 0
    return [int(whole), micro]


def _prefix(name: str) -> str:
    """eventd's ``prefix_from_name``."""
    return name.split("-")[0]


def _event_time(op: OpState, job: JobFile) -> list[int] | None:
    """eventd's ``get_time_from_status``."""
    if op.status is JobStatus.QUEUED:
        return eventd_time(job.received_time)
    if op.status in (JobStatus.WAITING, JobStatus.CANCELING):
        time = op.start_time
    elif op.status is JobStatus.RUNNING:
        time = op.exec_time
    else:
        time = op.end_time
    return eventd_time(time if time is not None else job.end_time)


def _op_instance(op: OpState) -> str | None:
    """The instance of ``process_instance_op``: ``instance_name``, or ``instances`` of one name."""
    name = op.input.get("instance_name")
    if name:
        return str(name)
    instances = op.input.get("instances")
    if isinstance(instances, list) and len(instances) == 1 and isinstance(instances[0], str) and instances[0]:
        return instances[0]
    return None


def needs_instance_info(op: OpState) -> bool:
    """True when eventd's message for this op (in its current status) carries ``instance_nics``,
    ``instance_disks`` and ``instance_hvparams``: a successful create or startup, a set-params or
    grow-disk that succeeded or failed."""
    if _op_instance(op) is None:
        return False
    if op.op_id in ("OP_INSTANCE_CREATE", "OP_INSTANCE_STARTUP"):
        return op.status is JobStatus.SUCCESS
    if op.op_id in ("OP_INSTANCE_SET_PARAMS", "OP_INSTANCE_GROW_DISK"):
        return op.status in _EVENTD_FINISHED
    return False


def _changed_ops(previous: JobFile | JobSummary | None, current: JobFile) -> list[OpState]:
    """The ops whose status changed since ``previous``, in :func:`job_events` order."""
    return [
        current.ops[event.op_index]
        for event in job_events(previous, current)
        if event.kind is EventKind.OP_STATUS and event.op_index is not None
    ]


def instances_needing_info(previous: JobFile | JobSummary | None, current: JobFile) -> list[str]:
    """The instances whose info :func:`eventd_messages` wants for this step, each once."""
    names: list[str] = []
    for op in _changed_ops(previous, current):
        name = _op_instance(op)
        if name is not None and needs_instance_info(op) and name not in names:
            names.append(name)
    return names


def _snapshot_fields(op: OpState) -> dict[str, Any]:
    disks = copy.deepcopy(op.input.get("disks"))
    if not disks:
        return {}
    try:
        reason = op.input["reason"][0]
        if reason[0] != "gnt:user":
            raise ValueError(reason[0])
        disks[0][1]["snapshot_info"] = reason[1]
    except Exception:  # eventd: a bare except, then a warning
        log.warning("Malformed snapshot job '%s'", op.input.get("reason"))
    return {"disks": disks}


def _instance_message(op: OpState, info: Mapping[str, InstanceInfo] | None) -> EventdMessage | None:
    """eventd's ``process_instance_op``."""
    name = _op_instance(op)
    if name is None:
        return None
    job_fields: dict[str, Any] = {}
    if op.op_id in _WITH_JOB_FIELDS:
        job_fields = {key: op.input.get(key) for key in ("nics", "disks", "hvparams", "beparams")}
    elif op.op_id == "OP_INSTANCE_SNAPSHOT":
        job_fields = _snapshot_fields(op)
    body: dict[str, Any] = {
        "type": "ganeti-op-status",
        "instance": name,
        "operation": op.op_id,
        "job_fields": job_fields,
        "tags": op.input.get("tags") or [],
    }
    found = info.get(name) if info is not None else None
    if needs_instance_info(op) and found is not None:
        body["instance_nics"] = [dict(nic) for nic in found.nics]
        body["instance_disks"] = [dict(disk) for disk in found.disks]
        body["instance_hvparams"] = dict(found.hvparams)
    return EventdMessage(f"ganeti.{_prefix(name)}.event.op", body)


def _network_message(op: OpState) -> EventdMessage | None:
    """eventd's ``process_network_op``."""
    name = op.input.get("network_name")
    if not name:
        return None
    get = op.input.get
    job_fields = {
        "subnet": get("network"),
        "gateway": get("gateway"),
        "add_reserved_ips": get("add_reserved_ips"),
        "remove_reserved_ips": get("remove_reserved_ips"),
        "group_name": get("group_name"),
    }
    body = {"operation": op.op_id, "type": "ganeti-network-status", "network": name, "job_fields": job_fields}
    return EventdMessage(f"ganeti.{_prefix(str(name))}.event.network", body)


def _cluster_message(op: OpState) -> EventdMessage | None:
    """eventd's ``process_cluster_op``: cluster modifications only."""
    if op.op_id != "OP_CLUSTER_SET_PARAMS":
        return None
    return EventdMessage(CLUSTER_ROUTING_KEY, {"operation": op.op_id, "type": "ganeti-cluster-status"})


def _tag_message(op: OpState, cluster: str) -> EventdMessage | None:
    """eventd's ``process_tag_op``: the heartbeat, and finished instance tag ops."""
    kind = op.input.get("kind")
    tags = op.input.get("tags")
    if kind is None or "tags" not in op.input:  # eventd: AttributeError, the file is lost
        return None
    dry_run = op.input.get("dry_run")
    if kind == "cluster":
        if (
            op.op_id == "OP_TAGS_SET"
            and op.status is JobStatus.WAITING
            and tags
            and dry_run
            and str(tags[0]).startswith(HEARTBEAT_TAG_PREFIX)
        ):
            return EventdMessage(HEARTBEAT_ROUTING_KEY, {"type": "eventd-heartbeat", "cluster": cluster})
        return None
    if kind == "instance" and op.status in _EVENTD_FINISHED:
        name = op.input.get("name")
        if not isinstance(name, str):  # eventd: input.name, an AttributeError
            return None
        body = {
            "type": "ganeti-op-status",
            "instance": name,
            "tags": tags,
            "job_fields": {"dry_run": dry_run},
        }
        return EventdMessage(f"ganeti.{_prefix(name)}.event.op", body)
    return None


def _message(
    op: OpState, job: JobFile, cluster: str, info: Mapping[str, InstanceInfo] | None
) -> EventdMessage | None:
    """eventd's ``process_IN_MOVED_TO`` for one op: the handler, then the shared fields."""
    words = op.op_id.split("_")
    kind = words[1] if len(words) > 1 else ""
    message: EventdMessage | None
    if kind == "INSTANCE":
        message = _instance_message(op, info)
    elif kind == "NETWORK":
        message = _network_message(op)
    elif kind == "CLUSTER":
        message = _cluster_message(op)
    elif kind == "TAGS":
        message = _tag_message(op, cluster)
    else:
        return None
    if message is None:
        return None
    body = message.body
    body.update(
        {
            "event_time": _event_time(op, job),
            "operation": op.op_id,
            "status": op.status.value,
            "cluster": cluster,
            "logmsg": op.log[-1].message if op.log else None,
            "result": op.result,
            "jobId": job.job_id,
        }
    )
    if op.op_id == "OP_INSTANCE_CREATE" and op.status is JobStatus.ERROR:
        body["job_fields"] = copy.deepcopy(op.input)
    return message


def eventd_messages(
    previous: JobFile | JobSummary | None,
    current: JobFile,
    *,
    cluster: str,
    instance_info: Mapping[str, InstanceInfo] | None = None,
) -> list[EventdMessage]:
    """The messages eventd would publish for the ops whose status changed from ``previous``
    (``None``: the job was never seen) to ``current``, each change once.

    ``cluster`` is the cluster's name (eventd's ssconf ``cluster_name``). ``instance_info``
    maps an instance name to its :class:`InstanceInfo`, for the messages
    :func:`instances_needing_info` names; a missing one leaves the ``instance_*`` keys out.
    """
    return [
        message
        for op in _changed_ops(previous, current)
        if (message := _message(op, current, cluster, instance_info)) is not None
    ]
