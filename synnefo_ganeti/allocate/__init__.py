"""Placement of new instances on backends: credit-based balancing, round-robin for comparison."""

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
