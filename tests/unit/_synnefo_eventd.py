"""Synnefo's ``snf-ganeti-eventd`` message building, ported literally (test helper: the oracle).

Source: repo grnet/synnefo, commit d06ec8c78 ("Update python version files to 0.21"), path
``snf-cyclades-gtools/synnefo/ganeti/eventd.py``. Each function below names the function it
ports; the bodies are eventd's, line for line, Python 2 -> 3 with these substitutions only:

* **No Ganeti library.** ``serializer.LoadJson`` is ``json.loads``. ``jqueue._QueuedJob.Restore``
  and ``_QueuedOpCode.Restore`` (Ganeti 3.0 ``jqueue/__init__.py``) are :class:`Job` and
  :class:`Op`: the same attributes from the same keys (``int(state["id"])``,
  ``state.get("received_timestamp", None)``, ...). ``opcodes.OpCode.LoadOpCode`` is
  :class:`OpInput`: the opcode's parameters stay a dict, and an attribute read of a parameter
  the file does not hold raises ``AttributeError`` as on Ganeti's slotted opcode (so
  ``get_field`` still answers ``None`` and ``input.kind`` still raises). ``op.Serialize()["input"]``
  (``OpCode.__getstate__``: the parameters set, plus ``OP_ID``) is :meth:`OpInput.getstate`, a
  copy of the dict. ``OpInstanceMultiAlloc.__setstate__`` turns each of its ``instances`` into an
  opcode; here each stays a dict, which has no ``split`` either (``prefix_from_name`` raises
  ``AttributeError`` on both).
* **No pyinotify, no file read.** ``process_IN_MOVED_TO`` takes the file's parsed JSON instead
  of ``event.path`` / ``event.name`` (eventd's test ``event.name.startswith("job-")`` is the
  caller's). eventd also runs it on ``IN_CLOSE_WRITE``, so Ganeti's temp files
  (``job-N-PID-K.tmp``, ``job-NXXXXXXXX.new``: they start with ``job-``) are read too: every
  write is processed twice with the same content. One call here is one of those passes.
* **No AMQP, no master check.** ``self.client.basic_publish(settings.EXCHANGE_GANETI, routekey,
  msg)`` appends ``(op index, routekey, json.loads(msg))`` to the result; the node is taken to
  be the master (``get_ganeti_master`` / ``get_ganeti_node`` are not ported).
* **An exception** out of ``process_IN_MOVED_TO`` is caught as eventd's main loop does
  (``except StandardError: logger.exception``): the messages published before it stay, the
  rest of the file is lost; :attr:`Published.crashed` says what was raised.
* **get_instance_info** keeps its master branch only: ``cli.GetClient().QueryInstances([instance],
  q_fields, use_locking=False)`` is the ``query_instances`` argument, a stub that answers the
  one row (:func:`row_from_rapi` builds it from ``GET /2/instances/NAME``). Python 3's ``zip``
  and ``map`` are lazy, so their results are made lists (Python 2 gave lists; the firewall loop
  relies on mutating them).
* ``constants``: Ganeti 3.0's values (``JOB_STATUS_WAITLOCK`` is gone since 2.7, so the
  ``AttributeError`` branch of ``get_time_from_status`` runs, as on 3.0).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("ganeti.eventd")

# ganeti/constants.py of Ganeti 3.0 (_constants.py generated from Haskell)
JOB_STATUS_QUEUED = "queued"
JOB_STATUS_WAITING = "waiting"
JOB_STATUS_CANCELING = "canceling"
JOB_STATUS_RUNNING = "running"
JOB_STATUS_CANCELED = "canceled"
JOB_STATUS_SUCCESS = "success"
JOB_STATUS_ERROR = "error"
JOBS_FINALIZED = frozenset([JOB_STATUS_CANCELED, JOB_STATUS_SUCCESS, JOB_STATUS_ERROR])
OP_PRIO_DEFAULT = 0


class _Constants:
    """``ganeti.constants`` as eventd reads it (no ``JOB_STATUS_WAITLOCK`` in 3.0)."""

    JOB_STATUS_QUEUED = JOB_STATUS_QUEUED
    JOB_STATUS_WAITING = JOB_STATUS_WAITING
    JOB_STATUS_CANCELING = JOB_STATUS_CANCELING
    JOB_STATUS_RUNNING = JOB_STATUS_RUNNING
    JOBS_FINALIZED = JOBS_FINALIZED


constants: Any = _Constants()

#: the row ``QueryInstances([instance], q_fields, use_locking=False)`` answers
QueryInstances = Callable[[str, Sequence[str]], list[Any]]


class OpInput:
    """``opcodes.OpCode.LoadOpCode(state["input"])``: attribute reads of the opcode's parameters."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        if not isinstance(data, dict):
            raise ValueError(f"Invalid data to LoadOpCode ({type(data)})")
        if "OP_ID" not in data:
            raise ValueError("Invalid data to LoadOpcode, missing OP_ID")
        object.__setattr__(self, "_data", dict(data))

    def __getattr__(self, name: str) -> Any:
        data = object.__getattribute__(self, "_data")
        if name in data:
            return data[name]
        raise AttributeError(name)  # an unset slot of Ganeti's opcode

    def getstate(self) -> dict[str, Any]:
        """``OpCode.__getstate__``: the parameters set, ``OP_ID`` included."""
        return json.loads(json.dumps(object.__getattribute__(self, "_data")))  # type: ignore[no-any-return]


