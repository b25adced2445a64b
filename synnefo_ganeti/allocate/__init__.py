"""Placement of new instances on backends: credits weighed by how fast each drains, round-robin to
compare; and, inside a backend, the node (:mod:`._nodes`), never one down or offline (:mod:`._liveness`);
how many more of a flavor fit, now and keeping N+1 (:mod:`._capacity`, after hspace); the groups of
a rolling maintenance (:mod:`._maintenance`, after hroller)."""

from __future__ import annotations

from synnefo_ganeti.allocate._addresses import (
    NetworkPool,
    address_shortage,
    backend_range,
    network_refusals,
    reserved_elsewhere,
)
from synnefo_ganeti.allocate._capacity import (
    LOCAL_STORAGE_TEMPLATES,
    CapacityNode,
    Flavor,
    FlavorCapacity,
    HostedInstance,
    capacity_nodes,
    count_capacity,
    hosted_instances,
    policy_refusal,
)
from synnefo_ganeti.allocate._catalog import Catalog, check_name, check_numbers, check_spec, refusals
from synnefo_ganeti.allocate._liveness import NodeChange, NodeLiveness, NodeState, NodeStateName
from synnefo_ganeti.allocate._maintenance import (
    MaintenanceGroup,
    MaintenanceInstance,
    MaintenanceNode,
    MaintenancePlan,
    maintenance_inputs,
    plan_maintenance,
)
from synnefo_ganeti.allocate._nodes import (
    MIRRORED_TEMPLATES,
    NodeLoad,
    choose_nodes,
    chooses_nodes,
    placed_spec,
)
from synnefo_ganeti.allocate._offers import (
    BackendCatalog,
    GroupOffer,
    InstancePolicy,
    NetworkLink,
    NetworkOffer,
    NodeStats,
    OsOffer,
)
from synnefo_ganeti.allocate._placement import Allocator, NoCapacityError, Strategy
from synnefo_ganeti.allocate._views import BackendView, Pending, Requirement, Reservation

__all__ = [
    "LOCAL_STORAGE_TEMPLATES",
    "MIRRORED_TEMPLATES",
    "Allocator",
    "BackendCatalog",
    "BackendView",
    "CapacityNode",
    "Catalog",
    "Flavor",
    "FlavorCapacity",
    "GroupOffer",
    "HostedInstance",
    "InstancePolicy",
    "MaintenanceGroup",
    "MaintenanceInstance",
    "MaintenanceNode",
    "MaintenancePlan",
    "NetworkLink",
    "NetworkOffer",
    "NetworkPool",
    "NoCapacityError",
    "NodeChange",
    "NodeLiveness",
    "NodeLoad",
    "NodeState",
    "NodeStateName",
    "NodeStats",
    "OsOffer",
    "Pending",
    "Requirement",
    "Reservation",
    "Strategy",
    "address_shortage",
    "backend_range",
    "capacity_nodes",
    "check_name",
    "check_numbers",
    "check_spec",
    "choose_nodes",
    "chooses_nodes",
    "count_capacity",
    "hosted_instances",
    "maintenance_inputs",
    "network_refusals",
    "placed_spec",
    "plan_maintenance",
    "policy_refusal",
    "refusals",
    "reserved_elsewhere",
]
