"""A job file read into a version: the watcher's reads, its bad files and their counts.

:class:`JobFileReader` turns one path the queue watcher marked (``job-<id>``, in the queue
directory or archived) into a :class:`~synnefo_ganeti.store.JobVersion`, or into nothing:

* not a job file's name, or an archived job the store holds as final already: skipped;
* gone since it was marked (archived or removed: its new name brings its own event): counted
  as ``vanished``;
* bad (truncated, not UTF-8 or JSON, too large, a symlink, not shaped like a job, naming
  another job): logged once with its path and counted once per bad version; a rescan reading
  the same file again neither logs nor counts, and the next good read says it is readable again;
* of a job whose end alone is wanted (``ends_only``) and not ended: counted as ``not_ended``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Set

from synnefo_ganeti import metrics
from synnefo_ganeti.jobs import JobFileError, parse_job_file
from synnefo_ganeti.store import JobVersion
from synnefo_ganeti.watch._support import WatchStats, file_identity, os_reason, read_job_file

__all__ = ["JOB_NAME", "JobFileReader"]

log = logging.getLogger("synnefo_ganeti.watch")

# ASCII digits to the very end: "$" also matches before a final newline, and \d matches other
# scripts' digits (int() reads them), so "job-7\n" and "job-\u0667" were read as job 7.
JOB_NAME = re.compile(r"^job-([0-9]+)\Z")


class JobFileReader:
    """Reads one backend's job files into versions, counting into the watcher's ``stats``."""

    def __init__(self, backend: str, stats: WatchStats) -> None:
        self.backend = backend
        self.stats = stats
        # path -> what was wrong with it the last time, and which file that was
        self._bad: dict[str, tuple[str, tuple[int, ...] | None]] = {}
        self._m_versions = metrics.WATCH_VERSIONS.labels(backend)
        self._m_bad = metrics.WATCH_BAD_FILES.labels(backend)

    def read(
        self,
        path: str,
        archived: bool,
        skip_final: Set[int],
        *,
        max_bytes: int,
        ends_only: Callable[[int], bool] | None,
    ) -> JobVersion | None:
        """The version at ``path``, or None (see the module)."""
        match = JOB_NAME.match(os.path.basename(path))
        if match is None:
            return None
        job_id = int(match.group(1))
        if archived and job_id in skip_final:
            return None
        try:
            data = read_job_file(path, max_bytes)
        except FileNotFoundError:
            # Archived (or removed) since it was marked: its new name brings its own event.
            self.stats.vanished += 1
            return None
        except (OSError, JobFileError) as exc:
            self._bad_file(path, exc)
            return None
        self.stats.files_read += 1
        try:
            job = parse_job_file(data)
            if job.job_id != job_id:
                raise JobFileError(f"it holds job {job.job_id}, not {job_id}")
        except JobFileError as exc:
            self._bad_file(path, exc)
            return None
        if self._bad.pop(path, None) is not None:
            log.info("job file %s is readable again", path)
        if not job.status.is_final and ends_only is not None and ends_only(job_id):
            self.stats.not_ended += 1
            return None
        self.stats.versions += 1
        self._m_versions.inc()
        return JobVersion(self.backend, job, archived)

    def _bad_file(self, path: str, exc: BaseException) -> None:
        reason = os_reason(exc) if isinstance(exc, OSError) else str(exc)
        # A rescan reads the same bad file again: not counted again. A new bad version (Ganeti
        # renames a new file into place) is counted and logged, even with the same reason.
        bad = (reason, file_identity(path))
        if self._bad.get(path) == bad:
            return
        self._bad[path] = bad
        self.stats.bad_files += 1
        self._m_bad.inc()
        log.warning("skipping job file %s: %s (read again on its next change)", path, reason)
