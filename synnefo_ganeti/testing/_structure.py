"""Structural comparison of JSON documents: same keys and value types at every level.

Used to hold the fake Ganeti to real Ganeti's shapes: values may differ (names,
ids, timestamps), shapes may not.
"""

from __future__ import annotations

from typing import Any

__all__ = ["shape_of", "structure_diff"]


def shape_of(value: Any) -> Any:
    """A value's shape: dicts keep their keys, lists become ``list-of`` or positional ``tuple``."""
    if isinstance(value, dict):
        return {key: shape_of(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        shapes = [shape_of(item) for item in value]
        if not shapes:
            return ("list",)
        if all(shape == shapes[0] for shape in shapes):
            return ("list", shapes[0])
        return ("tuple", *shapes)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return type(value).__name__


def structure_diff(expected: Any, actual: Any, path: str = "$") -> list[str]:
    """Where ``actual`` differs in shape from ``expected``; empty when they agree.

    Dicts must have the same keys; lists are compared element-wise by shape (an
    empty list agrees with any list; a list whose items differ in shape is a
    positional tuple); scalars by JSON type (``int`` and ``float`` are distinct,
    ``null`` is its own type).
    """
    return _diff(shape_of(expected), shape_of(actual), path)


def _diff(expected: Any, actual: Any, path: str) -> list[str]:
    if isinstance(expected, dict) or isinstance(actual, dict):
        if not (isinstance(expected, dict) and isinstance(actual, dict)):
            return [f"{path}: expected {_name(expected)}, got {_name(actual)}"]
        problems = [f"{path}: missing key {key!r}" for key in expected if key not in actual]
        problems += [f"{path}: unexpected key {key!r}" for key in actual if key not in expected]
        for key in expected:
            if key in actual:
                problems += _diff(expected[key], actual[key], f"{path}.{key}")
        return problems
    if isinstance(expected, tuple) or isinstance(actual, tuple):
        if not (isinstance(expected, tuple) and isinstance(actual, tuple)):
            return [f"{path}: expected {_name(expected)}, got {_name(actual)}"]
        if len(expected) == 1 or len(actual) == 1:  # an empty list agrees with any list
            return []
        if expected[0] == "list" and actual[0] == "list":
            return _diff(expected[1], actual[1], f"{path}[]")
        exp_items = list(expected[1:]) if expected[0] == "tuple" else None
        act_items = list(actual[1:]) if actual[0] == "tuple" else None
        if exp_items is not None and act_items is not None:
            if len(exp_items) != len(act_items):
                return [f"{path}: expected {len(exp_items)} positions, got {len(act_items)}"]
            positional: list[str] = []
            for index, (exp, act) in enumerate(zip(exp_items, act_items, strict=True)):
                positional += _diff(exp, act, f"{path}[{index}]")
            return positional
        items = exp_items if exp_items is not None else act_items
        single = actual[1] if exp_items is not None else expected[1]
        assert items is not None
        mixed: list[str] = []
        for index, item in enumerate(items):
            pair = (item, single) if exp_items is not None else (single, item)
            mixed += _diff(*pair, f"{path}[{index}]")
        return mixed
    if expected != actual:
        return [f"{path}: expected {_name(expected)}, got {_name(actual)}"]
    return []


def _name(shape: Any) -> str:
    if isinstance(shape, dict):
        return "object"
    if isinstance(shape, tuple):
        return "list"
    return str(shape)
