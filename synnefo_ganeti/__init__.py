"""synnefo-ganeti: an asyncio control plane for Ganeti clusters.

The public face of the package; everything here is a stable name.
"""

from __future__ import annotations

from synnefo_ganeti._version import __version__
from synnefo_ganeti.config import Settings
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.errors import (
    AuthenticationError,
    BadRequestError,
    ConfigError,
    ConflictError,
    CreateOutcomeUnknownError,
    GanetiError,
    InvalidError,
    JobFailedError,
    JobFileError,
    JobNotFoundError,
    NoCapacityError,
    NotFoundError,
    RapiConnectionError,
    RapiError,
    RapiNotFoundError,
    RapiTimeoutError,
    RequestNotHeldError,
    RequestTimeoutError,
    StoreError,
    TLSError,
    TransportError,
    UnavailableError,
)
from synnefo_ganeti.jobs import FINAL_STATUSES, JobStatus, calc_job_status
from synnefo_ganeti.rapi import (
    CancelResult,
    ClusterInfo,
    CreateProgress,
    Instance,
    InstanceSpec,
    Job,
    JobFailure,
    LogEntry,
    Node,
    RapiClient,
    RebootType,
    RetryPolicy,
    Timestamp,
)
from synnefo_ganeti.store import InstanceStatus, Request, RequestStatus, StoredInstance

__all__ = [
    "FINAL_STATUSES",
    "AuthenticationError",
    "BadRequestError",
    "CancelResult",
    "ClusterInfo",
    "ConfigError",
    "ConflictError",
    "ControlPlane",
    "CreateOutcomeUnknownError",
    "CreateProgress",
    "GanetiError",
    "Instance",
    "InstanceSpec",
    "InstanceStatus",
    "InvalidError",
    "Job",
    "JobFailedError",
    "JobFailure",
    "JobFileError",
    "JobNotFoundError",
    "JobStatus",
    "LogEntry",
    "NoCapacityError",
    "Node",
    "NotFoundError",
    "RapiClient",
    "RapiConnectionError",
    "RapiError",
    "RapiNotFoundError",
    "RapiTimeoutError",
    "RebootType",
    "Request",
    "RequestNotHeldError",
    "RequestStatus",
    "RequestTimeoutError",
    "RetryPolicy",
    "Settings",
    "StoreError",
    "StoredInstance",
    "TLSError",
    "Timestamp",
    "TransportError",
    "UnavailableError",
    "__version__",
    "calc_job_status",
]
