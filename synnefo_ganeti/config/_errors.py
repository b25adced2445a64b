"""Pydantic's validation errors in words: one ``WHERE: KEY: PROBLEM`` line per bad key.

``WHERE`` is the environment variable that set the key when one did, else the config
file, else ``settings`` (keyword arguments). Inputs are never echoed: a bad value may
be a password.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import get_args, get_origin

from pydantic import BaseModel
from pydantic_core import ErrorDetails
from pydantic_settings import SettingsError

from synnefo_ganeti.config._loading import ENV_PREFIX

__all__ = ["describe_errors", "describe_settings_error"]


def _dotted(loc: Sequence[int | str]) -> str:
    return ".".join(str(part) for part in loc)


def _env_var_for(loc: Sequence[int | str]) -> str | None:
    """The ``SYNNEFO_GANETI__...`` variable that set the value at ``loc`` (or a table above it)."""
    names = {key.upper() for key in os.environ}
    for end in range(len(loc), 0, -1):
        parts = loc[:end]
        if any(isinstance(part, int) for part in parts):
            continue
        name = ENV_PREFIX + "__".join(str(part).upper() for part in parts)
        if name in names:
            return name
    return None


def _model_at(root: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The settings model under ``root`` that holds the value at ``loc``."""
    model = root
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        annotation = field.annotation
        if get_origin(annotation) is list:
            if not parts or not isinstance(parts[0], int):
                return None
            parts.pop(0)
            (annotation,) = get_args(annotation)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _message(root: type[BaseModel], error: ErrorDetails) -> str:
    loc = error["loc"]
    kind = error["type"]
    if kind == "missing":
        return "this key is required"
    if kind == "extra_forbidden" and loc:
        model = _model_at(root, loc[:-1])
        if model is None:
            return "unknown key"
        known = list(model.model_fields)
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1)
        did_you_mean = f"did you mean {hint[0]!r}? " if hint else ""
        return f"unknown key; {did_you_mean}the keys here are: {', '.join(known)}"
    if kind == "value_error":
        return error["msg"].removeprefix("Value error, ")
    return error["msg"]


def describe_errors(root: type[BaseModel], errors: Iterable[ErrorDetails], path: Path | None) -> str:
    """One line per error of validating ``root`` from the file ``path`` (``None``: no file)."""
    lines = []
    for error in errors:
        loc = error["loc"]
        env_var = _env_var_for(loc)
        if env_var is not None:
            where = f"environment variable {env_var}"
        elif path is not None:
            where = f"config file {path}"
        else:
            where = "settings"
        key = _dotted(loc)
        message = _message(root, error)
        lines.append(f"{where}: {key}: {message}" if key else f"{where}: {message}")
    return "\n".join(lines)


def describe_settings_error(exc: SettingsError) -> str:
    """pydantic-settings' error for an environment value it cannot parse, naming the variable."""
    match = re.search(r'field "([^"]+)"', str(exc))
    if match is None:
        return f"settings from the environment: {exc}"
    field = match.group(1)
    return (
        f"environment variable {ENV_PREFIX}{field.upper()}: {field}: cannot be parsed; "
        "lists and tables given in the environment must be JSON"
    )
