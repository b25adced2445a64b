"""One way from the package's dataclasses to JSON, and the ISO-time helpers.

:func:`to_jsonable` turns a dataclass (or a list, dict or tuple of them) into plain
JSON values with orjson, which already knows dataclasses, enums and datetimes: an enum
becomes its value, a tuple a list, a datetime ``datetime.isoformat()``'s text (orjson
writes RFC 3339 as ``isoformat`` does: ``+00:00``, microseconds only when there are
some). A dataclass that shows only some of its fields, or in another order, says so in
a ``__json_fields__`` class attribute (a tuple of field names); nested dataclasses
follow their own.

orjson rather than pydantic's ``TypeAdapter`` for the way out: pydantic writes a UTC
datetime as ``...Z``, the store's and the CLI's JSON have always said ``+00:00``. The
way back in, :func:`from_jsonable`, is pydantic's ``TypeAdapter`` (lax mode: an enum
from its value, a tuple from a list, a float from an int), which is also faster than
the hand-written ``from_json`` it replaced.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any, TypeVar

import orjson
from pydantic import TypeAdapter

__all__ = ["from_iso", "from_jsonable", "from_timestamp", "iso", "to_json_bytes", "to_jsonable"]

T = TypeVar("T")

_OPTIONS = orjson.OPT_PASSTHROUGH_DATACLASS


def _fields(obj: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = getattr(type(obj), "__json_fields__", None)
        if names is None:
            names = [f.name for f in dataclasses.fields(obj)]
        return {name: getattr(obj, name) for name in names}
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def to_json_bytes(obj: Any) -> bytes:
    """``obj`` as JSON text (UTF-8): dataclasses as their ``__json_fields__`` (default: all)."""
    return orjson.dumps(obj, option=_OPTIONS, default=_fields)


def to_jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON values (dicts, lists, str, int, float, bool, None)."""
    return orjson.loads(to_json_bytes(obj))


_adapters: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    adapter = _adapters.get(cls)
    if adapter is None:
        adapter = _adapters[cls] = TypeAdapter(cls)
    return adapter


def from_jsonable(cls: type[T], raw: Any) -> T:
    """An instance of ``cls`` (a dataclass, say) from the JSON values :func:`to_jsonable` made."""
    result: T = _adapter(cls).validate_python(raw)
    return result


def iso(value: datetime | None) -> str | None:
    """``value.isoformat()``, or None."""
    return None if value is None else value.isoformat()


def from_iso(value: str | None) -> datetime | None:
    """The datetime :func:`iso` wrote, or None."""
    return None if value is None else datetime.fromisoformat(value)


def from_timestamp(value: float | None) -> datetime | None:
    """A ``time.time()`` value (Ganeti's timestamps) as an aware UTC datetime, or None."""
    return None if value is None else datetime.fromtimestamp(value, UTC)
