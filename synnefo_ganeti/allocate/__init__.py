"""Placement of new instances on backends: credits weighed by how fast each drains, round-robin to compare."""

from __future__ import annotations

from synnefo_ganeti.allocate._placement import (
    Allocator,
    BackendView,
    NoCapacityError,
    Pending,
    Requirement,
    Reservation,
    Strategy,
)

__all__ = ["Allocator", "BackendView", "NoCapacityError", "Pending", "Requirement", "Reservation", "Strategy"]
