"""``watch --eventd-compat`` against the real 3-node Ganeti 3.0 testbed (issue 32 item 2).

The real command runs as two processes, each publishing to its own uuid topic exchange on the
real RabbitMQ, an exclusive queue bound to ``#`` on each declared before the process starts:

* the master's: node1's queue directory and ssconf (``ssconf_master_node`` names node1),
  ``--node-name`` node1, the RAPI for the instances' NICs, disks and hvparams;
* a master candidate's: node2's replicated queue directory and its ssconf, ``--node-name``
  node2. It reads the same jobs (eventd published from every candidate) and must publish
  nothing.

Through the RAPI an ``evd32-`` instance (diskless, the fake hypervisor, the ``noop`` OS) is
created, shut down, started, rebooted, given new beparams and removed, each job waited for. For
each job the master's exchange must carry, on ``ganeti.evd32.event.op``, one
``ganeti-op-status`` message per op status seen (no (jobId, operation, status) twice), in
Ganeti's order, ending with ``success``, with the RAPI's job id, the cluster's name from
ssconf, an ``event_time`` ``[seconds, microseconds]`` that never goes back; the create's and the
set-params' success (and the startup's) carry ``instance_nics``, ``instance_disks`` and
``instance_hvparams`` as ``GET /2/instances/NAME`` answered right after the job. Both processes
stop on SIGTERM with exit status 0; the candidate's last log line says it read job files and
published none. The instance is removed whatever happens; the exchanges and queues go with
the consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from synnefo_ganeti import NotFoundError, RapiClient
from synnefo_ganeti.watch import InstanceInfo
from tests.helpers import eventually
from tests.integration._testbed import QUEUE_DIR, client, ns30, spec
from tests.unit import test_amqp_feed
from tests.unit.test_amqp_feed import Consumer, consumer

pytestmark = [pytest.mark.ganeti3, pytest.mark.timeout(600)]

#: the RabbitMQ fixture of test_amqp_feed.py (skipped without a broker, failed under CI)
rabbitmq = test_amqp_feed.rabbitmq

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 120.0  # seconds for a job to end, or for its messages to arrive
#: Ganeti's op statuses in the order an op goes through them
ORDER = ("queued", "waiting", "running", "canceling", "success", "error", "canceled")
#: the ops whose success carries instance_nics, instance_disks and instance_hvparams
WITH_INFO = ("OP_INSTANCE_CREATE", "OP_INSTANCE_STARTUP", "OP_INSTANCE_SET_PARAMS")
#: the hvparams eventd's get_instance_info asks for
HV_KEYS = ("boot_order", "cdrom_image_path")


@dataclass
class Step:
    """One job of the lifecycle: its OP_ID, the RAPI's job id, its opcode as Ganeti keeps it, the
    instance as the RAPI gave it after."""

    op_id: str
    job_id: int
    op: dict[str, Any]
    instance: dict[str, Any] | None


@dataclass
class Eventd:
    """A ``watch --eventd-compat`` process and its stderr's lines (JSON log lines)."""

    process: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.lines:
            with contextlib.suppress(orjson.JSONDecodeError):
                out.append(orjson.loads(line))
        return out

    def metrics_url(self) -> str | None:
        for line in self.lines:
            if found := re.search(r"metrics on (http://[^\s\"]+)/metrics", line):
                return found.group(1)
        return None

    async def stop(self) -> int:
        """SIGTERM, then its exit status (killed after 30 s)."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        if self.reader is not None:
            await asyncio.wait_for(self.reader, 10)
        assert self.process.returncode is not None
        return self.process.returncode


async def _read_lines(eventd: Eventd) -> None:
    assert eventd.process.stderr is not None
    async for raw in eventd.process.stderr:
        eventd.lines.append(raw.decode(errors="replace").rstrip("\n"))


@contextlib.asynccontextmanager
async def eventd(*argv: str) -> AsyncIterator[Eventd]:
    """The command running, ready (``/readyz`` 200: the queue scanned, the broker confirming)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "synnefo_ganeti", "--log-format", "json", "watch", *argv,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    running = Eventd(process)
    running.reader = asyncio.create_task(_read_lines(running), name="eventd stderr")
    try:
        url = await eventually(
            lambda: process.returncode is None and running.metrics_url(), timeout=30, what="the metrics URL"
        )
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 30
            while True:  # (polled as eventually() does)
                assert process.returncode is None, "\n".join(running.lines[-20:])
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{url}/readyz") as answer:
                        if answer.status == 200:
                            break
                assert time.monotonic() < deadline, f"{url}/readyz not 200 within 30 s"
                await asyncio.sleep(0.2)
        yield running
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        if running.reader is not None and not running.reader.done():
            await asyncio.wait_for(running.reader, 10)


