"""Typed models of the RAPI payloads the project uses.

Models accept what Ganeti 3.0 really sends (see ``tests/fixtures/ganeti-3.0-rapi``),
keep unknown keys (``extra="allow"``) so nothing Ganeti adds is lost, and never
refuse a ``null`` where Ganeti may send one (offline nodes report no capacity).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from synnefo_ganeti.jobs import JobStatus

__all__ = [
    "CancelResult",
    "ClusterInfo",
    "FilterRule",
    "Group",
    "Instance",
    "InstanceConsole",
    "InstanceSpec",
    "Job",
    "JobFailure",
    "LogEntry",
    "Network",
    "Node",
    "QueryField",
    "QueryResult",
    "Timestamp",
]

# Create parameters InstanceSpec names itself; ``extra`` may not override them.
_SPEC_KEYS = frozenset(
    {
        "__version__", "mode", "name", "instance_name", "disk_template", "os", "os_type", "disks", "nics",
        "beparams", "hvparams", "osparams", "hypervisor", "pnode", "snode", "iallocator",
        "opportunistic_locking", "tags", "start", "name_check", "ip_check",
    }
)  # fmt: skip


def _one_default_nic() -> list[dict[str, Any]]:
    return [{}]


#: a whitespace character: what ``str.isspace`` takes (``re``'s ``\s`` on ``str`` is the same test)
_SPACE = re.compile(r"\s")


def _unprintable(char: str) -> bool:
    """Whitespace or a control character (Unicode categories Cc, Cf, Zs, Zl, Zp)."""
    return char.isspace() or not char.isprintable()


def _char_name(char: str) -> str:
    names = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", " ": "a space"}
    return names.get(char, f"the character U+{ord(char):04X}")


class Timestamp(NamedTuple):
    """Ganeti's ``[seconds, microseconds]``."""

    seconds: int
    microseconds: int

    @property
    def as_float(self) -> float:
        return self.seconds + self.microseconds / 1_000_000


class LogEntry(NamedTuple):
    """One op log line: ``[serial, [sec, usec], type, message]``."""

    serial: int
    timestamp: Timestamp
    type: str
    message: Any


class CancelResult(NamedTuple):
    """Ganeti's answer to a cancel: ``[success, message]``."""

    success: bool
    message: str

    @property
    def not_in_queue(self) -> bool:
        """Refused because Ganeti's scheduler holds the job neither queued nor running: it ended,
        or luxid is still writing it to the master candidates (listed "queued", enqueued next),
        or Ganeti does not know it (3.x's "Job N not found in queue", ``JQScheduler.rmJob``;
        2.x's "Job N not found")."""
        return (
            not self.success
            and self.message.startswith("Job ")
            and (self.message.endswith(" not found in queue") or self.message.endswith(" not found"))
        )


class InstanceSpec(BaseModel):
    """What to create: the parameters of ``POST /2/instances`` (request version 1).

    ``extra`` passes any other Ganeti create parameter through unchanged
    (``{"file_driver": "loop"}``, ``{"conflicts_check": False}``, ...).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    disk_template: str = Field(min_length=1)
    os: str = Field(min_length=1)
    disks: list[dict[str, Any]] = Field(default_factory=list)
    nics: list[dict[str, Any]] = Field(default_factory=_one_default_nic)
    beparams: dict[str, Any] = Field(default_factory=dict)
    hvparams: dict[str, Any] = Field(default_factory=dict)
    osparams: dict[str, Any] = Field(default_factory=dict)
    hypervisor: str | None = None
    pnode: str | None = None
    snode: str | None = None
    iallocator: str | None = None
    opportunistic_locking: bool = False
    tags: list[str] = Field(default_factory=list)
    start: bool = True
    name_check: bool = False
    ip_check: bool = False
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name_has_no_space(cls, value: str) -> str:
        # refused, never stripped: a name is what Ganeti and DNS will hold (the full hostname
        # rules are the facade's check, allocate.check_name)
        if value.isprintable() and _SPACE.search(value) is None:
            return value  # (the common case, checked in C: a cloud API writes names by the thousand)
        bad = next((i for i, char in enumerate(value) if _unprintable(char)), None)
        if bad is not None:
            raise ValueError(
                f"name {value!r} holds {_char_name(value[bad])} at position {bad}: Ganeti and DNS take "
                "no whitespace or control characters in a name; send the hostname alone "
                "(letters, digits, hyphens and dots)"
            )
        return value

    @field_validator("extra")
    @classmethod
    def _extra_does_not_shadow(cls, value: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(set(value) & _SPEC_KEYS)
        if clash:
            raise ValueError(
                f"extra must not set {', '.join(clash)}: use the InstanceSpec field of that name instead"
            )
        return value

    @model_validator(mode="after")
    def _placement(self) -> InstanceSpec:
        if self.pnode is not None and self.iallocator is not None:
            raise ValueError("give either pnode or iallocator, not both")
        return self

    def to_rapi_body(self) -> dict[str, Any]:
        """The JSON body Ganeti's ``POST /2/instances`` takes (``__version__`` 1)."""
        body: dict[str, Any] = {
            "__version__": 1,
            "mode": "create",
            "name": self.name,
            "disk_template": self.disk_template,
            "os_type": self.os,
            "disks": self.disks,
            "nics": self.nics,
            "beparams": self.beparams,
            "hvparams": self.hvparams,
            "osparams": self.osparams,
            "tags": self.tags,
            "start": self.start,
            "name_check": self.name_check,
            "ip_check": self.ip_check,
        }
        for key in ("hypervisor", "pnode", "snode", "iallocator"):
            value = getattr(self, key)
            if value is not None:
                body[key] = value
        if self.opportunistic_locking:
            body["opportunistic_locking"] = True
        body.update(self.extra)
        return body


