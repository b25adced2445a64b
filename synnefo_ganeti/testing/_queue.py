"""The job-queue directory, written exactly as Ganeti 3.0 writes it.

* Every version of a job file is a new temp file renamed over ``job-<id>``
  (inotify sees ``MOVED_TO job-<id>``, never a write to it):
  luxid's writes go through ``job-<id>-<pid>-<n>.tmp`` with compact JSON and no
  trailing newline; the job executor's through ``job-<id><8 random chars>.new``
  with ``", "``/``": "`` separators and a trailing newline.
* ``serial`` (the last job id) is rewritten the same way, before the job's first file.
  Job ids never start again: a fake on a queue directory that holds jobs goes on from the
  last id, as luxid's ``allocateJobIds`` (``src/Ganeti/JQueue.hs``) reads ``serial`` and
  writes ``serial + n``; a missing ``serial`` is written ``0``, as ``jstore.InitAndVerifyQueue``
  does. The fake also looks at the job files (``job-<id>`` and ``archive/*/job-<id>``) so
  that a ``serial`` that is missing or behind never makes it hand out an id twice.
* ``version`` holds ``1``, ``lock`` is empty.
* Archiving renames ``job-<id>`` to ``archive/<id // 10000>/job-<id>``.
"""

from __future__ import annotations

import json
import os
import random
import re
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

__all__ = ["QueueDir"]

_RANDOM = string.ascii_lowercase + string.digits
_JOB_FILE = re.compile(r"^job-(\d+)$")


class QueueDir:
    """Writes job files into a Ganeti-like queue directory."""

    def __init__(self, path: Path, *, fsync: bool = False, luxid_pid: int | None = None) -> None:
        self.path = path
        self._dir = os.fspath(path)
        self.fsync = fsync
        self.luxid_pid = luxid_pid or os.getpid()
        self._counter = 0
        self.writes = 0
        #: called with (job id, content, written by luxid?) after each job-file version is in place
        self.listeners: list[Callable[[int, dict[str, Any], bool], None]] = []
        path.mkdir(parents=True, exist_ok=True)
        (path / "archive").mkdir(exist_ok=True)
        if not (path / "version").exists():
            self._atomic("version", b"1\n", luxid=True)
        (path / "lock").touch()
        #: the last job id this directory has seen (``serial`` or its highest job file)
        self.last_serial = self._read_last_serial()
        if not (path / "serial").exists():
            self.write_serial(self.last_serial)

    def __repr__(self) -> str:
        return f"<QueueDir {self.path} {self.writes} writes>"

    def write_serial(self, last_id: int) -> None:
        self._atomic("serial", f"{last_id}\n".encode(), luxid=True)
        self.last_serial = max(self.last_serial, last_id)

    def _read_last_serial(self) -> int:
        """The highest of ``serial`` (0 when missing or not a number) and the job files' ids."""
        try:
            last = int((self.path / "serial").read_text().strip())
        except (FileNotFoundError, ValueError):
            last = 0
        folders = [self.path]
        with os.scandir(self.path / "archive") as entries:
            folders.extend(Path(entry.path) for entry in entries if entry.is_dir())
        for folder in folders:
            with os.scandir(folder) as entries:
                for entry in entries:
                    match = _JOB_FILE.match(entry.name)
                    if match is not None:
                        last = max(last, int(match.group(1)))
        return last

    def write_job(self, job_id: int, content: dict[str, Any], *, luxid: bool) -> None:
        if luxid:  # compact: orjson writes what json.dumps(separators=(",", ":")) does, faster
            data = orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)
        else:
            data = (json.dumps(content) + "\n").encode()
        self._atomic(f"job-{job_id}", data, luxid=luxid)
        if self.listeners:
            written = orjson.loads(data)
            for listener in self.listeners:
                listener(job_id, written, luxid)

    def archive(self, job_id: int) -> Path:
        folder = self.path / "archive" / str(job_id // 10000)
        folder.mkdir(exist_ok=True)
        target = folder / f"job-{job_id}"
        os.rename(self.path / f"job-{job_id}", target)
        return target

    def read_archived(self, job_id: int) -> dict[str, Any] | None:
        path = self.path / "archive" / str(job_id // 10000) / f"job-{job_id}"
        try:
            loaded: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        return loaded

    def _atomic(self, name: str, data: bytes, *, luxid: bool) -> None:
        if luxid:
            self._counter += 1
            temp = f"{self._dir}/{name}-{self.luxid_pid}-{self._counter}.tmp"
        else:
            temp = f"{self._dir}/{name}{''.join(random.choices(_RANDOM, k=8))}.new"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        try:
            os.write(fd, data)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, f"{self._dir}/{name}")
        self.writes += 1
