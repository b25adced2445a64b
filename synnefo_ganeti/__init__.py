"""synnefo-ganeti: an asyncio control plane for Ganeti clusters.

The public face of the package; everything here is a stable name.
"""

from __future__ import annotations

from synnefo_ganeti._version import __version__
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.errors import (
    AuthenticationError,
    BadRequestError,
    ConfigError,
    CreateOutcomeUnknownError,
    GanetiError,
    JobFailedError,
    JobNotFoundError,
    NotFoundError,
    RapiConnectionError,
    RapiError,
    RapiTimeoutError,
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
    RetryPolicy,
    Timestamp,
)

__all__ = [
    "FINAL_STATUSES",
    "AuthenticationError",
    "BadRequestError",
    "CancelResult",
    "ClusterInfo",
    "ConfigError",
    "ControlPlane",
    "CreateOutcomeUnknownError",
    "CreateProgress",
    "GanetiError",
    "Instance",
    "InstanceSpec",
    "Job",
    "JobFailedError",
    "JobFailure",
    "JobNotFoundError",
    "JobStatus",
    "LogEntry",
    "Node",
    "NotFoundError",
    "RapiClient",
    "RapiConnectionError",
    "RapiError",
    "RapiTimeoutError",
    "RetryPolicy",
    "StoreError",
    "TLSError",
    "Timestamp",
    "TransportError",
    "UnavailableError",
    "__version__",
    "calc_job_status",
]