class _Payload(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)


class ClusterInfo(_Payload):
    """``GET /2/info`` (a few named fields; every other key is kept as an extra)."""

    name: str
    master: str | None = None
    software_version: str | None = None
    protocol_version: int | None = None
    default_hypervisor: str | None = None
    enabled_hypervisors: list[str] = Field(default_factory=list)
    enabled_disk_templates: list[str] = Field(default_factory=list)
    ipolicy: dict[str, Any] = Field(default_factory=dict)


class Instance(_Payload):
    """One instance from ``GET /2/instances?bulk=1`` or ``/2/instances/NAME``."""

    name: str
    admin_state: str | None = None
    oper_state: bool | None = None
    status: str | None = None
    os: str | None = None
    pnode: str | None = None
    snodes: list[str] = Field(default_factory=list)
    disk_template: str | None = None
    beparams: dict[str, Any] = Field(default_factory=dict)
    hvparams: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    nic_ips: list[str | None] = Field(default_factory=list, alias="nic.ips")
    nic_macs: list[str] = Field(default_factory=list, alias="nic.macs")
    nic_modes: list[str | None] = Field(default_factory=list, alias="nic.modes")
    nic_links: list[str | None] = Field(default_factory=list, alias="nic.links")
    nic_networks: list[str | None] = Field(default_factory=list, alias="nic.networks")
    #: the networks' names (``nic.networks`` holds their UUIDs)
    nic_network_names: list[str | None] = Field(default_factory=list, alias="nic.networks.names")
    disk_sizes: list[int] = Field(default_factory=list, alias="disk.sizes")
    disk_uuids: list[str | None] = Field(default_factory=list, alias="disk.uuids")
    disk_usage: int | None = None
    oper_ram: int | None = None
    oper_vcpus: int | None = None
    ctime: float | None = None
    mtime: float | None = None
    uuid: str | None = None
    serial_no: int | None = None


class Node(_Payload):
    """One node from ``GET /2/nodes?bulk=1``; capacity fields are ``None`` when unknown."""

    name: str
    offline: bool = False
    drained: bool = False
    master_candidate: bool | None = None
    master_capable: bool | None = None
    vm_capable: bool | None = None
    role: str | None = None
    mtotal: int | None = None
    mnode: int | None = None
    mfree: int | None = None
    dtotal: int | None = None
    dfree: int | None = None
    ctotal: int | None = None
    cnodes: int | None = None
    csockets: int | None = None
    pinst_cnt: int | None = None
    sinst_cnt: int | None = None
    pinst_list: list[str] = Field(default_factory=list)
    sinst_list: list[str] = Field(default_factory=list)
    group_uuid: str | None = Field(default=None, alias="group.uuid")
    uuid: str | None = None
    tags: list[str] = Field(default_factory=list)


class JobFailure(BaseModel):
    """The parsed result of a failed op: ``[ErrorType, [message, ecode]]``."""

    model_config = ConfigDict(frozen=True)

    type: str
    message: str
    ecode: str | None = None
    op_index: int = 0

    @classmethod
    def from_result(cls, result: Any, *, op_index: int = 0) -> JobFailure:
        """Parse an op result of a failed op; tolerate shapes older Ganetis used."""
        if isinstance(result, list | tuple) and len(result) == 2 and isinstance(result[0], str):
            kind, args = result
            if isinstance(args, list | tuple):
                message = str(args[0]) if args else ""
                ecode = args[1] if len(args) > 1 and isinstance(args[1], str) else None
                return cls(type=kind, message=message, ecode=ecode, op_index=op_index)
            return cls(type=kind, message=str(args), op_index=op_index)
        return cls(type="UnknownError", message=str(result), op_index=op_index)


