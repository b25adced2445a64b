"""The schema's base: the one metadata and its naming convention, the column types every
concern's rows use. Each concern declares its own tables (``<concern>/_rows.py``) on this
metadata; importing :mod:`synnefo_ganeti.store` registers them all (alembic, the schema check).
Alembic's migrations (``alembic/versions``) create exactly this; a test compares the two.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Dialect,
    Integer,
    MetaData,
)
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

__all__ = ["NAMING", "Base", "BigId", "UTCDateTime", "metadata"]


NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


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
