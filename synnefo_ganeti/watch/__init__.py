"""The job-queue watcher: inotify on Ganeti's queue directory turns job-file changes into stored events."""

from __future__ import annotations

from synnefo_ganeti.watch._support import WatchStats, check_inotify_limits
from synnefo_ganeti.watch._watcher import QueueWatcher

__all__ = ["QueueWatcher", "WatchStats", "check_inotify_limits"]
