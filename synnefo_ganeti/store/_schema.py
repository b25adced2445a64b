"""The database model: backends, instances, jobs (with their ops) and job events.

Declared with SQLAlchemy 2's typed declarative mapping; the store writes through
Core statements on these tables (bulk, one transaction per batch). Alembic's
migrations (``alembic/versions``) create exactly this; a test compares the two.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar
from uuid import uuid4

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

__all__ = [
    "Backend",
    "BackendEvent",
    "Base",
    "ChangeRow",
    "CreateRequest",
    "FeedCursor",
    "Instance",
    "InstanceJob",
    "Job",
    "JobEventRow",
    "NetworkBackendRow",
    "NetworkRow",
    "UTCDateTime",
    "metadata",
]

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: the instance status whose rows leave their name free (InstanceStatus.DESTROYED, spelled out)
DESTROYED = "DESTROYED"

# SQLite only autoincrements INTEGER PRIMARY KEY; PostgreSQL gets a bigint identity.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out; SQLite, which keeps no zone, stores them as naive UTC."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the store keeps aware UTC datetimes")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


metadata = Base.metadata


class Backend(Base):
    """One Ganeti cluster, known by the name the configuration gives it."""

    __tablename__ = "backends"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime]
    #: drained by an operator (``synnefo-ganeti backends drain``): no new instances
    drained: Mapped[bool] = mapped_column(Boolean, default=False)
    drained_at: Mapped[datetime | None]
    #: what the dispatcher's health checks last concluded: "up", "down" or None (never checked)
    health: Mapped[str | None] = mapped_column(String(8))
    health_at: Mapped[datetime | None]
    health_detail: Mapped[str | None] = mapped_column(Text)
    #: the last reconcile pass over it: when, by which dispatcher, its report (migration 0013)
    reconciled_at: Mapped[datetime | None]
    reconciled_by: Mapped[str | None] = mapped_column(String(64))
    reconcile_report: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Instance(Base):
    """A virtual machine this control plane knows of; its ``status`` follows job events.

    ``status`` is one of BUILD, STARTED, STOPPED, ERROR, DESTROYED. ``beparams``, ``nics``,
    ``disks`` and ``tags`` are what the control plane expects Ganeti to report (from the
    spec at create, then as the reconciler saw it); ``state_time`` is the end time of the
    last job applied to ``status``, so that an older job's end changes nothing.
    """

    __tablename__ = "instances"
    __table_args__ = (
        # a name is one row's while that row is not DESTROYED; DESTROYED rows stay (their ids
        # stay findable) however often the name is reused
        Index(
            "uq_instances_backend_id_name_live",
            "backend_id",
            "name",
            unique=True,
            postgresql_where=text(f"status <> '{DESTROYED}'"),
            sqlite_where=text(f"status <> '{DESTROYED}'"),
        ),
        # every other look by name (whatever the status, or across backends: migration 0009)
        Index("ix_instances_name", "name"),
        # the few rows whose primary node is not up (each reconcile pass reads them: migration 0010)
        Index(
            "ix_instances_node_state",
            "backend_id",
            postgresql_where=text("node_state IS NOT NULL"),
            sqlite_where=text("node_state IS NOT NULL"),
        ),
        # the few rows with a delete waiting (each follower pass reads them: migration 0011)
        Index(
            "ix_instances_delete_requested",
            "delete_requested_at",
            postgresql_where=text("delete_requested_at IS NOT NULL"),
            sqlite_where=text("delete_requested_at IS NOT NULL"),
        ),
        UniqueConstraint("uuid"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    #: the public id (``StoredInstance.id``): a UUID given when the row is first written, never reused
    uuid: Mapped[str] = mapped_column(String(36), default=lambda: str(uuid4()))
    backend_id: Mapped[int] = mapped_column(ForeignKey("backends.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16))
    owned: Mapped[bool] = mapped_column(Boolean, default=True)
    os: Mapped[str | None] = mapped_column(String(255))
    disk_template: Mapped[str | None] = mapped_column(String(32))
    beparams: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    nics: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    disks: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    tags: Mapped[list[str] | None] = mapped_column(JSON)
    create_job_id: Mapped[int | None] = mapped_column(BigInteger)
    state_time: Mapped[float | None] = mapped_column(Double)
    #: what is in progress ("build", "start", "stop", "reboot", "modify", "delete", ...) and its job
    task: Mapped[str | None] = mapped_column(String(16))
    task_job_id: Mapped[int | None] = mapped_column(BigInteger)
    #: the last action that failed: {"action", "job_id", "message", "at"}; None after a success
    last_error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    #: what Ganeti reports (after a create or modify ends, and each reconcile pass)
    memory: Mapped[int | None] = mapped_column(Integer)
    vcpus: Mapped[int | None] = mapped_column(Integer)
    pnode: Mapped[str | None] = mapped_column(String(255))
    #: its primary node as Ganeti (or the dispatcher's node reads) last saw it: None while the
    #: node is up, "down" (Ganeti's ERROR_nodedown) or "offline" (ERROR_nodeoffline); migration 0010
    node_state: Mapped[str | None] = mapped_column(String(16))
    node_state_since: Mapped[datetime | None]
    #: the durable request that made it (``StoredInstance.request_id``; migration 0011)
    request_id: Mapped[str | None] = mapped_column(String(36))
    #: a delete asked while its create or another action ran: it follows their end (migration 0011)
    delete_requested_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


# the instances by name whatever its case: names are unique case-insensitively (every name check
# compares ``lower(name)``; migration 0012)
Index("ix_instances_name_lower", func.lower(Instance.name))

#: the renames in progress: the condition of ix_instance_jobs_renaming, as queries must spell it
RENAMING = "applied_at IS NULL AND action = 'rename'"


class InstanceJob(Base):
    """A job the control plane submitted for an instance: what its end means for the instance.

    ``action`` is create, startup, shutdown, reboot, remove or modify; ``start`` (create)
    says whether the instance was to be started; ``params`` (modify) the beparams asked for.
    ``applied_at`` is set once the job's final status was applied to the instance.
    """

    __tablename__ = "instance_jobs"
    __table_args__ = (
        # the jobs in flight, which every follower of recorded jobs asks for (migration 0007)
        Index(
            "ix_instance_jobs_unapplied",
            "backend_id",
            "job_id",
            postgresql_where=text("applied_at IS NULL"),
            sqlite_where=text("applied_at IS NULL"),
        ),
        # the renames in progress, which every name check asks for (migration 0008)
        Index(
            "ix_instance_jobs_renaming",
            "backend_id",
            "job_id",
            postgresql_where=text(RENAMING),
            sqlite_where=text(RENAMING),
        ),
    )

    backend_id: Mapped[int] = mapped_column(ForeignKey("backends.id", ondelete="CASCADE"), primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id", ondelete="CASCADE"), index=True)
    action: Mapped[str] = mapped_column(String(16))
    start: Mapped[bool | None] = mapped_column(Boolean)
    params: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    recorded_at: Mapped[datetime]
    applied_at: Mapped[datetime | None]
    result: Mapped[str | None] = mapped_column(String(16))


class Job(Base):
    """The last applied version of one Ganeti job.

    ``summary`` is what later versions are compared with (exact floats, see
    :class:`synnefo_ganeti.jobs.JobSummary`); ``ops`` the ops as the CLI shows them;
    ``revision`` counts applied versions and ``event_count`` the events stored.
    """

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_status_ended_at", "status", "ended_at"),)

    backend_id: Mapped[int] = mapped_column(ForeignKey("backends.id", ondelete="CASCADE"), primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    status: Mapped[str] = mapped_column(String(16))
    instance: Mapped[str | None] = mapped_column(String(255), index=True)
    ops: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    summary: Mapped[dict[str, Any]]
    received_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    revision: Mapped[int] = mapped_column(Integer)
    event_count: Mapped[int] = mapped_column(Integer)
    first_seen_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class JobEventRow(Base):
    """One change between two versions of a job file: a job status, an op status or a log entry."""

    __tablename__ = "job_events"
    __table_args__ = (
        UniqueConstraint("backend_id", "job_id", "seq"),
        ForeignKeyConstraint(
            ["backend_id", "job_id"], ["jobs.backend_id", "jobs.job_id"], ondelete="CASCADE"
        ),
        Index("ix_job_events_stored_at", "stored_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    backend_id: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[int] = mapped_column(BigInteger)
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    op_index: Mapped[int | None] = mapped_column(Integer)
    op_id: Mapped[str | None] = mapped_column(String(64))
    instance: Mapped[str | None] = mapped_column(String(255))
    log_serial: Mapped[int | None] = mapped_column(Integer)
    log_message: Mapped[str | None] = mapped_column(Text)
    event_time: Mapped[datetime | None]
    stored_at: Mapped[datetime]


class BackendEvent(Base):
    """Something that happened to a backend as a whole: health went down or up, drained."""

    __tablename__ = "backend_events"
    __table_args__ = (Index("ix_backend_events_backend_id_at", "backend_id", "at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    backend_id: Mapped[int] = mapped_column(ForeignKey("backends.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime]


class BackendNode(Base):
    """A node of a backend as the dispatcher last read it (migration 0010): whether Ganeti
    still reads its live figures ("up"), not ("down"), or it is marked offline, and since when."""

    __tablename__ = "backend_nodes"

    backend_id: Mapped[int] = mapped_column(ForeignKey("backends.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    #: "up", "down" or "offline"
    state: Mapped[str] = mapped_column(String(16))
    #: when it entered ``state``
    since: Mapped[datetime]
    #: the last read that confirmed ``state``
    seen_at: Mapped[datetime]
    #: the first sign of a down node (no live figures, an RPC failure, a failed create naming it)
    detail: Mapped[str | None] = mapped_column(Text)


class CreateRequest(Base):
    """A durable instance-create request (``ControlPlane.request_instance``).

    ``status``: pending (not submitted yet), submitted (the create job is recorded),
    succeeded, failed or canceled. A dispatcher ``claimed_by`` a pending request works on
    it; once it has chosen a backend (``backend_id`` set, ``attempts`` counted) the create
    may have reached Ganeti, so a dispatcher taking the request over asks Ganeti (by the
    request id in the job's reason and the instance's tags) before submitting again.
    """

    __tablename__ = "requests"
    __table_args__ = (
        Index("ix_requests_status_created_at", "status", "created_at"),
        Index("ix_requests_backend_id_job_id", "backend_id", "job_id"),
        # a request by its instance's id, given at once (migration 0011)
        Index("ix_requests_instance_uuid", "instance_uuid"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(255))
    spec: Mapped[dict[str, Any]]
    #: the backend the caller asked for (None: the dispatcher chooses)
    want_backend: Mapped[str | None] = mapped_column(String(64))
    backend_id: Mapped[int | None] = mapped_column(ForeignKey("backends.id", ondelete="SET NULL"))
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claimed_by: Mapped[str | None] = mapped_column(String(64))
    claimed_at: Mapped[datetime | None]
    #: its instance's public id (``Request.instance_id``), given when the request is written and
    #: the same through every attempt (before 0011: once placed)
    instance_uuid: Mapped[str | None] = mapped_column(String(36))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    #: every failed attempt, oldest first: {"attempt", "backend", "node", "job_id", "error", "at"}
    #: (migration 0010)
    attempt_errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    #: why the dispatcher cannot place it now (None: not waiting; migration 0012)
    waiting_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    submitted_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class ChangeRow(Base):
    """The change feed (``ControlPlane.changes``): one row per change of a request's status or
    error or waiting reason, or of an instance's status, task, last error or node state. Written
    by database triggers (migrations 0005, 0010 and 0012), so that every process's writes are in
    it, in commit order; ``at`` is seconds since the epoch."""

    __tablename__ = "changes"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))
    key: Mapped[str] = mapped_column(String(64))
    status: Mapped[str | None] = mapped_column(String(16))
    task: Mapped[str | None] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    at: Mapped[float] = mapped_column(Double)
    #: an instance's node state after the change (None: its node is up; requests: None)
    node_state: Mapped[str | None] = mapped_column(String(16))
    #: a request's waiting reason after the change (instances: None; migration 0012)
    waiting_reason: Mapped[str | None] = mapped_column(Text)


class FeedCursor(Base):
    """How far a consumer of the change feed got (the webhook: ``name`` "webhook")."""

    __tablename__ = "feed_cursors"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_id: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime]


class NetworkRow(Base):
    """A network this control plane made (``ControlPlane.create_network``; store/_networks.py).

    ``subnet``, ``gateway``, ``mac_prefix``, ``mode`` and ``link`` are what was asked (``link``
    None: each backend's default NIC link); ``groups`` the node groups asked for (None: every
    group of each backend). ``status`` is "active", or "deleting" once a delete began; the row
    goes when the network is gone from every backend, and its name is free again.
    """

    __tablename__ = "networks"
    __table_args__ = (UniqueConstraint("uuid"), UniqueConstraint("name"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    uuid: Mapped[str] = mapped_column(String(36), default=lambda: str(uuid4()))
    name: Mapped[str] = mapped_column(String(128))
    subnet: Mapped[str] = mapped_column(String(64))
    gateway: Mapped[str | None] = mapped_column(String(64))
    mac_prefix: Mapped[str | None] = mapped_column(String(17))
    mode: Mapped[str] = mapped_column(String(16))
    link: Mapped[str | None] = mapped_column(String(64))
    groups: Mapped[Any | None] = mapped_column(JSON)
    tags: Mapped[list[str] | None] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class NetworkBackendRow(Base):
    """A network on one backend: ``state`` pending (its add or connects not ended), active,
    error (``error`` says why) or deleting; ``groups`` the node groups it is connected to,
    ``want_groups`` those it should be; ``link`` as resolved there; ``job_id`` the last job."""

    __tablename__ = "network_backends"

    network_id: Mapped[int] = mapped_column(ForeignKey("networks.id", ondelete="CASCADE"), primary_key=True)
    backend_id: Mapped[int] = mapped_column(ForeignKey("backends.id", ondelete="CASCADE"), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    groups: Mapped[list[str] | None] = mapped_column(JSON)
    want_groups: Mapped[list[str] | None] = mapped_column(JSON)
    link: Mapped[str | None] = mapped_column(String(64))
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime]


# the operations' tables (dispatchers, audit log, incidents, maintenance runs: migrations 0013 and
# 0014) live in a module of their own, on the same metadata; imported here so that every reader
# of ``metadata`` (alembic, the schema check) sees them
from synnefo_ganeti.store import _schema_ops as _schema_ops  # noqa: E402
