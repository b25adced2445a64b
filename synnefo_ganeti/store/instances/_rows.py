"""The instances concern's tables, on the store's one metadata (``db._schema``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import uuid4

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Double,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from synnefo_ganeti.store.db._schema import Base, BigId

__all__ = ["DESTROYED", "RENAMING", "Instance", "InstanceJob"]


#: the instance status whose rows leave their name free (InstanceStatus.DESTROYED, spelled out)
DESTROYED = "DESTROYED"


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
