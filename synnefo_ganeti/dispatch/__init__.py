"""The dispatcher daemon (``synnefo-ganeti dispatcher``): durable requests to jobs, on many backends.

See :class:`Dispatcher` for what it runs; :class:`JobTracker` follows the jobs of a
backend whose queue directory is not local; :class:`DispatcherLock` tells live
dispatchers from dead ones.
"""

from __future__ import annotations

from synnefo_ganeti.dispatch._dispatcher import DAEMON_FIXES, Dispatcher, DispatcherStats
from synnefo_ganeti.dispatch._liveness import DispatcherLock, new_dispatcher_id
from synnefo_ganeti.dispatch._tracker import JobTracker

__all__ = [
    "DAEMON_FIXES",
    "Dispatcher",
    "DispatcherLock",
    "DispatcherStats",
    "JobTracker",
    "new_dispatcher_id",
]