class Op:
    """``jqueue._QueuedOpCode.Restore``."""

    def __init__(self, state: Mapping[str, Any]) -> None:
        self.input = OpInput(state["input"])
        self.status = state["status"]
        self.result = state["result"]
        self.log = state["log"]
        self.start_timestamp = state.get("start_timestamp", None)
        self.exec_timestamp = state.get("exec_timestamp", None)
        self.end_timestamp = state.get("end_timestamp", None)
        self.priority = state.get("priority", OP_PRIO_DEFAULT)

    def Serialize(self) -> dict[str, Any]:
        return {"input": self.input.getstate(), "status": self.status, "result": self.result}


class Job:
    """``jqueue._QueuedJob.Restore(None, data, False, False)``."""

    def __init__(self, state: Mapping[str, Any]) -> None:
        self.id = int(state["id"])
        self.received_timestamp = state.get("received_timestamp", None)
        self.start_timestamp = state.get("start_timestamp", None)
        self.end_timestamp = state.get("end_timestamp", None)
        self.ops = [Op(op_state) for op_state in state["ops"]]


class InvalidBackendStatus(Exception):
    """eventd's ``InvalidBackendStatus``."""

    def __init__(self, status: Any, job: Any) -> None:
        self.status = status
        self.job = job

    def __str__(self) -> str:
        return repr(f"Invalid backend status: {self.status} in job {self.job}")


def get_time_from_status(op: Op, job: Job) -> Any:
    """eventd ``get_time_from_status``."""
    status = op.status
    if status == constants.JOB_STATUS_QUEUED:
        return job.received_timestamp
    try:  # Compatibility with Ganeti version
        if status == constants.JOB_STATUS_WAITLOCK:
            return op.start_timestamp or job.end_timestamp
    except AttributeError:
        if status == constants.JOB_STATUS_WAITING:
            return op.start_timestamp or job.end_timestamp
    if status == constants.JOB_STATUS_CANCELING:
        return op.start_timestamp or job.end_timestamp
    if status == constants.JOB_STATUS_RUNNING:
        return op.exec_timestamp or job.end_timestamp
    if status in constants.JOBS_FINALIZED:
        return op.end_timestamp or job.end_timestamp

    raise InvalidBackendStatus(status, job)


def get_instance_info(
    instance: str, logger: logging.Logger, query_instances: QueryInstances
) -> dict[str, Any]:
    """eventd ``get_instance_info``, its master branch (``cli.GetClient().QueryInstances``)."""
    q_fields = [
        "nic.names",
        "nic.networks.names",
        "nic.ips",
        "nic.macs",
        "nic.modes",
        "nic.links",
        "nic.uuids",
        "tags",
        "disk.names",
        "disk.sizes",
        "disk.uuids",
        "hv/boot_order",
        "hv/cdrom_image_path",
    ]
    info = [query_instances(instance, q_fields)]
    # Parse NICs
    names, networks, ips, macs, modes, links, uuids, tags = info[0][:-5]
    nic_keys = ["name", "network", "ip", "mac", "mode", "link", "uuid"]
    nics: list[Any] = list(zip(names, networks, ips, macs, modes, links, uuids))  # noqa: B905 (eventd's zip)
    nics = list(map(lambda x: dict(zip(nic_keys, x)), nics))  # noqa: B905
    # Parse Disks
    names, sizes, uuids = info[0][-5:-2]
    disk_keys = ["name", "size", "uuid"]
    disks: list[Any] = list(zip(names, sizes, uuids))  # noqa: B905
    disks = list(map(lambda x: dict(zip(disk_keys, x)), disks))  # noqa: B905

    hvparams = {"boot_order": info[0][-2], "cdrom_image_path": info[0][-1]}
    # Get firewall from instance Tags
    # Tags are of the form synnefo:network:N:firewall_mode
    for tag in tags:
        t = tag.split(":")
        if t[0:2] == ["synnefo", "network"]:
            if len(t) != 4:
                logger.error("Malformed synefo tag %s", tag)
                continue
            nic_name = t[2]
            firewall = t[3]
            [nic.setdefault("firewall", firewall) for nic in nics if nic["name"] == nic_name]
    attachments = {"nics": nics, "disks": disks, "hvparams": hvparams}
    return attachments


