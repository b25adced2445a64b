"""The networks concern's tables, on the store's one metadata (``db._schema``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import uuid4

from sqlalchemy import (
    JSON,
    BigInteger,
    ForeignKey,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from synnefo_ganeti.store.db._schema import Base, BigId

__all__ = ["NetworkBackendRow", "NetworkRow"]


class NetworkRow(Base):
    """A network this control plane made (``ControlPlane.create_network``; store/networks/_networks.py).

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
