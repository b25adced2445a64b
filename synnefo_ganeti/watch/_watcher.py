"""The job-queue watcher: inotify on Ganeti's queue directory, job-file versions into the store.

Ganeti writes every version of ``job-<id>`` to a temp file (``job-<id>-<pid>-<n>.tmp``
or ``job-<id>XXXXXXXX.new``) and renames it into place, and archives a job by renaming
it to ``archive/<id // 10000>/job-<id>``. The watcher:

* watches the queue directory, ``archive/`` and every ``archive/<n>/`` for
  ``MOVED_TO`` and ``CLOSE_WRITE`` (and ``CREATE`` of archive folders), and acts only on
  names that are exactly ``job-`` and ASCII digits (not ``job-7.tmp``, ``job-7\\n``);
* marks such a path pending; a reader task, woken, waits ``read_linger`` (3 ms) and reads
  the pending paths, handing each version to the store. A path marked again before it is
  read is read once: Ganeti replaced that version already, the latest wins (the versions a
  job's file gets in one moment, as at its submit, are read as one);
* scans everything at start (watches first, then the scan, so nothing slips between),
  and again after an inotify queue overflow or when its watch is lost (the directory
  removed, moved or recreated); archived jobs the store already holds as final are
  not read again;
* skips a bad file (truncated, not UTF-8 or JSON, too large, a symlink, not shaped like
  a job, or naming another job), logging it once with its path and counting it once
  per bad version (a rescan reading the same file again neither logs nor counts); it
  is read again on its next change;
* survives a missing or unreadable queue directory: a log line, then retries;
* can be paused (no inotify instance at all) while another dispatcher reads the folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from asyncinotify import Inotify, Mask, Watch

from synnefo_ganeti import metrics
from synnefo_ganeti.jobs._files import MAX_JOB_FILE_BYTES
from synnefo_ganeti.store import JobVersion, Store
from synnefo_ganeti.watch._reading import JOB_NAME, JobFileReader
from synnefo_ganeti.watch._support import WatchStats, check_inotify_limits, os_reason

__all__ = ["READ_LINGER", "QueueWatcher", "VersionSink", "WatchStats", "check_inotify_limits"]

log = logging.getLogger("synnefo_ganeti.watch")

ARCHIVE_FOLDER = re.compile(r"^[0-9]+\Z")
_NOTHING: frozenset[int] = frozenset()
#: struct inotify_event: wd, mask, cookie, len, then len bytes of NUL-padded name
_EVENT = struct.Struct("iIII")
_READ_SIZE = 256 * 1024
_ISDIR = int(Mask.ISDIR)
_IGNORED = int(Mask.IGNORED)
_OVERFLOW = int(Mask.Q_OVERFLOW)
#: yield to the event loop after this many versions read in a row
_READS_PER_TURN = 32
#: seconds the reader waits after a wake before it reads what is marked: the versions of a job
#: written in the same moment (Ganeti's luxid writes a new job's file three times) are read
#: once, the last; 15 % fewer versions read and stored in a burst of creates (issue 31)
READ_LINGER = 0.003
_linger = asyncio.sleep  # (tests hold the linger open)

_FILE_EVENTS = Mask.MOVED_TO | Mask.CLOSE_WRITE

_SELF_GONE = Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED | Mask.UNMOUNT
_FILE_EVENTS_BITS = int(_FILE_EVENTS)
_SELF_GONE_BITS = int(_SELF_GONE)
_ROOT_MASK = _FILE_EVENTS | Mask.CREATE | Mask.MOVED_FROM | Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.ONLYDIR
_ARCHIVE_MASK = Mask.CREATE | Mask.MOVED_TO | Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.ONLYDIR
_FOLDER_MASK = _FILE_EVENTS | Mask.DELETE_SELF | Mask.ONLYDIR


class VersionSink(Protocol):
    """Where the watcher hands what it reads: the :class:`~synnefo_ganeti.store.Store`, or
    another consumer of job-file versions (the eventd publisher)."""

    async def put(self, version: JobVersion) -> None: ...
    async def archived_final_job_ids(self, backend: str) -> set[int]: ...


class _WatchLost(Exception):
    """The queue directory's own watch went away: set everything up again."""