def argv(
    queue_dir: Path, ssconf_dir: Path, node: str, exchange: str, bed: Any, password_file: Path
) -> list[str]:
    return [
        "--eventd-compat", "--queue-dir", str(queue_dir), "--ssconf-dir", str(ssconf_dir),
        "--node-name", node, "--amqp", test_amqp_feed.BROKER_URL, "--exchange", exchange,
        "--rapi", bed.url, "--rapi-username", bed.username, "--rapi-password-file", str(password_file),
        "--rapi-ca-file", bed.ca_file, "--metrics-port", "0",
    ]  # fmt: skip


async def gnt_instance_list() -> str:
    process = await asyncio.create_subprocess_exec(
        *ns30("gnt-instance", "list", "--no-headers", "-o", "name"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    return out.decode()


async def remove_if_there(rapi: RapiClient, name: str) -> None:
    try:
        await rapi.get_instance(name)
    except NotFoundError:
        return
    await rapi.wait_for_job(await rapi.delete_instance(name), timeout=DEADLINE)


def bodies(got: Consumer, job_id: int) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for message in got.messages:
        body = orjson.loads(message.body)
        if isinstance(body, dict) and body.get("jobId") == job_id:
            assert message.content_type == "application/json" and message.delivery_mode == 2, message
            out.append((message.routing_key or "", body))
    return out


def check_job(got: Consumer, step: Step, *, name: str, cluster: str) -> None:
    """The job's messages: one per op status, in order, ending with success, eventd's fields."""
    messages = bodies(got, step.job_id)
    assert messages, f"no message of job {step.job_id} ({step.op_id})"
    statuses = []
    for key, body in messages:
        assert key == "ganeti.evd32.event.op", (step, key)
        assert body["type"] == "ganeti-op-status" and body["instance"] == name, (step, body)
        assert body["operation"] == step.op_id and body["cluster"] == cluster, (step, body)
        assert isinstance(body["jobId"], int), body
        seconds, micros = body["event_time"]
        assert isinstance(seconds, int) and isinstance(micros, int) and 0 <= micros < 1_000_000, body
        assert {"logmsg", "result", "job_fields", "tags"} <= body.keys(), body
        statuses.append(body["status"])
    seen = [(body["jobId"], body["operation"], body["status"]) for _, body in messages]
    assert len(seen) == len(set(seen)), f"duplicates in job {step.job_id}: {seen}"
    assert statuses[-1] == "success", (step, statuses)
    assert [ORDER.index(s) for s in statuses] == sorted(ORDER.index(s) for s in statuses), (step, statuses)
    times = [tuple(body["event_time"]) for _, body in messages]
    assert times == sorted(times), (step, times)
    success = messages[-1][1]
    if step.op_id in WITH_INFO:
        assert step.instance is not None
        want = InstanceInfo.from_rapi(step.instance)
        assert success["instance_nics"] == list(want.nics), (step, success)
        assert success["instance_disks"] == list(want.disks), (step, success)
        assert success["instance_hvparams"] == want.hvparams, (step, success)
        # against the RAPI's raw columns too, not only through InstanceInfo
        assert [nic["mac"] for nic in success["instance_nics"]] == step.instance["nic.macs"], success
        assert [nic["uuid"] for nic in success["instance_nics"]] == step.instance["nic.uuids"], success
        assert success["instance_nics"], "the instance has its default NIC"
        # eventd asks only hv/boot_order and hv/cdrom_image_path (None where the hypervisor has none)
        hvparams = step.instance["hvparams"]
        assert success["instance_hvparams"] == {key: hvparams.get(key) for key in HV_KEYS}, success
    else:
        assert not {"instance_nics", "instance_disks", "instance_hvparams"} & success.keys(), success


async def test_eventd_compat_publishes_a_lifecycle_of_the_real_cluster(
    testbed3: Any, rabbitmq: str, tmp_path: Path
) -> None:
    bed = testbed3.bed
    # node1's lib directory: the queue's parent as `scripts/ganeti-testbed env` names it, else the CA's
    queue_dir = QUEUE_DIR if "SYNNEFO_GANETI_TEST_QUEUE" in os.environ else Path(bed.ca_file).parent / "queue"
    master_lib = queue_dir.parent
    master = (master_lib / "ssconf_master_node").read_text().strip()
    cluster = (master_lib / "ssconf_cluster_name").read_text().strip()
    candidate = next(node for node in testbed3.nodes if node != master)
    candidate_lib = master_lib.parents[1] / candidate.split(".")[0] / "lib"
    assert (candidate_lib / "queue").is_dir(), f"{candidate}'s queue directory on this host"
    before = await gnt_instance_list()
    password_file = tmp_path / "rapi.password"
    password_file.write_text(bed.password + "\n")
    password_file.chmod(0o600)
    tag = uuid.uuid4().hex[:8]
    name = f"evd32-{tag}.ganeti.test"
    ours, theirs = f"test.evd32.{tag}.master", f"test.evd32.{tag}.candidate"
    steps: list[Step] = []
    async with (
        client(bed) as rapi,
        consumer(rabbitmq, ours) as got,
        consumer(rabbitmq, theirs) as other,
        eventd(*argv(queue_dir, master_lib, master, ours, bed, password_file)) as publishing,
        eventd(*argv(candidate_lib / "queue", candidate_lib, candidate, theirs, bed, password_file)) as idle,
    ):
        try:

            async def run(op_id: str, job_id: int, *, gone: bool = False) -> None:
                job = await rapi.wait_for_job(job_id, timeout=DEADLINE)
                assert job.status == "success", (op_id, job)
                instance = None if gone else (await rapi.get_instance(name)).model_dump(by_alias=True)
                steps.append(Step(op_id, job_id, job.ops[0], instance))

            created = spec(bed, name, pnode=master)
            await run("OP_INSTANCE_CREATE", await rapi.create_instance(created))
            await run("OP_INSTANCE_SHUTDOWN", await rapi.shutdown_instance(name))
            await run("OP_INSTANCE_STARTUP", await rapi.startup_instance(name))
            await run("OP_INSTANCE_REBOOT", await rapi.reboot_instance(name))
            await run("OP_INSTANCE_SET_PARAMS", await rapi.modify_instance(name, beparams={"memory": 256}))
            await run("OP_INSTANCE_REMOVE", await rapi.delete_instance(name), gone=True)
        finally:
            await remove_if_there(rapi, name)

        def all_succeeded() -> bool:
            return all(any(b["status"] == "success" for _, b in bodies(got, s.job_id)) for s in steps)

        await eventually(all_succeeded, timeout=DEADLINE, what="every job's success message", interval=0.1)
        assert publishing.process.returncode is None and idle.process.returncode is None
        master_code, candidate_code = await publishing.stop(), await idle.stop()
    assert master_code == 0, "\n".join(publishing.lines[-20:])
    assert candidate_code == 0, "\n".join(idle.lines[-20:])
    for step in steps:
        check_job(got, step, name=name, cluster=cluster)
    for step in steps[0], steps[4]:  # job_fields: the opcode's nics, disks, hvparams and beparams
        fields = {key: step.op.get(key) for key in ("nics", "disks", "hvparams", "beparams")}
        messages = [body for _, body in bodies(got, step.job_id)]
        # each message has the opcode of the job file's version it came from: Ganeti rewrites a
        # create's beparams (memory -> maxmem, minmem) while it runs, as GET /2/jobs shows it after
        assert messages[-1]["job_fields"] == fields, (step, messages[-1])
        for body in messages:
            assert {key: body["job_fields"][key] for key in ("nics", "disks", "hvparams")} == {
                key: fields[key] for key in ("nics", "disks", "hvparams")
            }, (step, body)
    upgraded = steps[0].op["beparams"]  # (the create's beparams: as submitted, or as Ganeti rewrote them)
    for _, body in bodies(got, steps[0].job_id):
        assert body["job_fields"]["beparams"] in ({"memory": 128}, upgraded), body
    assert steps[4].op["beparams"] == {"memory": 256}, steps[4].op
    assert steps[4].instance is not None and steps[4].instance["beparams"]["memory"] == 256
    # the candidate read the same jobs and published nothing
    assert other.messages == [], [m.body for m in other.messages]
    (stopped,) = [r for r in idle.records() if "versions_read" in r]
    assert stopped["messages_published"] == 0 and stopped["versions_read"] > 0, stopped
    (stopped,) = [r for r in publishing.records() if "versions_read" in r]
    assert stopped["messages_published"] >= sum(len(bodies(got, s.job_id)) for s in steps), stopped
    assert await gnt_instance_list() == before
