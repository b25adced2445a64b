"""Nodes on the real 3-node Ganeti 3.0 testbed (issue 30, item 1).

* ``nodes``/``node`` (and ``synnefo-ganeti nodes list|show --json``) read the real cluster: three
  nodes, node1 the master, figures and groups, the read time;
* node2 drained and undrained through the library (its job followed), the master refused as a
  :class:`ConflictError` naming the master failover;
* a burst of durable requests (``node_placement`` "pnode", the backend followed through the
  master's queue dir, PostgreSQL) during which an operator drains node2 behind our back
  (``gnt-node modify --drained yes``): every request succeeds, none has more than one successful
  create, and no create with ``pnode`` node2 was sent (ganeti-rapi's stamp in its reason trail)
  more than ``TIGHT`` seconds after the drain ended (half the burst is requested while the drain
  job waits for node2's lock: creates sent there then are refused and placed again); no instance
  of ours is made on node2 after.

node2 is undrained and every instance removed, whatever happens.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from synnefo_ganeti import ConflictError, ControlPlane
from synnefo_ganeti.cli import main
from synnefo_ganeti.store import RequestStatus, Store, request_tag
from tests.helpers import eventually
from tests.integration._testbed import BACKEND, ns30, spec
from tests.integration.test_control_real import remove_everywhere, run
from tests.integration.test_dispatcher_real import dispatching, settings

pytestmark = [pytest.mark.ganeti3, pytest.mark.timeout(900)]

MASTER, DRAINED = "node1.ganeti.test", "node2.ganeti.test"
REQUESTS = 18
TIGHT = 10.0  # no create may be sent to the drained node later than this after the drain


def _posted(job, since: float) -> float | None:
    """When ganeti-rapi took the job's POST (its reason trail's rlib2 entry), seconds after ``since``."""
    for source, _text, stamp in job.ops[0].get("reason", []):
        if source.startswith("gnt:library:rlib2"):
            return round(stamp / 1e9 - since, 1)
    return None


async def _gnt_drained(value: str) -> None:
    code, out, err = await run(*ns30("gnt-node", "modify", "--drained", value, DRAINED))
    assert code == 0, f"gnt-node modify --drained {value}: {out}{err}"


async def _drain_queued(rapi) -> bool:
    """An OP_NODE_SET_PARAMS of node2 in Ganeti's job list (queued, waiting or running)."""
    return any(
        job.ops and job.ops[0].get("OP_ID") == "OP_NODE_SET_PARAMS" and job.ops[0].get("node_name") == DRAINED
        and not job.status.is_final
        for job in await rapi.list_jobs()
    )  # fmt: skip


async def _undrained(cp: ControlPlane) -> None:
    if (await cp.node(BACKEND, DRAINED)).drained:
        await _gnt_drained("no")


