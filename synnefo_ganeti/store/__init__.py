"""The job store: SQLAlchemy 2 async over SQLite (embedded default) or PostgreSQL (production).

``async with Store(url) as store:`` opens it (creating the schema in an empty
database); :meth:`Store.put` queues job-file versions for its one batching writer;
:meth:`Store.get_job`, :meth:`Store.list_jobs` and :meth:`Store.events` read.
"""

from __future__ import annotations

from synnefo_ganeti.errors import RequestNotHeldError
from synnefo_ganeti.store._store import (
    CommitInfo,
    JobVersion,
    PruneResult,
    Store,
    StoredEvent,
    StoredJob,
    StoredOp,
    WriterStats,
    upgrade_database,
)
from synnefo_ganeti.store.backends._backends import NodeRow
from synnefo_ganeti.store.changes._changes import Change
from synnefo_ganeti.store.db._migrate import current_revision, head_revision, upgrade
from synnefo_ganeti.store.db._urls import display_url, normalize_url
from synnefo_ganeti.store.instances._instances import (
    InstanceAction,
    InstanceStatus,
    StoredInstance,
    instance_status_after,
)
from synnefo_ganeti.store.instances._node_errors import NodeFault, is_node_error, node_fault
from synnefo_ganeti.store.instances._observed import OBSERVED_FIELDS, record_observed, store_observed
from synnefo_ganeti.store.jobs._events import EventsSignal
from synnefo_ganeti.store.networks._networks import (
    NetworkOnBackend,
    NetworkState,
    NetworkStore,
    StoredNetwork,
)
from synnefo_ganeti.store.operations._incidents import INCIDENT_KINDS, OUTCOMES, Incident, IncidentStore
from synnefo_ganeti.store.operations._status import (
    AuditRecord,
    DispatcherReport,
    ReconcileRecord,
    StatusStore,
)
from synnefo_ganeti.store.requests._lost import stranded_backend, stranded_jobs
from synnefo_ganeti.store.requests._requests import Request, RequestStatus, new_request_id, request_tag
from synnefo_ganeti.store.requests._settle import (
    is_backend_error,
    is_capacity_error,
    is_job_death_error,
    is_name_taken_error,
)

__all__ = [
    "INCIDENT_KINDS",
    "OBSERVED_FIELDS",
    "OUTCOMES",
    "AuditRecord",
    "Change",
    "CommitInfo",
    "DispatcherReport",
    "EventsSignal",
    "Incident",
    "IncidentStore",
    "InstanceAction",
    "InstanceStatus",
    "JobVersion",
    "NetworkOnBackend",
    "NetworkState",
    "NetworkStore",
    "NodeFault",
    "NodeRow",
    "PruneResult",
    "ReconcileRecord",
    "Request",
    "RequestNotHeldError",
    "RequestStatus",
    "StatusStore",
    "Store",
    "StoredEvent",
    "StoredInstance",
    "StoredJob",
    "StoredNetwork",
    "StoredOp",
    "WriterStats",
    "current_revision",
    "display_url",
    "head_revision",
    "instance_status_after",
    "is_backend_error",
    "is_capacity_error",
    "is_job_death_error",
    "is_name_taken_error",
    "is_node_error",
    "new_request_id",
    "node_fault",
    "normalize_url",
    "record_observed",
    "request_tag",
    "store_observed",
    "stranded_backend",
    "stranded_jobs",
    "upgrade",
    "upgrade_database",
]
