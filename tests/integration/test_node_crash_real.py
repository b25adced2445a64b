"""A node crashes under load on the real 3-node testbed (issue 27): every durable request still ends.

Two instances are made on node3 first (``ControlPlane.create_instance`` with ``pnode`` node3, through
the lab's RAPI, so the store knows their node). A Dispatcher (``node_placement`` "pnode", the backend
followed through the master's queue dir, ``health_interval`` 2 s, client timeout 30 s, PostgreSQL
store) takes 9 durable requests; once 2 creates are submitted, node3 is crashed hard
(``../shared/ganeti/multi/crash-node-multi.sh node3``). Then, from Ganeti's own state (its job list
with reason trails, its instances and their tags): every request succeeded, none has more than one
successful create job, none failed while an instance with its tag exists, and no create with
``pnode`` node3 was sent (ganeti-rapi's stamp in its reason trail) more than 10 s after the crash. The store marks node3's two instances ``node_state`` "down" and ``backend_nodes`` lists
node3 down. Node3 is brought back (``up-multi.sh``) and every instance removed, whatever happened.

With node3 dead, luxid writes each new job to the dead master candidate before it enqueues it: a
create whose POST timed out is found in the job list before Ganeti runs it (its cancel answers "not
found in queue" meanwhile), and one in about ten runs stays so for good (2026-12-01: job 207, whose
request waited past the 240 s below in a CI run). The dispatcher cancels the first kind once it is
enqueued and places the second kind again (``DispatcherStats.stranded``, in the figures printed).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from synnefo_ganeti import ControlPlane, RapiClient
from synnefo_ganeti.store import InstanceStatus, RequestStatus, Store, request_tag
from tests.conftest import IN_CI
from tests.helpers import eventually
from tests.integration._testbed import BACKEND, TESTBED, spec
from tests.integration.test_control_real import remove_everywhere
from tests.integration.test_dispatcher_real import dispatching, settings

pytestmark = [pytest.mark.ganeti3, pytest.mark.timeout(900)]

MULTI = Path(
    os.environ.get("SYNNEFO_GANETI_TEST_MULTI", Path(__file__).parents[3] / "shared" / "ganeti" / "multi")
)
REQUESTS = 9
CRASHED = "node3.ganeti.test"
TIGHT = 10.0  # no create may be sent to the crashed node later than this after the crash (issue 27)


def _posted(job, crashed_at: float) -> float | None:
    """When ganeti-rapi took the job's POST (its reason trail's rlib2 entry), in seconds after the crash."""
    for source, _text, stamp in job.ops[0].get("reason", []):
        if source.startswith("gnt:library:rlib2"):
            return round(stamp / 1e9 - crashed_at, 1)
    return None


async def _run(*command: str, timeout: float) -> str:
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, f"{' '.join(command)} exited {proc.returncode}: {text[-2000:]}"
    return text


async def _node3_figures(rapi: RapiClient) -> bool:
    try:
        nodes = await rapi._get("/2/nodes", {"bulk": "1"})
    except Exception:
        return False
    (node,) = [n for n in nodes if n["name"] == CRASHED]
    return node.get("mfree") is not None and not node.get("offline")


def _patient_grep() -> str:
    """A folder holding ``grep``: the real one, given all of its input first (made once a run).

    ../shared's up-multi.sh runs ``gnt-node list | grep -qx NAME`` under ``pipefail``: a ``grep -q``
    that answers at its first line closes the pipe while ``gnt-node list`` still writes, which then
    dies of SIGPIPE, the pipeline fails, a node in the cluster is taken for one that is not, and
    ``gnt-node add`` fails with "already in the cluster". On a fast machine that happened three
    runs in three (a rehearsal of CI, 2026-11-29). Run with this folder first on its ``PATH`` and
    stdin on /dev/null (so that a grep of files reads nothing from it), the script's greps read
    their whole input before they answer."""
    global _GREP_DIR
    if _GREP_DIR is None:
        real = shutil.which("grep") or "/usr/bin/grep"
        folder = Path(tempfile.mkdtemp(prefix="sg-patient-grep-"))
        wrapper = folder / "grep"
        wrapper.write_text(
            "#!/bin/sh\n"
            "# the real grep, given all of its input first (tests/integration/test_node_crash_real.py)\n"
            'tmp=$(mktemp) || exit 2\ncat > "$tmp"\n'
            f'"{real}" "$@" < "$tmp"\nstatus=$?\nrm -f "$tmp"\nexit $status\n'
        )
        wrapper.chmod(0o755)
        atexit.register(shutil.rmtree, folder, True)
        _GREP_DIR = str(folder)
    return _GREP_DIR


_GREP_DIR: str | None = None


async def up_multi(timeout: float = 300) -> str:
    """``up-multi.sh`` (every node of the lab up), its greps patient (:func:`_patient_grep`)."""
    env = {**os.environ, "PATH": f"{_patient_grep()}:{os.environ.get('PATH', '')}"}
    command = str(MULTI / "up-multi.sh")
    proc = await asyncio.create_subprocess_exec(
        command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, f"{command} exited {proc.returncode}: {text[-2000:]}"
    return text


async def _bring_back(rapi: RapiClient) -> None:
    """node3 up again, RAPI answering, its figures in /2/nodes (online, if anything marked it offline).

    up-multi.sh runs with patient greps (:func:`up_multi`); should it fail all the same with
    "already in the cluster", it is run again, up to three times, before the test fails."""
    for attempt in range(3):
        try:
            await up_multi(timeout=300)
            break
        except AssertionError as exc:
            if attempt == 2 or "already in the cluster" not in str(exc):
                raise

    async def status() -> bool:
        proc = await asyncio.create_subprocess_exec(str(TESTBED), "status")
        return await proc.wait() == 0

    await eventually(status, timeout=120, interval=1, what="scripts/ganeti-testbed status")
    nodes = await rapi._get("/2/nodes", {"bulk": "1"})
    if any(n["name"] == CRASHED and n.get("offline") for n in nodes):
        await rapi.wait_for_job(await rapi.modify_node(CRASHED, offline=False), timeout=120)
    await eventually(
        lambda: _node3_figures(rapi), timeout=120, interval=1, what="node3's figures in /2/nodes"
    )


async def _unfinished(store: Store, rapi: RapiClient, ids: list[str]) -> list[dict[str, object]]:
    """The requests not final yet, each with what Ganeti says of its job (for a failure's message)."""
    out: list[dict[str, object]] = []
    for request_id in ids:
        request = await store.get_request(request_id)
        if request is None or request.status.is_final:
            continue
        seen: dict[str, object] = {"request": request.to_json()}
        if request.job_id is not None:
            try:
                job = await rapi.get_job(request.job_id)
                seen["job"] = {
                    "status": job.status.value,
                    "received": job.received_ts and job.received_ts.as_float,
                    "started": job.start_ts and job.start_ts.as_float,
                    "ended": job.end_ts and job.end_ts.as_float,
                    "opresult": job.opresult,
                }
            except Exception as exc:  # what Ganeti answered, whatever it is
                seen["job"] = repr(exc)
        out.append(seen)
    return out


async def test_a_node_crash_under_load_loses_and_doubles_nothing(testbed3, pg_url, caplog) -> None:
    caplog.set_level(logging.INFO, logger="synnefo_ganeti")
    if not (MULTI / "crash-node-multi.sh").exists():
        problem = f"no lab scripts at {MULTI} (set SYNNEFO_GANETI_TEST_MULTI)"
        if IN_CI:
            pytest.fail(problem)
        pytest.skip(problem)
    bed = testbed3.bed
    assert CRASHED in testbed3.nodes, testbed3.nodes
    config = settings(bed, pg_url, watched=True)
    config.backends[0].timeout = 30.0  # the client's timeout
    assert config.dispatcher.node_placement == "pnode" and config.dispatcher.health_interval == 2.0
    prefix = f"sg-nc{uuid.uuid4().hex[:6]}-"
    on_node3 = [f"{prefix}n3-{i}.ganeti.test" for i in range(2)]
    names = [f"{prefix}r{i}.ganeti.test" for i in range(REQUESTS)]
    figures: dict[str, object] = {}
    crashed_at: float | None = None
    async with (
        Store(pg_url) as store,
        RapiClient(bed.url, username=bed.username, password=bed.password, ca_file=bed.ca_file) as rapi,
    ):
        try:
            async with ControlPlane(config, store=store) as cp, dispatching(config, store) as dispatcher:
                # 1. two instances on node3, known to the store with their node
                for instance in on_node3:
                    await cp.create_instance(spec(bed, instance, pnode=CRASHED), backend=BACKEND)

                async def on_node3_started() -> bool:
                    rows = [await store.get_instance(BACKEND, n) for n in on_node3]
                    return all(r is not None and r.status is InstanceStatus.STARTED and r.pnode == CRASHED
                               for r in rows)  # fmt: skip

                await eventually(on_node3_started, timeout=120, interval=0.5, what="node3's two instances")

                # 2. the durable requests (the dispatcher picks the node)
                started = time.time()
                ids = [await cp.request_instance(spec(bed, n, pnode=None)) for n in names]
                dispatcher.wake()

                # 3. node3 crashes once two creates are submitted
                await eventually(lambda: dispatcher.stats.submitted >= 2, timeout=60, interval=0.01,
                                 what="2 creates submitted")  # fmt: skip
                figures["submitted_before_crash"] = dispatcher.stats.submitted
                crashed_at = time.time()
                await _run(str(MULTI / "crash-node-multi.sh"), "node3", timeout=60)

                async def seen_down() -> bool:
                    rows = (await store.backend_nodes(BACKEND)).get(BACKEND, [])
                    return any(r["name"] == CRASHED and r["state"] == "down" for r in rows)

                await eventually(seen_down, timeout=120, interval=0.1, what="node3 down in backend_nodes")
                figures["seen_down_after_s"] = round(time.time() - crashed_at, 1)

                # 4. every request ends
                async def all_final() -> list:
                    requests = [await store.get_request(i) for i in ids]
                    return requests if all(r.status.is_final for r in requests) else []

                try:
                    requests = await eventually(
                        all_final, timeout=240, interval=1, what="every request final"
                    )
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; not final: {await _unfinished(store, rapi, ids)}") from None
                figures["makespan_s"] = round(max(r.finished_at.timestamp() for r in requests) - started, 1)
                figures["attempts"] = sorted(r.attempts for r in requests)

                async def marked_down() -> bool:
                    rows = [await store.get_instance(BACKEND, n) for n in on_node3]
                    return all(r is not None and r.node_state == "down" for r in rows)

                await eventually(
                    marked_down, timeout=60, interval=0.5, what="node3's instances node_state down"
                )
                nodes = {r["name"]: r for r in (await store.backend_nodes(BACKEND))[BACKEND]}
                assert nodes[CRASHED]["state"] == "down", nodes
                assert all(nodes[n]["state"] == "up" for n in testbed3.nodes if n != CRASHED), nodes

            # Ganeti's own state
            jobs = await rapi.list_jobs()
            instances = {i.name: i for i in await rapi.list_instances() if i.name.startswith(prefix)}
            late = []  # creates sent to node3 (ganeti-rapi took the POST) more than TIGHT s after the crash
            for request in requests:
                tag = request_tag(request.id)
                creates = [j for j in jobs if f"synnefo-ganeti:{request.id}" in j.request_ids
                           and j.ops and j.ops[0].get("OP_ID") == "OP_INSTANCE_CREATE"]  # fmt: skip
                ok = [j.id for j in creates if j.status.value == "success"]
                tagged = [n for n, i in instances.items() if tag in i.tags]
                assert request.status is RequestStatus.SUCCEEDED, request.to_json()
                assert len(ok) == 1, (request.id, ok, [(j.id, j.status.value) for j in creates])
                assert tagged == [request.instance], (request.id, tagged)
                for job in creates:
                    posted = _posted(job, crashed_at)
                    if job.ops[0].get("pnode") == CRASHED and posted is not None and posted > TIGHT:
                        late.append((job.id, posted, job.status.value))
            on3_after = sorted(
                (j.id, round(j.received_ts.as_float - crashed_at, 1), _posted(j, crashed_at), j.status.value)
                for j in jobs
                if j.ops and j.ops[0].get("OP_ID") == "OP_INSTANCE_CREATE" and j.ops[0].get("pnode") == CRASHED
                and j.received_ts is not None and j.received_ts.as_float > crashed_at
                and str(j.ops[0].get("instance_name", "")).startswith(prefix)
            )  # fmt: skip
            figures["creates_on_node3_after_crash"] = on3_after
            figures["placed_on_node3_later_than_10s"] = late
            figures["dispatcher"] = {
                "submitted": dispatcher.stats.submitted,
                "failed": dispatcher.stats.failed,
                "moved": dispatcher.stats.moved,
                "stranded": dispatcher.stats.stranded,
            }
            print("\nnode crash figures:", figures)
            # "placed" is when the dispatcher sent the create (ganeti-rapi's stamp in the reason
            # trail), not when Ganeti queued it: with a node dead the master takes 15-30 s to
            # turn a POST into a job (the lab), which measures Ganeti, not placement
            assert late == [], f"creates placed on {CRASHED} more than {TIGHT:g} s after the crash: {late}"
        finally:
            print("\nnode crash figures (so far):", figures)
            try:
                if crashed_at is not None:
                    await _bring_back(rapi)
            finally:  # the instances go even when node3 could not be brought back (the next tests)
                existing = [i.name for i in await rapi.list_instances() if i.name.startswith(prefix)]
                await remove_everywhere(rapi, existing)