def row_from_rapi(instance: Mapping[str, Any], q_fields: Sequence[str]) -> list[Any]:
    """The ``QueryInstances`` row of ``q_fields`` from ``GET /2/instances/NAME`` (test stub):
    the same field names, ``hv/X`` read from its filled ``hvparams`` (``None`` if absent)."""
    hv = instance.get("hvparams") or {}
    return [hv.get(f[3:]) if f.startswith("hv/") else instance.get(f) for f in q_fields]


def prefix_from_name(name: Any) -> Any:
    """eventd ``prefix_from_name``."""
    return name.split("-")[0]


def get_field(from_: Any, field: str) -> Any:
    """eventd ``get_field`` (it returns ``None`` by falling off the end)."""
    try:
        return getattr(from_, field)
    except AttributeError:
        None  # noqa: B018 (eventd's statement)


@dataclass
class Published:
    """What one ``process_IN_MOVED_TO`` call published, and the exception that ended it, if any."""

    messages: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    crashed: str | None = None

    def pairs(self) -> list[tuple[str, dict[str, Any]]]:
        return [(key, body) for _, key, body in self.messages]


class JobFileHandler:
    """eventd ``JobFileHandler`` without pyinotify, AMQP and the master check."""

    def __init__(self, cluster_name: str, query_instances: QueryInstances | None = None) -> None:
        self.logger = logger
        self.cluster_name = cluster_name
        self.query_instances = query_instances
        self.op_handlers = {
            "INSTANCE": self.process_instance_op,
            "NETWORK": self.process_network_op,
            "CLUSTER": self.process_cluster_op,
            # "GROUP": self.process_group_op}
            "TAGS": self.process_tag_op,
        }

    def process_IN_MOVED_TO(self, data: Mapping[str, Any]) -> Published:
        """eventd ``JobFileHandler.process_IN_MOVED_TO`` on a file's parsed JSON, inside the main
        loop's ``except StandardError``."""
        published = Published()
        try:
            self._process(data, published)
        except Exception as exc:  # eventd main(): logger.exception("Unhandled exception")
            published.crashed = f"{type(exc).__name__}: {exc}"
        return published

    def _process(self, data: Mapping[str, Any], published: Published) -> None:
        job = Job(data)

        job_id = int(job.id)

        for index, op in enumerate(job.ops):
            op_id = op.input.OP_ID

            msg = None
            try:
                handler_fn = self.op_handlers[op_id.split("_")[1]]
                msg, routekey = handler_fn(op, job_id)
            except KeyError:
                pass

            if not msg:
                self.logger.debug("Ignoring job: %s: %s", job_id, op_id)
                continue

            # Generate a unique message identifier
            event_time = get_time_from_status(op, job)

            # Get the last line of the op log as message
            try:
                logmsg = op.log[-1][-1]
            except IndexError:
                logmsg = None

            # Add shared attributes for all operations
            msg.update(
                {
                    "event_time": event_time,
                    "operation": op_id,
                    "status": op.status,
                    "cluster": self.cluster_name,
                    "logmsg": logmsg,
                    "result": op.result,
                    "jobId": job_id,
                }
            )

            if op.status == "success":
                msg["result"] = op.result

            if op_id == "OP_INSTANCE_CREATE" and op.status == "error":
                # In case an instance creation fails send the job input
                # so that the job can be retried if needed.
                msg["job_fields"] = op.Serialize()["input"]

            msg = json.dumps(msg)

            # self.client.basic_publish(settings.EXCHANGE_GANETI, routekey, msg)
            published.messages.append((index, routekey, json.loads(msg)))

    def process_instance_op(self, op: Op, job_id: int) -> tuple[Any, Any]:
        """eventd ``JobFileHandler.process_instance_op``."""
        input = op.input
        op_id = input.OP_ID

        instances = None
        instances = get_field(input, "instance_name")
        if not instances:
            instances = get_field(input, "instances")
            if not instances or len(instances) > 1:
                # Do not publish messages for jobs with no or multiple
                # instances.  Currently snf-dispatcher can not normally handle
                # these messages
                return None, None
            else:
                instances = instances[0]

        self.logger.debug("Job: %d: %s(%s) %s", job_id, op_id, instances, op.status)

        tags = get_field(input, "tags") or []

        job_fields: dict[str, Any] = {}
        if op_id in ["OP_INSTANCE_SET_PARAMS", "OP_INSTANCE_CREATE"]:
            job_fields = {
                "nics": get_field(input, "nics"),
                "disks": get_field(input, "disks"),
                "hvparams": get_field(input, "hvparams"),
                "beparams": get_field(input, "beparams"),
            }
        elif op_id == "OP_INSTANCE_SNAPSHOT":
            disks = get_field(input, "disks")
            if disks:
                reason = get_field(input, "reason")
                snapshot_info = None
                try:
                    reason = reason[0]
                    assert reason[0] == "gnt:user"
                    snapshot_info = reason[1]
                    disks[0][1]["snapshot_info"] = snapshot_info
                except:  # noqa: E722 (eventd's bare except)
                    self.logger.warning("Malformed snapshot job '%s'", job_id)
                job_fields = {"disks": disks}

        msg = {
            "type": "ganeti-op-status",
            "instance": instances,
            "operation": op_id,
            "job_fields": job_fields,
            "tags": tags,
        }

        if (op_id in ["OP_INSTANCE_CREATE", "OP_INSTANCE_STARTUP"] and op.status == "success") or (
            op_id in ["OP_INSTANCE_SET_PARAMS", "OP_INSTANCE_GROW_DISK"]
            and op.status in ["success", "error", "cancelled"]
        ):
            if self.query_instances is None:
                raise RuntimeError("no QueryInstances stub: eventd would ask luxid here")
            instance_info = get_instance_info(msg["instance"], self.logger, self.query_instances)
            msg["instance_nics"] = instance_info["nics"]
            msg["instance_disks"] = instance_info["disks"]
            msg["instance_hvparams"] = instance_info["hvparams"]

        routekey = "ganeti.%s.event.op" % prefix_from_name(instances)  # noqa: UP031

        return msg, routekey

    def process_network_op(self, op: Op, job_id: int) -> tuple[Any, Any]:
        """eventd ``JobFileHandler.process_network_op``."""
        input = op.input
        op_id = input.OP_ID
        network_name = get_field(input, "network_name")

        if not network_name:
            return None, None

        self.logger.debug("Job: %d: %s(%s) %s", job_id, op_id, network_name, op.status)

        job_fields = {
            "subnet": get_field(input, "network"),
            "gateway": get_field(input, "gateway"),
            "add_reserved_ips": get_field(input, "add_reserved_ips"),
            "remove_reserved_ips": get_field(input, "remove_reserved_ips"),
            # 'network_mode': get_field(input, 'network_mode'),
            # 'network_link': get_field(input, 'network_link'),
            "group_name": get_field(input, "group_name"),
        }

        msg = {
            "operation": op_id,
            "type": "ganeti-network-status",
            "network": network_name,
            "job_fields": job_fields,
        }

        routekey = "ganeti.%s.event.network" % prefix_from_name(network_name)  # noqa: UP031

        return msg, routekey

    def process_cluster_op(self, op: Op, job_id: int) -> tuple[Any, Any]:
        """eventd ``JobFileHandler.process_cluster_op``."""
        input = op.input
        op_id = input.OP_ID

        self.logger.debug("Job: %d: %s %s", job_id, op_id, op.status)

        if op_id != "OP_CLUSTER_SET_PARAMS":
            # Send only modifications of cluster
            return None, None

        msg = {"operation": op_id, "type": "ganeti-cluster-status"}

        routekey = "ganeti.event.cluster"

        return msg, routekey

    def process_tag_op(self, op: Op, job_id: int) -> tuple[Any, Any]:
        """eventd ``JobFileHandler.process_tag_op``."""
        input = op.input
        kind = input.kind
        op_id = input.OP_ID
        tags = input.tags
        dry_run = get_field(input, "dry_run")
        if kind == "cluster":
            if op_id == "OP_TAGS_SET":  # noqa: SIM102 (eventd's nesting)
                # NOTE: Check 'dry_run' after 'cluster'
                # because networks and groups
                # do not support the 'dry_run' option.
                if op.status == "waiting" and tags and dry_run:
                    # Special where a prefixed cluster tag operation in dry-run
                    # mode is used in order to trigger eventd to send a
                    # heartbeat message.
                    tag = tags[0]
                    if tag.startswith("snf:eventd:heartbeat"):
                        self.logger.debug("Received heartbeat tag '%s'. Sending response.", tag)
                        msg: dict[str, Any] = {"type": "eventd-heartbeat", "cluster": self.cluster_name}
                        return msg, "eventd.heartbeat"
        elif kind == "instance" and op.status in ["success", "error", "cancelled"]:
            self.logger.info("Process opcode %s for tags %s", op_id, tags)
            name = input.name
            job_fields = {"dry_run": dry_run}
            msg = {"type": "ganeti-op-status", "instance": name, "tags": tags, "job_fields": job_fields}

            routekey = "ganeti.%s.event.op" % prefix_from_name(name)  # noqa: UP031
            self.logger.info("Return msg: %s, routekey: %s", str(msg), routekey)
            return msg, routekey

        return None, None
