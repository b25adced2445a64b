"""The pooled asyncio client of Ganeti's RAPI.

``async with RapiClient(url, username=..., password=..., ca_file=...) as rapi:``
then ``await rapi.create_instances(specs)``. See :class:`RapiClient`.
"""

from __future__ import annotations

from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.rapi._api_query import cell_values
from synnefo_ganeti.rapi._calls import (
    REASON_PREFIX,
    CreateProgress,
    NodeRole,
    RebootType,
    job_reason,
    new_request_id,
)
from synnefo_ganeti.rapi._client import RapiClient
from synnefo_ganeti.rapi._models import (
    CancelResult,
    ClusterInfo,
    FilterRule,
    Group,
    Instance,
    InstanceConsole,
    InstanceSpec,
    Job,
    JobFailure,
    LogEntry,
    Network,
    Node,
    QueryField,
    QueryResult,
    Timestamp,
)
from synnefo_ganeti.rapi._retry import RetryPolicy, is_transient, is_unsent
from synnefo_ganeti.rapi._tls import parse_fingerprint
from synnefo_ganeti.rapi._versions import GanetiVersion

__all__ = [
    "REASON_PREFIX",
    "CancelResult",
    "ClusterInfo",
    "CreateProgress",
    "FilterRule",
    "GanetiVersion",
    "Group",
    "Instance",
    "InstanceConsole",
    "InstanceSpec",
    "Job",
    "JobFailure",
    "JobStatus",
    "LogEntry",
    "Network",
    "Node",
    "NodeRole",
    "QueryField",
    "QueryResult",
    "RapiClient",
    "RebootType",
    "RetryPolicy",
    "Timestamp",
    "cell_values",
    "is_transient",
    "is_unsent",
    "job_reason",
    "new_request_id",
    "parse_fingerprint",
]
