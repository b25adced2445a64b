"""The reconciler: what differs between the database and the Ganeti clusters, and its fixes.

:func:`plan` is pure (two snapshots in, a list of :class:`Drift` out); :func:`apply`
does the fixes it is asked for; :class:`Reconciler` runs both over every backend at
once (``run_once``) or forever (``run_forever``, the daemon), with the network and address
drifts of each backend (:class:`NetworkDrift`, ``reconcile/_networks.py``).
"""

from __future__ import annotations

from synnefo_ganeti.reconcile._networks import FIXABLE as NETWORK_FIXES
from synnefo_ganeti.reconcile._networks import NetworkDrift, NetworkDriftKind
from synnefo_ganeti.reconcile._plan import (
    BUILD_GRACE,
    DbSnapshot,
    Drift,
    DriftKind,
    Fix,
    GanetiSnapshot,
    ganeti_state,
    plan,
)
from synnefo_ganeti.reconcile._reconciler import (
    BackendReport,
    Reconciler,
    Report,
    apply,
    job_file,
    snapshot_db,
    snapshot_ganeti,
)

__all__ = [
    "BUILD_GRACE",
    "NETWORK_FIXES",
    "BackendReport",
    "DbSnapshot",
    "Drift",
    "DriftKind",
    "Fix",
    "GanetiSnapshot",
    "NetworkDrift",
    "NetworkDriftKind",
    "Reconciler",
    "Report",
    "apply",
    "ganeti_state",
    "job_file",
    "plan",
    "snapshot_db",
    "snapshot_ganeti",
]