class Job(_Payload):
    """A Ganeti job as ``GET /2/jobs/ID`` (or ``/2/jobs?bulk=1``) reports it.

    The bulk listing carries no ``oplog`` and ``opresult``: they are ``None`` there.
    """

    id: int
    status: JobStatus
    ops: list[dict[str, Any]] = Field(default_factory=list)
    summary: list[str] = Field(default_factory=list)
    opstatus: list[JobStatus] = Field(default_factory=list)
    oplog: list[list[LogEntry]] | None = None
    opresult: list[Any] | None = None
    received_ts: Timestamp | None = None
    start_ts: Timestamp | None = None
    end_ts: Timestamp | None = None

    @property
    def is_final(self) -> bool:
        return self.status.is_final

    @property
    def failure(self) -> JobFailure | None:
        """The first failed op's parsed result, or ``None`` if no op failed."""
        for index, op_status in enumerate(self.opstatus):
            if op_status is JobStatus.ERROR:
                result = self.opresult[index] if self.opresult and index < len(self.opresult) else None
                return JobFailure.from_result(result, op_index=index)
        return None

    @property
    def log(self) -> list[LogEntry]:
        """All ops' log lines, in serial order."""
        entries = [entry for op_log in self.oplog or [] for entry in op_log]
        return sorted(entries, key=lambda entry: entry.serial)

    @property
    def request_ids(self) -> list[str]:
        """The ``gnt:user`` reason texts of the job's ops (where synnefo-ganeti puts its request ids)."""
        return [
            str(item[1])
            for op in self.ops
            for item in op.get("reason") or []
            if isinstance(item, list | tuple) and len(item) >= 2 and item[0] == "gnt:user"
        ]


class Group(_Payload):
    """A node group from ``GET /2/groups?bulk=1`` or ``/2/groups/NAME`` (rlib2's ``G_FIELDS``)."""

    name: str
    uuid: str | None = None
    alloc_policy: str | None = None
    node_cnt: int | None = None
    node_list: list[str] = Field(default_factory=list)
    ipolicy: dict[str, Any] = Field(default_factory=dict)
    custom_ipolicy: dict[str, Any] = Field(default_factory=dict)
    diskparams: dict[str, Any] = Field(default_factory=dict)
    custom_diskparams: dict[str, Any] = Field(default_factory=dict)
    ndparams: dict[str, Any] = Field(default_factory=dict)
    custom_ndparams: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    ctime: float | None = None
    mtime: float | None = None
    serial_no: int | None = None


class Network(_Payload):
    """A network from ``GET /2/networks?bulk=1`` or ``/2/networks/NAME`` (rlib2's ``NET_FIELDS``).

    ``group_list`` holds ``[group, mode, link, vlan]`` per connected group, as Ganeti gives it.
    """

    name: str
    uuid: str | None = None
    network: str | None = None
    gateway: str | None = None
    network6: str | None = None
    gateway6: str | None = None
    mac_prefix: str | None = None
    free_count: int | None = None
    reserved_count: int | None = None
    map: str | None = None
    group_list: list[Any] = Field(default_factory=list)
    inst_list: list[str] = Field(default_factory=list)
    external_reservations: str | None = None
    tags: list[str] = Field(default_factory=list)
    ctime: float | None = None
    mtime: float | None = None
    serial_no: int | None = None


class FilterRule(_Payload):
    """A job filter rule from ``GET /2/filters?bulk=1`` or ``/2/filters/UUID``."""

    uuid: str
    priority: int = 0
    predicates: list[Any] = Field(default_factory=list)
    action: Any = "CONTINUE"
    reason_trail: list[Any] = Field(default_factory=list)
    watermark: int | None = None


class InstanceConsole(_Payload):
    """How to reach a running instance's console (``GET /2/instances/NAME/console``).

    ``kind`` is ``msg``, ``ssh``, ``spice`` or ``vnc`` (Ganeti's ``objects.InstanceConsole``).
    """

    instance: str
    kind: str
    message: str | None = None
    host: str | None = None
    port: int | None = None
    user: str | None = None
    command: list[str] | None = None
    display: int | None = None


class QueryField(_Payload):
    """One field a ``/2/query/WHAT`` serves: Ganeti's ``QueryFieldDefinition``."""

    name: str
    title: str | None = None
    kind: str | None = None
    doc: str | None = None


class QueryResult(_Payload):
    """The answer of ``/2/query/WHAT``: the fields asked for, then one row per item.

    Each cell is ``(status, value)``; status 0 (``RS_NORMAL``) means the value is there, others
    that it is unknown, no data, unavailable or offline (``value`` is then ``None``).
    """

    fields: list[QueryField]
    data: list[list[tuple[int, Any]]] = Field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [field.name for field in self.fields]

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Each row as ``{field name: value}``; a value Ganeti could not give is ``None``."""
        names = self.names
        return [
            {name: value if status == 0 else None for name, (status, value) in zip(names, row, strict=False)}
            for row in self.data
        ]
