"""What the queue watcher reports and checks around its work: its counters, the kernel's inotify
limits, and how a queue file and an OS error are described."""

from __future__ import annotations

import errno
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from synnefo_ganeti.jobs import JobFileError

__all__ = [
    "MIN_QUEUED_EVENTS",
    "MIN_USER_WATCHES",
    "WatchStats",
    "check_inotify_limits",
    "file_identity",
    "os_reason",
]

log = logging.getLogger("synnefo_ganeti.watch")

#: below these, check_inotify_limits warns
MIN_QUEUED_EVENTS = 16384
MIN_USER_WATCHES = 1024


@dataclass(slots=True)
class WatchStats:
    """What one watcher did since it started."""

    scans: int = 0
    overflows: int = 0
    watch_lost: int = 0
    events: int = 0
    files_read: int = 0
    versions: int = 0
    coalesced: int = 0
    bad_files: int = 0
    vanished: int = 0
    #: files marked while another dispatcher read the folder (not read here)
    paused: int = 0
    #: versions read of a job whose end alone is stored here (``ends_only``), before its end
    not_ended: int = 0
    #: times :meth:`QueueWatcher.pause` stopped the watch
    pauses: int = 0


def check_inotify_limits(proc: Path = Path("/proc/sys/fs/inotify")) -> list[str]:
    """Warnings about inotify limits too low for a busy queue (also logged)."""
    warnings: list[str] = []
    for name, minimum, why in (
        (
            "max_queued_events",
            MIN_QUEUED_EVENTS,
            "a burst of job-file writes overflows it (then the watcher rescans)",
        ),
        (
            "max_user_watches",
            MIN_USER_WATCHES,
            "the watcher and other programs of this user may run out of watches",
        ),
    ):
        try:
            value = int((proc / name).read_text().strip())
        except (OSError, ValueError):
            continue
        if value < minimum:
            warnings.append(
                f"fs.inotify.{name} is {value}, below {minimum}: {why}; raise it with "
                f"'sysctl fs.inotify.{name}={minimum * 4}'"
            )
    for warning in warnings:
        log.warning("%s", warning)
    return warnings


def file_identity(path: str) -> tuple[int, ...] | None:
    """Which file (or symlink) ``path`` is now: another version is another inode or content."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def os_reason(exc: OSError | BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "does not exist"
    if isinstance(exc, PermissionError):
        return "permission denied (run the watcher as a user that can read Ganeti's queue, e.g. root or group gnt-masterd)"
    if isinstance(exc, NotADirectoryError):
        return "is not a directory"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def read_job_file(path: str, max_bytes: int) -> bytes:
    """One job file's bytes: a regular file, never through a symlink, at most ``max_bytes``
    (:class:`~synnefo_ganeti.jobs.JobFileError` otherwise; an ``OSError`` as the OS gave it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise JobFileError("a symlink; Ganeti writes job files as regular files") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise JobFileError("not a regular file")
        if info.st_size > max_bytes:
            raise JobFileError(f"{info.st_size} bytes, more than the {max_bytes} a job file may have")
        chunks = []
        size = 0
        while True:
            chunk = os.read(fd, max(info.st_size + 1, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise JobFileError(f"more than the {max_bytes} bytes a job file may have")
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)