class QueueWatcher:
    """Watches one backend's job-queue directory and stores every job-file version it reads.

    ``await watcher.run()`` runs until :meth:`stop` (or cancellation); it never raises
    for trouble with the directory or its files. ``ready`` is set once the first scan
    has been queued for the store.
    """

    def __init__(
        self,
        queue_dir: str | os.PathLike[str],
        store: Store | VersionSink,
        backend: str,
        *,
        retry_interval: float = 2.0,
        max_file_bytes: int = MAX_JOB_FILE_BYTES,
        read_batch: int = 512,
        read_linger: float = READ_LINGER,
        wants: Callable[[int], bool] | None = None,
        ends_only: Callable[[int], bool] | None = None,
        archive: bool = True,
    ) -> None:
        self.queue_dir = Path(queue_dir)
        self._queue_path = os.fspath(self.queue_dir)
        #: which jobs' files to read now (None: all); what inotify marks of the others is dropped.
        #: :meth:`resume` scans the folder again, so that nothing written meanwhile is missed
        self.wants = wants
        #: of the jobs read, those whose end alone is stored (None: none)
        self.ends_only = ends_only
        #: watch and read ``archive/`` too (False: only the queue directory's own ``job-N``
        #: files; the eventd publisher, which publishes a job's end from the queue directory)
        self.archive = archive
        self.store = store
        self.backend = backend
        self.retry_interval = retry_interval
        self.max_file_bytes = max_file_bytes
        self.read_batch = read_batch
        #: seconds the reader waits once woken, so that the versions written together are read once
        self.read_linger = read_linger
        self.stats = WatchStats()
        self.ready = asyncio.Event()
        self._pending: dict[str, bool] = {}  # path -> archived?, in the order marked
        self._active = asyncio.Event()  # cleared by pause(): no inotify instance meanwhile
        self._active.set()
        self._readable: asyncio.Event | None = None  # the inotify reader's wake (pause() sets it)
        self._has_pending = asyncio.Event()
        self._stopping = asyncio.Event()
        self._inotify: Inotify | None = None
        self._watches: dict[str, Watch] = {}
        self._by_wd: dict[int, Watch] = {}
        self._root_watch: Watch | None = None
        self._files = JobFileReader(backend, self.stats)  # (reads, bad files, their counts)

    def __repr__(self) -> str:
        return f"<QueueWatcher {self.backend} {self.queue_dir}>"

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` stopped the watch (until :meth:`resume`)."""
        return not self._active.is_set()

    def pause(self) -> None:
        """Stop watching (the inotify instance closed: no event made or read meanwhile) and
        forget what is marked, until :meth:`resume`: while another dispatcher reads the folder.
        Each version Ganeti writes makes four events for every watcher of the folder."""
        if self._active.is_set():
            self._active.clear()
            self.stats.pauses += 1
            self._pending.clear()
            if self._readable is not None:
                self._readable.set()

    def resume(self) -> None:
        """Read every job file again (the store keeps only what is newer): after a time when
        ``wants`` said no, so that what changed meanwhile is read now. Paused: watch again
        first (then the scan)."""
        if not self._active.is_set():
            self._active.set()
        elif self._inotify is not None:
            self._scan("resumed")

    def stop(self) -> None:
        """Ask :meth:`run` to read what is pending, hand it to the store, and return."""
        self._stopping.set()
        self._has_pending.set()

    async def run(self) -> None:
        check_inotify_limits()
        watcher = asyncio.create_task(self._watch_forever(), name=f"watch {self.backend}")
        reader = asyncio.create_task(self._reader(), name=f"watch-reader {self.backend}")
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            done, _ = await asyncio.wait({watcher, reader, stopping}, return_when=asyncio.FIRST_COMPLETED)
            for task in (watcher, reader):
                if task in done:
                    task.result()  # an unexpected error: let it be seen
        finally:
            stopping.cancel()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self.stop()
            await reader

    # -- inotify -----------------------------------------------------------------------------------

    async def _watch_forever(self) -> None:
        problem: str | None = None
        while True:
            if not self._active.is_set():
                self.ready.set()  # (paused before its first watch: nothing to wait for)
                await self._active.wait()
            try:
                with Inotify(cache_size=1024) as inotify:
                    self._inotify = inotify
                    self._watches.clear()
                    self._by_wd.clear()
                    self._root_watch = self._add_watch(self.queue_dir, _ROOT_MASK)
                    self._watch_archive()
                    if problem is not None:
                        log.warning("queue directory %s is usable again; rescanning", self.queue_dir)
                        problem = None
                    self._scan(
                        "start" if self.stats.scans == 0 else "resumed" if self.stats.pauses else "watch_lost"
                    )
                    self.ready.set()
                    await self._follow(inotify)
            except _WatchLost:
                self.stats.watch_lost += 1
                log.warning(
                    "lost the watch on %s (removed, moved or replaced); watching it again", self.queue_dir
                )
                continue
            except OSError as exc:
                reason = os_reason(exc)
                if reason != problem:
                    log.error(
                        "queue directory %s: %s; retrying every %g s",
                        self.queue_dir,
                        reason,
                        self.retry_interval,
                    )
                    problem = reason
                self.ready.set()
                await asyncio.sleep(self.retry_interval)
            finally:
                self._inotify = None

    async def _follow(self, inotify: Inotify) -> None:
        """Read the events off the inotify descriptor, decoding only those that can matter.

        Each version Ganeti writes makes four events here (``CREATE``, ``CLOSE_WRITE`` and
        ``MOVED_FROM`` of its temp file, ``MOVED_TO`` of ``job-<id>``) and only the last
        one matters; decoding each as an asyncinotify event (a Path, a Mask, an Event)
        cost more than reading and parsing the file. An event about a name that is
        neither a folder nor ``job-<id>`` is counted and dropped; the others go
        through :meth:`on_event`.
        """
        loop = asyncio.get_running_loop()
        fd = inotify.fd
        # asyncinotify's InitFlags.NONBLOCK is O_CLOEXEC's value: its descriptor blocks, and a
        # read after a stale readiness callback would block the event loop for good.
        os.set_blocking(fd, False)
        readable = self._readable = asyncio.Event()
        loop.add_reader(fd, readable.set)
        try:
            while True:
                await readable.wait()
                readable.clear()
                if not self._active.is_set():
                    return  # paused: the inotify instance is closed
                try:
                    data = os.read(fd, _READ_SIZE)
                except BlockingIOError:
                    continue
                self._dispatch(data)
        finally:
            self._readable = None
            loop.remove_reader(fd)

    def _dispatch(self, data: bytes) -> None:
        watches = self._by_wd
        offset, end, size = 0, len(data), _EVENT.size
        while offset < end:
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            offset += size
            name: str | None = None
            if length:
                raw = data[offset : offset + length].rstrip(b"\0")
                offset += length
                if raw:
                    # JOB_NAME on the bytes (bytes.isdigit is ASCII digits alone): most events of
                    # a busy queue are its temp files', three a version beside the job file's
                    if not mask & _ISDIR and (raw[:4] != b"job-" or not raw[4:].isdigit()):
                        self.stats.events += 1  # a temp file, serial, ...: nothing to do
                        continue
                    name = os.fsdecode(raw)
            watch = watches.get(wd)
            if mask & _IGNORED:
                watches.pop(wd, None)
            self.on_event(mask, watch, name)

    def on_event(self, mask: int, watch: Watch | None, name: str | os.PathLike[str] | None) -> None:
        """Handle one decoded inotify event (the boundary tests inject overflows at): its mask
        (an ``int``: a flag enum's every ``&`` made a new member, slow per event; a ``Mask`` is
        taken too) and the name in the watched folder. A job file's version that another
        dispatcher reads (``wants``) is dropped here, before it is marked."""
        self.stats.events += 1
        bits = int(mask)
        if bits & _OVERFLOW:
            self.stats.overflows += 1
            log.warning("inotify queue overflow on %s: rescanning (no change is lost)", self.queue_dir)
            self._scan("overflow")
            return
        if watch is None:
            return
        folder = os.fspath(watch.path)
        queue = self._queue_path
        if bits & _SELF_GONE_BITS:
            if watch is self._root_watch or folder == queue:
                raise _WatchLost
            self._watches.pop(folder, None)
            if bits & _IGNORED and os.path.isdir(folder):
                self._watch_folder(folder)  # replaced by a new folder of the same name
            return
        if name is None:
            return
        entry = os.fspath(name)
        if bits & _ISDIR:
            if folder == queue and entry == "archive":
                self._watch_archive()
                self._scan_archive()
            elif folder == os.path.join(queue, "archive") and ARCHIVE_FOLDER.match(entry):
                path = os.path.join(folder, entry)
                self._watch_folder(path)
                self._scan_folder(path, archived=True)
            return
        if bits & _FILE_EVENTS_BITS:
            match = JOB_NAME.match(entry)
            if match is None:
                return
            wants = self.wants
            if wants is not None and not wants(int(match.group(1))):
                self.stats.paused += 1
                return
            self._mark(os.path.join(folder, entry), folder != queue)

    def _watch_archive(self) -> None:
        archive = os.fspath(self.queue_dir / "archive")
        if not self.archive or not os.path.isdir(archive):
            return
        if archive not in self._watches and self._inotify is not None:
            self._watches[archive] = self._add_watch(archive, _ARCHIVE_MASK)
        with os.scandir(archive) as entries:
            for entry in entries:
                if ARCHIVE_FOLDER.match(entry.name) and entry.is_dir(follow_symlinks=False):
                    self._watch_folder(entry.path)

    def _add_watch(self, path: str | Path, mask: Mask) -> Watch:
        assert self._inotify is not None
        watch = self._inotify.add_watch(path, mask)
        self._by_wd[watch.wd] = watch
        return watch

    def _watch_folder(self, path: str) -> None:
        if path in self._watches or self._inotify is None:
            return
        try:
            self._watches[path] = self._add_watch(path, _FOLDER_MASK)
        except OSError as exc:
            log.warning("cannot watch archive folder %s: %s", path, os_reason(exc))

    # -- scanning ----------------------------------------------------------------------------------

    def _mark(self, path: str, archived: bool) -> None:
        if path in self._pending:
            self.stats.coalesced += 1
            self._pending[path] = self._pending[path] or archived
            return
        self._pending[path] = archived
        self._has_pending.set()

    def _scan(self, reason: str) -> None:
        """Mark every job file pending (the archive's too, but for jobs known final)."""
        self.stats.scans += 1
        metrics.WATCH_RESCANS.labels(self.backend, reason).inc()
        found = self._scan_folder(os.fspath(self.queue_dir), archived=False)
        # archive/ and archive/<n>/ made while events were lost (an overflow): watched from now
        # on, before they are scanned, like at start
        self._watch_archive()
        found += self._scan_archive()
        log.info("scanned %s (%s): %d job files", self.queue_dir, reason, found)

    def _scan_archive(self) -> int:
        if not self.archive:
            return 0
        archive = os.fspath(self.queue_dir / "archive")
        found = 0
        try:
            with os.scandir(archive) as entries:
                folders = [
                    e.path
                    for e in entries
                    if ARCHIVE_FOLDER.match(e.name) and e.is_dir(follow_symlinks=False)
                ]
        except FileNotFoundError:
            return 0
        for folder in sorted(folders, key=lambda p: int(os.path.basename(p))):
            found += self._scan_folder(folder, archived=True)
        return found

    def _scan_folder(self, folder: str, *, archived: bool) -> int:
        with os.scandir(folder) as entries:
            names = [(int(m.group(1)), e.name) for e in entries if (m := JOB_NAME.match(e.name))]
        names.sort()
        for _, name in names:
            self._mark(os.path.join(folder, name), archived)
        return len(names)

    # -- reading -----------------------------------------------------------------------------------

    async def _reader(self) -> None:
        skip_final: set[int] | None = None
        while True:
            # stop() sets _has_pending once; a batch read after it clears the flag, so the
            # last batch must not wait for a wake-up that will never come.
            if self._stopping.is_set() and not self._pending:
                return
            await self._has_pending.wait()
            if self.read_linger > 0 and not self._stopping.is_set():
                # Ganeti writes a job's file several times at once (luxid: at submit, three):
                # a moment's wait reads the last of them alone
                await _linger(self.read_linger)
            self._has_pending.clear()
            if not self._pending:
                if self._stopping.is_set():
                    return
                continue
            if skip_final is None and any(itertools.islice(self._pending.values(), self.read_batch)):
                # Only archived paths need it (a scan's, or jobs being archived): asked on every
                # wake-up, it cost a query per version read at a steady pace.
                skip_final = await self._known_archived()
            if self.wants is not None and not self._stopping.is_set():
                self._drop_unwanted(self.wants)
                if not self._pending:
                    continue
            paths = list(itertools.islice(self._pending.items(), self.read_batch))
            for path, _ in paths:
                del self._pending[path]
            if self._pending:
                self._has_pending.set()
            for count, (path, archived) in enumerate(paths, 1):
                version = self._files.read(
                    path,
                    archived,
                    _NOTHING if skip_final is None else skip_final,
                    max_bytes=self.max_file_bytes,
                    ends_only=self.ends_only,
                )
                if version is not None:
                    await self.store.put(version)
                if count % _READS_PER_TURN == 0:
                    await asyncio.sleep(0)  # the writer's transaction and inotify move on meanwhile
            await asyncio.sleep(0)
            if not self._pending:
                skip_final = None  # read it again for the next scan

    def _drop_unwanted(self, wants: Callable[[int], bool]) -> None:
        """Forget the marked files of jobs another dispatcher reads (see ``wants``)."""
        for path in list(self._pending):
            match = JOB_NAME.match(os.path.basename(path))
            if match is not None and not wants(int(match.group(1))):
                del self._pending[path]
                self.stats.paused += 1

    async def _known_archived(self) -> set[int]:
        try:
            return await self.store.archived_final_job_ids(self.backend)
        except Exception as exc:  # the store retries its writes; a scan may read everything
            log.warning("cannot ask the store which archived jobs it has (%s); reading them all", exc)
            return set()
