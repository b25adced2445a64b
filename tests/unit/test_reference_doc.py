"""docs/reference.md holds every field of every public model, and no field that is not there.

The models are the data classes, pydantic models, named tuples and enums that
``synnefo_ganeti.__all__`` exports, and the ones their fields hold (``StoredNetwork.backends``'
``NetworkOnBackend``, ``BackendCatalog``'s offers, ...), found from the type hints, so a new
field or a new model fails here until the reference describes it. ``Settings`` is there by its
sections (their keys are in docs/control-plane.md and the pages it names). The errors: every
exported error has a row in the errors table naming its own attributes.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import synnefo_ganeti
from synnefo_ganeti.config import Settings
from synnefo_ganeti.errors import GanetiError

REFERENCE = Path(__file__).parents[2] / "docs" / "reference.md"
HEADING = re.compile(r"^(#{2,4}) (.*)$")
FIRST_CELL = re.compile(r"^\| `([^`]+)` \|")


def sections() -> dict[str, str]:
    """Each ``### `Name` `` section's text, up to the next heading of any level."""
    found: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in REFERENCE.read_text().splitlines():
        heading = HEADING.match(line)
        if heading:
            if name is not None:
                found[name] = "\n".join(lines)
            names = re.findall(r"`([^`]+)`", heading.group(2))
            name, lines = (names[0] if names else heading.group(2)), []
        else:
            lines.append(line)
    if name is not None:
        found[name] = "\n".join(lines)
    return found


def is_model(cls: Any) -> bool:
    return inspect.isclass(cls) and (
        dataclasses.is_dataclass(cls)
        or issubclass(cls, BaseModel)
        or (issubclass(cls, tuple) and hasattr(cls, "_fields"))
        or issubclass(cls, enum.Enum)
    )


def fields_of(cls: Any) -> list[str]:
    if issubclass(cls, enum.Enum):
        return [str(member.value) for member in cls]
    if dataclasses.is_dataclass(cls):
        return [field.name for field in dataclasses.fields(cls)]
    if issubclass(cls, BaseModel):
        return list(cls.model_fields)
    return list(cls._fields)


def hints_of(cls: Any) -> list[Any]:
    if issubclass(cls, enum.Enum):
        return []
    if issubclass(cls, BaseModel):
        return [field.annotation for field in cls.model_fields.values()]
    return list(typing.get_type_hints(cls).values())


def classes_in(annotation: Any) -> list[Any]:
    found = [annotation] if inspect.isclass(annotation) else []
    for arg in typing.get_args(annotation):
        found += classes_in(arg)
    return found


def public_models() -> dict[str, Any]:
    """The exported models and, recursively, the models their fields hold (Settings alone)."""
    todo = [getattr(synnefo_ganeti, name) for name in synnefo_ganeti.__all__]
    models: dict[str, Any] = {}
    while todo:
        cls = todo.pop()
        if not is_model(cls) or not cls.__module__.startswith("synnefo_ganeti") or cls.__name__ in models:
            continue
        models[cls.__name__] = cls
        if cls is not Settings:
            for hint in hints_of(cls):
                todo += classes_in(hint)
    return models


MODELS = public_models()


def test_the_models_are_found() -> None:
    expected = {"StoredInstance", "Request", "Change", "Node", "InstanceSpec", "StoredNetwork",
                "NetworkOnBackend", "BackendCatalog", "NodeStats", "InstanceStatus", "Settings"}  # fmt: skip
    assert expected <= set(MODELS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_field_is_in_the_reference(name: str) -> None:
    text = sections().get(name)
    assert text is not None, f"docs/reference.md has no section '### `{name}`'"
    missing = [field for field in fields_of(MODELS[name]) if f"`{field}`" not in text]
    assert not missing, f"docs/reference.md, section {name}: fields not described: {missing}"


@pytest.mark.parametrize("name", sorted(n for n, cls in MODELS.items() if not issubclass(cls, enum.Enum)))
def test_the_reference_names_no_field_the_model_lacks(name: str) -> None:
    rows = [m.group(1) for line in sections()[name].splitlines() if (m := FIRST_CELL.match(line))]
    extra = sorted(set(rows) - set(fields_of(MODELS[name])))
    assert not extra, f"docs/reference.md, section {name}: rows of no field: {extra}"


def test_the_nic_default_is_described() -> None:
    text = sections()["NICs and the NIC default"]
    assert synnefo_ganeti.InstanceSpec(name="a", disk_template="diskless", os="noop").nics == [{}]
    assert "`[{}]`" in text and "one NIC" in text


def test_every_error_has_a_row_with_its_attributes() -> None:
    rows = {m.group(1): line for line in sections()["Errors"].splitlines() if (m := FIRST_CELL.match(line))}
    errors = [
        getattr(synnefo_ganeti, name)
        for name in synnefo_ganeti.__all__
        if inspect.isclass(getattr(synnefo_ganeti, name))
        and issubclass(getattr(synnefo_ganeti, name), GanetiError)
    ]
    assert errors
    for error in errors:
        assert error.__name__ in rows, f"docs/reference.md: no row for {error.__name__}"
        if "__init__" not in vars(error):
            continue  # its parent's attributes, in the parent's row
        # the attributes its own __init__ adds (keyword arguments beyond message and url)
        own = [
            p for p in inspect.signature(error.__init__).parameters
            if p not in ("self", "message", "url", "args", "kwargs")
        ]  # fmt: skip
        missing = [p for p in own if f"`{p}`" not in rows[error.__name__]]
        assert not missing, f"docs/reference.md: {error.__name__}'s row does not name {missing}"


def test_the_readme_links_the_reference() -> None:
    readme = (REFERENCE.parents[1] / "README.md").read_text()
    assert "(docs/reference.md)" in readme
