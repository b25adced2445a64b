"""Bad input to the watcher and the CLI: what each case did, measured once (issue 7).

    python benchmarks/bad_input.py                       # SQLite, the production retry interval
    python benchmarks/bad_input.py --db postgresql --retry-interval 0.2

Runs the cases of tests/unit/test_bad_input.py (the same bad files, names and configs)
once, and prints ONE JSON object: case -> figures, for the table in docs/reliability.md.

Watcher cases: a real :class:`QueueWatcher` (real inotify, a fresh queue directory in a
temporary folder) feeds a real :class:`Store` that holds ``good_jobs_before`` good jobs
first; then the bad input. For each case:

* ``bad_versions``: bad versions written; ``bad_files_counted``: how much
  ``synnefo_ganeti_watch_bad_files_total`` went up for them;
* ``log_lines``: warning lines the bad input caused (naming the file, or the queue
  directory for the directory cases); ``message``: the first of them, paths shortened;
* ``recounted_on_rescan``: how much the counter went up again when a rescan (an injected
  ``IN_Q_OVERFLOW``) read the same bad files once more;
* ``stored_after_fix``: whether the file, rewritten valid, was stored;
* ``good_jobs_after_intact``: the jobs stored before that are still stored unchanged
  (status, revision, events, updated_at); ``new_job_stored``: whether a job written
  after the bad input was stored;
* ``rescans``: rescans by reason while the case ran (``overflow``: the injected ones);
* ``recovered_seconds`` (queue directory removed and recreated): from the new directory's
  ``mkdir`` until the first job written into it is stored (polled every 20 ms); it waits
  for the watcher's next retry, every ``retry_interval`` s;
* ``junk_stored``: jobs stored from names that are not ``job-<id>`` (temp, unknown).

Config cases run ``synnefo-ganeti reconcile --config FILE`` in process: ``exit_code``,
``message_lines``, whether every line ``names_file`` and ``names_key``,
``secrets_in_output`` (the passwords found in the output), ``db_rows_changed``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE.parent), str(ROOT)]  # _databases, and the tests' cases and helpers

from asyncinotify import Mask  # noqa: E402
from tests._watch import lifecycle, rename_into_place, temp_name, write_version  # noqa: E402
from tests.unit.test_bad_input import (  # noqa: E402
    AFTER,
    BAD,
    BAD_FILES,
    CONFIGS,
    FILE_SECRET,
    GOOD_BEFORE,
    INLINE_SECRET,
    check_reads_are_refused,
    config_file,
    database_rows,
    file_modes_enforced,
    good_versions,
    invoke,
    make_database,
    password_file,
    snapshot,
)

from _databases import database  # noqa: E402
from synnefo_ganeti import metrics  # noqa: E402
from synnefo_ganeti.store import Store  # noqa: E402
from synnefo_ganeti.testing._queue import QueueDir  # noqa: E402
from synnefo_ganeti.watch import QueueWatcher  # noqa: E402

WATCHER_CASES = [
    *BAD_FILES,
    "unknown_names",
    "temp_names",
    "queue_dir_recreated",
    "permission_denied",
    "inotify_overflow",
]
UNKNOWN_NAMES = ["job-abc", "foo", "job-07x", "job-", "job-904.bak", "JOB-905", "job--906", "job-907\n"]
REASONS = ("start", "overflow", "watch_lost")
FINAL_JOB = 250  # the job written last in every case: the watcher still works
DEADLINE = 10.0


class Lines(logging.Handler):
    """The watcher's warning lines."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def wait(predicate: Callable[[], Awaitable[bool] | bool], timeout: float = DEADLINE) -> bool:
    """Whether ``predicate`` came true within ``timeout`` (polled every 20 ms)."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.02)


async def settle(watcher: QueueWatcher, store: Store, quiet: float = 0.1) -> None:
    """Until the watcher saw nothing new for ``quiet`` s, then until the store wrote it all."""
    last: tuple[int, ...] | None = None
    since = time.monotonic()
    deadline = since + DEADLINE
    while time.monotonic() < deadline:
        s = watcher.stats
        now = (s.events, s.scans, s.files_read, s.bad_files, s.vanished, store.pending)
        if now != last or watcher._pending:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
        await asyncio.sleep(0.02)
    await store.flush()


def bad_counted(backend: str) -> int:
    value = metrics.REGISTRY.get_sample_value("synnefo_ganeti_watch_bad_files_total", {"backend": backend})
    return int(value or 0)


def rescans(backend: str) -> dict[str, int]:
    return {
        reason: int(
            metrics.REGISTRY.get_sample_value(
                "synnefo_ganeti_watch_rescans_total", {"backend": backend, "reason": reason}
            )
            or 0
        )
        for reason in REASONS
    }


async def status_of(store: Store, backend: str, job_id: int) -> str | None:
    job = await store.get_job(backend, job_id)
    return job.status.value if job is not None else None


async def stored_as(store: Store, backend: str, job_id: int, status: str) -> bool:
    await store.flush()
    return await status_of(store, backend, job_id) == status


def write_lifecycle(queue: Path, job_id: int, final: str = "success") -> None:
    for content in lifecycle(job_id, final):
        write_version(queue, job_id, content)


def good_bytes(job_id: int = BAD) -> bytes:
    return json.dumps(lifecycle(job_id)[-1], separators=(",", ":")).encode()


def short(line: str, folder: Path) -> str:
    return line.replace(f"{folder}/", "").replace(str(folder), "")


class Case:
    """One watcher case: a queue directory, a watcher, the good jobs stored first."""

    def __init__(self, name: str, store: Store, folder: Path, retry_interval: float) -> None:
        self.name = name
        self.store = store
        self.folder = folder
        self.queue = folder / "queue"
        self.backend = f"bad-{name}"
        self.retry_interval = retry_interval
        self.figures: dict[str, Any] = {}

    async def __aenter__(self) -> Case:
        QueueDir(self.queue)
        for job_id, status in GOOD_BEFORE.items():
            for content in good_versions(job_id, status):
                write_version(self.queue, job_id, content)
        self.watcher = QueueWatcher(self.queue, self.store, self.backend, retry_interval=self.retry_interval)
        self.task = asyncio.create_task(self.watcher.run(), name=f"watch {self.name}")
        await self.watcher.ready.wait()

        async def all_stored() -> bool:
            await self.store.flush()
            stored = await snapshot(self.store, self.backend)
            return all(stored.get(job, ("",))[0] == status for job, status in GOOD_BEFORE.items())

        await wait(all_stored)
        await settle(self.watcher, self.store)
        self.before = await snapshot(self.store, self.backend)
        self.rescans = rescans(self.backend)
        self.lines = Lines()
        logging.getLogger("synnefo_ganeti.watch").addHandler(self.lines)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        logging.getLogger("synnefo_ganeti.watch").removeHandler(self.lines)
        self.watcher.stop()
        await asyncio.wait_for(self.task, DEADLINE)

    def rescan(self) -> None:
        self.watcher.on_event(Mask.Q_OVERFLOW, None, None)

    def log_figures(self, naming: str) -> None:
        mine = [line for line in self.lines.lines if naming in line]
        self.figures["log_lines"] = len(mine)
        self.figures["message"] = short(mine[0], self.folder) if mine else None

    async def finish(self) -> dict[str, Any]:
        now = await snapshot(self.store, self.backend)
        write_lifecycle(self.queue, FINAL_JOB)
        new_job_stored = await wait(lambda: stored_as(self.store, self.backend, FINAL_JOB, "success"))
        await settle(self.watcher, self.store)
        after = await snapshot(self.store, self.backend)
        intact = sum(now.get(job) == after.get(job) == self.before[job] for job in self.before)
        later = rescans(self.backend)
        return {
            **self.figures,
            "good_jobs_before": len(self.before),
            "good_jobs_after_intact": intact,
            "new_job_stored": new_job_stored,
            "rescans": {
                reason: later[reason] - self.rescans[reason] for reason in REASONS if reason != "start"
            },
        }


async def bad_file_case(case: Case) -> None:
    path = case.queue / f"job-{BAD}"
    versions = BAD_FILES[case.name]
    start = bad_counted(case.backend)
    for count, (make, _) in enumerate(versions, 1):
        make(case.queue)

        def reached(count: int = count) -> bool:
            return bad_counted(case.backend) - start >= count

        await wait(reached)
    await settle(case.watcher, case.store)
    counted = bad_counted(case.backend) - start
    case.log_figures(f"job file {path}:")
    case.rescan()
    await settle(case.watcher, case.store)
    write_version(case.queue, BAD, good_bytes())
    fixed = await wait(lambda: stored_as(case.store, case.backend, BAD, "success"))
    case.figures.update(
        bad_versions=len(versions),
        bad_files_counted=counted,
        recounted_on_rescan=bad_counted(case.backend) - start - counted,
        stored_after_fix=fixed,
    )


async def unknown_names_case(case: Case) -> None:
    for index, name in enumerate(UNKNOWN_NAMES):
        data = good_bytes(900 + index)
        temp = case.queue / f"tmp-{index}"
        temp.write_bytes(data)
        os.rename(temp, case.queue / name)
        (case.queue / name).write_bytes(data)
    write_lifecycle(case.queue, AFTER)  # the barrier: the names' events come before its own
    await wait(lambda: stored_as(case.store, case.backend, AFTER, "success"))
    case.rescan()
    await settle(case.watcher, case.store)
    stored = await snapshot(case.store, case.backend)
    case.figures.update(
        bad_versions=0,
        bad_files_counted=bad_counted(case.backend),
        log_lines=sum(any(name in line for name in UNKNOWN_NAMES) for line in case.lines.lines),
        junk_stored=sum(900 + index in stored for index in range(len(UNKNOWN_NAMES))),
    )


async def temp_names_case(case: Case) -> None:
    versions = lifecycle(BAD)
    luxid = case.queue / temp_name(BAD, luxid=True)
    executor = case.queue / temp_name(BAD, luxid=False)
    luxid.write_bytes(json.dumps(versions[0]).encode())
    executor.write_bytes(json.dumps(versions[-1]).encode())  # left behind
    QueueDir(case.queue).write_serial(BAD)
    write_lifecycle(case.queue, AFTER)
    await wait(lambda: stored_as(case.store, case.backend, AFTER, "success"))
    case.rescan()
    await settle(case.watcher, case.store)
    junk = int(await status_of(case.store, case.backend, BAD) is not None)
    os.rename(luxid, case.queue / f"job-{BAD}")
    renamed = await wait(lambda: stored_as(case.store, case.backend, BAD, "queued"))
    await settle(case.watcher, case.store)
    case.figures.update(
        bad_versions=0,
        bad_files_counted=bad_counted(case.backend),
        log_lines=sum(f"job-{BAD}" in line for line in case.lines.lines),
        junk_stored=junk,
        stored_after_rename=renamed and await status_of(case.store, case.backend, BAD) == "queued",
    )


async def queue_dir_case(case: Case) -> None:
    shutil.rmtree(case.queue)
    await wait(lambda: case.watcher.stats.watch_lost >= 1)
    started = time.monotonic()
    QueueDir(case.queue)
    write_lifecycle(case.queue, 300, "error")
    recovered = await wait(lambda: stored_as(case.store, case.backend, 300, "error"))
    seconds = time.monotonic() - started
    await settle(case.watcher, case.store)
    case.log_figures(str(case.queue))
    case.figures.update(
        bad_versions=0,
        bad_files_counted=bad_counted(case.backend),
        recovered_seconds=round(seconds, 3) if recovered else None,
        retry_interval=case.retry_interval,
        messages=[short(line, case.folder) for line in case.lines.lines],
    )


async def permission_case(case: Case) -> None:
    path = case.queue / f"job-{BAD}"

    def unreadable(temp: Path) -> None:
        temp.write_bytes(good_bytes())
        temp.chmod(0)

    with file_modes_enforced():
        check_reads_are_refused(case.folder)
        rename_into_place(case.queue, BAD, unreadable)
        await wait(lambda: bad_counted(case.backend) >= 1)
        await settle(case.watcher, case.store)
        counted = bad_counted(case.backend)
        case.rescan()
        await settle(case.watcher, case.store)
    case.log_figures(f"job file {path}:")
    write_version(case.queue, BAD, good_bytes())
    fixed = await wait(lambda: stored_as(case.store, case.backend, BAD, "success"))
    case.figures.update(
        bad_versions=1,
        bad_files_counted=counted,
        recounted_on_rescan=bad_counted(case.backend) - counted,
        stored_after_fix=fixed,
        as_root=os.geteuid() == 0,
    )


async def overflow_case(case: Case) -> None:
    write_version(case.queue, BAD, good_bytes()[:40])
    await wait(lambda: bad_counted(case.backend) >= 1)
    counted = bad_counted(case.backend)
    lost: list[str] = []
    deliver = case.watcher.on_event

    def losing(mask: int, watch: Any, name: str | None) -> None:
        if name is not None and os.path.basename(name).startswith("job-"):
            lost.append(os.path.basename(name))
            return
        deliver(mask, watch, name)

    case.watcher.on_event = losing  # type: ignore[method-assign]
    write_lifecycle(case.queue, 400)
    write_lifecycle(case.queue, 401)
    await wait(lambda: len(lost) >= 2 * len(lifecycle(400)))
    await settle(case.watcher, case.store)
    del case.watcher.on_event
    started = time.monotonic()
    case.rescan()

    async def both() -> bool:
        return await stored_as(case.store, case.backend, 400, "success") and await stored_as(
            case.store, case.backend, 401, "success"
        )

    caught_up = await wait(both)
    seconds = time.monotonic() - started
    await settle(case.watcher, case.store)
    case.log_figures("inotify queue overflow")
    case.figures.update(
        bad_versions=1,
        bad_files_counted=counted,
        recounted_on_rescan=bad_counted(case.backend) - counted,
        events_lost=len(lost),
        lost_jobs_stored_after_rescan=2 if caught_up else 0,
        rescan_seconds=round(seconds, 3),
    )


RUNNERS: dict[str, Callable[[Case], Awaitable[None]]] = {
    **dict.fromkeys(BAD_FILES, bad_file_case),
    "unknown_names": unknown_names_case,
    "temp_names": temp_names_case,
    "queue_dir_recreated": queue_dir_case,
    "permission_denied": permission_case,
    "inotify_overflow": overflow_case,
}


async def watcher_cases(db: str, folder: Path, retry_interval: float) -> dict[str, Any]:
    logging.getLogger("synnefo_ganeti.watch").setLevel(logging.INFO)
    results: dict[str, Any] = {}
    async with database(db, str(folder)) as url, Store(url) as store:
        for name in WATCHER_CASES:
            case_folder = folder / name
            case_folder.mkdir()
            async with Case(name, store, case_folder, retry_interval) as case:
                await RUNNERS[name](case)
                results[name] = await case.finish()
    return results


def config_cases(folder: Path) -> dict[str, Any]:
    for name in list(os.environ):
        if name.upper().startswith("SYNNEFO_GANETI_"):
            del os.environ[name]
    results: dict[str, Any] = {}
    for name, (table, mode, _) in [*CONFIGS.items(), ("unknown_backend", ("", None, []))]:
        case_folder = folder / f"config_{name}"
        case_folder.mkdir()
        db = make_database(case_folder / "store.db")
        if mode is not None:
            password_file(case_folder, mode)
        config = config_file(case_folder, db, table)
        rows = database_rows(db)
        args = ["reconcile", "--config", str(config)]
        key = "password_file" if "password_file" in name else "backends.1."
        if name == "unknown_backend":
            args += ["--backend", "sparta"]
            key = "sparta"
        with file_modes_enforced() if mode == 0 else contextlib.nullcontext():
            if mode == 0:
                check_reads_are_refused(case_folder)
            result = invoke(*args)
        lines = result.output.splitlines()
        results[f"config_{name}"] = {
            "exit_code": result.exit_code,
            "message_lines": len(lines),
            "names_file": all(str(config) in line for line in lines),
            "names_key": all(key in line for line in lines),
            "secrets_in_output": sum(secret in result.output for secret in (INLINE_SECRET, FILE_SECRET)),
            "db_rows_before": len(rows),
            "db_rows_changed": len(set(rows) ^ set(database_rows(db))),
            "message": short(lines[0], case_folder) if lines else None,
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite", help="sqlite, postgresql, or a database URL")
    parser.add_argument(
        "--retry-interval",
        type=float,
        default=2.0,
        help="the watcher's retry interval for a missing queue directory (default: the production 2 s)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sg-bad-input-") as tmp:
        folder = Path(tmp)
        results = asyncio.run(watcher_cases(args.db, folder, args.retry_interval))
        results.update(config_cases(folder))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