def _config_file(tmp_path: Path, bed, db_url: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(
        f'[database]\nurl = "{db_url}"\n\n[[backends]]\nname = "{BACKEND}"\nurl = "{bed.url}"\n'
        f'username = "{bed.username}"\npassword = "{bed.password}"\nca_file = "{bed.ca_file}"\n'
    )
    return str(path)


async def test_nodes_list_and_show_read_the_real_cluster(testbed3, pg_url, tmp_path) -> None:
    bed = testbed3.bed
    config = settings(bed, pg_url, watched=False)
    async with Store(pg_url) as store, ControlPlane(config, store=store) as cp:
        (answer,) = await cp.nodes()
        assert answer.backend == BACKEND and answer.error is None, answer
        assert [n.name for n in answer.nodes] == sorted(testbed3.nodes)
        roles = {n.name: n.role for n in answer.nodes}
        assert roles[MASTER] == "master" and all(
            roles[n] in ("candidate", "regular") for n in roles if n != MASTER
        )
        for node in answer.nodes:
            assert node.memory_total and node.memory_free is not None and node.cpus, node
            assert node.memory_used == node.memory_total - node.memory_free
            assert node.group == "default" and node.read_at == answer.read_at
        one = await cp.node(BACKEND, DRAINED)
        assert one.name == DRAINED and one.role == roles[DRAINED] and not one.drained
    config_file = _config_file(tmp_path, bed, pg_url)
    cli = CliRunner()
    listed = await asyncio.to_thread(cli.invoke, main, ["nodes", "list", "--config", config_file, "--json"])
    assert listed.exit_code == 0, listed.output
    (backend,) = json.loads(listed.output)["backends"]
    assert {n["name"]: n["role"] for n in backend["nodes"]}[MASTER] == "master"
    shown = await asyncio.to_thread(
        cli.invoke, main, ["nodes", "show", BACKEND, DRAINED, "--config", config_file]
    )
    assert shown.exit_code == 0 and f"node {DRAINED} of backend {BACKEND}, as of" in shown.output, (
        shown.output
    )


async def test_drain_and_undrain_node2_and_the_master_refused(testbed3, pg_url) -> None:
    config = settings(testbed3.bed, pg_url, watched=False)
    async with Store(pg_url) as store, ControlPlane(config, store=store) as cp:
        try:
            drained = await cp.drain_node(BACKEND, DRAINED)
            assert drained.drained and drained.role == "drained", drained
            undrained = await cp.undrain_node(BACKEND, DRAINED)
            assert not undrained.drained and undrained.role in ("candidate", "regular"), undrained
            with pytest.raises(ConflictError, match="master-failover"):
                await cp.drain_node(BACKEND, MASTER)
            assert not (await cp.node(BACKEND, MASTER)).drained
        finally:
            await _undrained(cp)


async def test_a_node_drained_behind_our_back_mid_burst_fails_no_request(testbed3, pg_url) -> None:
    bed = testbed3.bed
    assert DRAINED in testbed3.nodes, testbed3.nodes
    config = settings(bed, pg_url, watched=True)
    assert config.dispatcher.node_placement == "pnode"
    prefix = f"sg-dr{uuid.uuid4().hex[:6]}-"
    names = [f"{prefix}r{i}.ganeti.test" for i in range(REQUESTS)]
    figures: dict[str, object] = {}
    drained_at: float | None = None
    async with Store(pg_url) as store, ControlPlane(config, store=store) as cp:
        rapi = await cp.client(BACKEND)
        try:
            async with dispatching(config, store) as dispatcher:
                started = time.time()
                first, second = names[: REQUESTS // 2], names[REQUESTS // 2 :]
                ids = [await cp.request_instance(spec(bed, n, pnode=None)) for n in first]
                dispatcher.wake()
                await eventually(lambda: dispatcher.stats.submitted >= 2, timeout=60, interval=0.01,
                                 what="2 creates submitted")  # fmt: skip
                figures["submitted_before_drain"] = dispatcher.stats.submitted
                # the operator, behind the dispatcher's back: its job waits for node2's lock (the
                # creates running there) while the rest of the burst comes, placed by stats that
                # still take node2 for usable
                drain = asyncio.create_task(_gnt_drained("yes"))
                try:
                    await eventually(lambda: _drain_queued(rapi), timeout=60, interval=0.05,
                                     what="the drain job in Ganeti's queue")  # fmt: skip
                    ids += [await cp.request_instance(spec(bed, n, pnode=None)) for n in second]
                    dispatcher.wake()
                finally:
                    await drain
                drained_at = time.time()

                async def all_final() -> list:
                    requests = [await store.get_request(i) for i in ids]
                    return requests if all(r.status.is_final for r in requests) else []

                requests = await eventually(all_final, timeout=300, interval=1, what="every request final")
                figures["makespan_s"] = round(max(r.finished_at.timestamp() for r in requests) - started, 1)
                figures["attempts"] = sorted(r.attempts for r in requests)
                figures["dispatcher"] = {"submitted": dispatcher.stats.submitted, "failed": dispatcher.stats.failed,
                                         "node_retries": dispatcher.stats.node_retries}  # fmt: skip
            jobs = await rapi.list_jobs()
            instances = {i.name: i for i in await rapi.list_instances() if i.name.startswith(prefix)}
            late, refused = [], []
            for request in requests:
                assert request.status is RequestStatus.SUCCEEDED, request.to_json()
                creates = [j for j in jobs if f"synnefo-ganeti:{request.id}" in j.request_ids
                           and j.ops and j.ops[0].get("OP_ID") == "OP_INSTANCE_CREATE"]  # fmt: skip
                ok = [j.id for j in creates if j.status.value == "success"]
                assert len(ok) == 1, (request.id, ok, [(j.id, j.status.value) for j in creates])
                tagged = [n for n, i in instances.items() if request_tag(request.id) in i.tags]
                assert tagged == [request.instance], (request.id, tagged)
                for job in creates:
                    if job.ops[0].get("pnode") != DRAINED:
                        continue
                    posted = _posted(job, drained_at)
                    if job.status.value != "success":
                        refused.append((job.id, posted, job.status.value))
                    if posted is not None and posted > TIGHT:
                        late.append((job.id, posted, job.status.value))
                    if job.status.value == "success":  # made on node2: its create ran before the drain
                        assert job.end_ts is None or job.end_ts.as_float <= drained_at + 1, job.id
            figures["refused_on_node2"] = refused
            figures["late_on_node2"] = late
            print("\ndrained node figures:", figures)
            assert late == [], (
                f"creates sent to drained {DRAINED} more than {TIGHT:g} s after the drain: {late}"
            )
        finally:
            print("\ndrained node figures (so far):", figures)
            try:
                await _undrained(cp)
            finally:
                existing = [i.name for i in await rapi.list_instances() if i.name.startswith(prefix)]
                await remove_everywhere(rapi, existing)
