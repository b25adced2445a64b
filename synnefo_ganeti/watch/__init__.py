"""The job-queue watcher: inotify on Ganeti's queue directory turns job-file changes into stored events;
and Synnefo eventd's messages from the same job files (:mod:`synnefo_ganeti.watch._eventd`)."""

from __future__ import annotations

from synnefo_ganeti.watch._eventd import (
    EventdMessage,
    InstanceInfo,
    eventd_messages,
    instances_needing_info,
    needs_instance_info,
)
from synnefo_ganeti.watch._support import WatchStats, check_inotify_limits
from synnefo_ganeti.watch._watcher import QueueWatcher

__all__ = [
    "EventdMessage",
    "InstanceInfo",
    "QueueWatcher",
    "WatchStats",
    "check_inotify_limits",
    "eventd_messages",
    "instances_needing_info",
    "needs_instance_info",
]
