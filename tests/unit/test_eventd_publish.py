"""``watch --eventd-compat``: eventd's messages from real job files to real RabbitMQ (issue 32 item 2).

Recorded Ganeti 3.0 job files are written into a temp queue directory the way Ganeti does
(a temp file, then a rename to ``job-N``), read by the real watcher (inotify) and published
by :class:`~synnefo_ganeti.dispatch.EventdPublisher` to a uuid exchange that a test queue
is bound to. The expected messages are :func:`~synnefo_ganeti.watch.eventd_messages` over the
same versions. The RabbitMQ fixture, consumer and TCP proxy are test_amqp_feed.py's: skipped
without a broker at 127.0.0.1:5672, failed under ``CI``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aio_pika
import orjson
import pytest
from click.testing import CliRunner

from synnefo_ganeti.cli import main
from synnefo_ganeti.dispatch import EventdPublisher, MasterCheck
from synnefo_ganeti.jobs import parse_job_file
from synnefo_ganeti.rapi import RapiClient
from synnefo_ganeti.store import JobVersion
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.watch import (
    EventdMessage,
    InstanceInfo,
    QueueWatcher,
    eventd_messages,
    instances_needing_info,
)
from tests.helpers import QUEUE_FIXTURES, eventually, spec
from tests.unit import test_amqp_feed
from tests.unit.test_amqp_feed import Consumer, Proxy, consumer
from tests.unit.test_cloud_actions import QUICK
from tests.unit.test_eventd_messages import CLUSTER, RAPI_INSTANCE

#: the RabbitMQ fixture of test_amqp_feed.py (skipped without a broker, failed under CI)
rabbitmq = test_amqp_feed.rabbitmq

NODE = "node1.ganeti.test"
LIFECYCLES = ("lifecycle-job-20", "lifecycle-job-12", "lifecycle-job-23")


class StubRapi:
    """``get_instance`` answering RAPI_INSTANCE, failing, or hanging; counts the calls."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.asked: list[str] = []

    async def get_instance(self, name: str) -> Any:
        self.asked.append(name)
        if self.mode == "fail":
            raise ConnectionError("RAPI down")
        if self.mode == "hang":
            await asyncio.Event().wait()
        return RAPI_INSTANCE


def _ssconf(tmp_path: Path, master: str) -> Path:
    ssconf = tmp_path / "ssconf"
    ssconf.mkdir(exist_ok=True)
    (ssconf / "ssconf_master_node").write_text(master + "\n")
    (ssconf / "ssconf_cluster_name").write_text(CLUSTER + "\n")
    return ssconf


def _versions(folder: str) -> list[Path]:
    return sorted((QUEUE_FIXTURES / folder).iterdir())


def _job_id(path: Path) -> int:
    return parse_job_file(path.read_bytes()).job_id


def write_like_ganeti(queue: Path, source: Path, serial: int) -> None:
    """As Ganeti's ``utils.WriteFile``: a temp file beside it, then a rename to ``job-N``."""
    job_id = _job_id(source)
    temp = queue / f"job-{job_id}-{os.getpid()}-{serial}.tmp"
    shutil.copyfile(source, temp)
    os.rename(temp, queue / f"job-{job_id}")


def expected(paths: Sequence[Path], *, info: bool = True) -> list[EventdMessage]:
    """eventd_messages over the versions, each job's first from None."""
    out: list[EventdMessage] = []
    seen: dict[int, Any] = {}
    for path in paths:
        job = parse_job_file(path.read_bytes())
        previous = seen.get(job.job_id)
        names = instances_needing_info(previous, job) if info else []
        found = {name: InstanceInfo.from_rapi(RAPI_INSTANCE) for name in names}
        out += eventd_messages(previous, job, cluster=CLUSTER, instance_info=found)
        seen[job.job_id] = job
    return out


def received(got: Consumer) -> list[tuple[str, Any]]:
    return [(m.routing_key or "", orjson.loads(m.body)) for m in got.messages]


def as_pairs(messages: Sequence[EventdMessage]) -> list[tuple[str, Any]]:
    return [(m.routing_key, orjson.loads(orjson.dumps(m.body))) for m in messages]


@contextlib.asynccontextmanager
async def publishing(
    queue: Path,
    url: str,
    exchange: str,
    master: MasterCheck,
    rapi: StubRapi | RapiClient | None,
    **kwargs: Any,
) -> AsyncIterator[tuple[EventdPublisher, QueueWatcher]]:
    """The watcher and the publisher running as the CLI runs them."""
    publisher = EventdPublisher(
        url,
        cluster=CLUSTER,
        master=master.is_master,
        rapi=rapi,
        exchange=exchange,
        timeout=5.0,
        retry_max=0.3,
        check_interval=0.1,
        **kwargs,
    )
    watcher = QueueWatcher(queue, publisher, "c1", retry_interval=0.1, archive=False)
    publisher.on_master = watcher.resume
    tasks = [asyncio.create_task(watcher.run()), asyncio.create_task(publisher.run())]
    await watcher.ready.wait()
    try:
        yield publisher, watcher
    finally:
        failed = [t.exception() for t in tasks if t.done() and not t.cancelled()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert not failed, failed  # neither stopped on its own


async def feed(queue: Path, publisher: EventdPublisher, paths: Sequence[Path], start: int = 0) -> None:
    """Write each version and wait until the watcher handed it over (no version coalesced)."""
    for serial, path in enumerate(paths, start):
        before = publisher.read
        write_like_ganeti(queue, path, serial)
        await eventually(lambda b=before: publisher.read > b, what=f"{path.name} read")  # type: ignore[misc]


async def test_recorded_lifecycles_are_published_in_order_once(rabbitmq: str, tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    queue.mkdir()
    (queue / "archive" / "0").mkdir(parents=True)  # archived jobs are not read
    shutil.copyfile(
        QUEUE_FIXTURES / "job-11.op_instance_create.success.json", queue / "archive" / "0" / "job-11"
    )
    # a temp file left behind (Ganeti died mid-write): never read as a job
    shutil.copyfile(QUEUE_FIXTURES / "job-13.op_instance_startup.success.json", queue / "job-13-99-1.tmp")
    (queue / "job-13XXXXXXXX.new").write_bytes(b"{not json")
    master = MasterCheck(_ssconf(tmp_path, NODE), node_name=NODE)
    exchange = f"test.eventd.{uuid.uuid4().hex}"
    rapi = StubRapi()
    paths = [p for folder in LIFECYCLES for p in _versions(folder)]
    async with consumer(rabbitmq, exchange) as got:
        async with publishing(queue, rabbitmq, exchange, master, rapi) as (publisher, _watcher):
            await feed(queue, publisher, paths)
            want = as_pairs(expected(paths))
            await eventually(
                lambda: len(got.messages) >= len(want) and not publisher.pending,
                what=f"all published ({publisher!r})",
            )
            assert received(got) == want
            assert publisher.published == len(want) and publisher.dropped == 0
            assert "(master)" in repr(publisher) and "guest:guest" not in repr(publisher)
        assert rapi.asked == ["inst5.ganeti.test", *rapi.asked[1:]] and len(rapi.asked) >= 1
        for message in got.messages:
            assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
            assert message.content_type == "application/json"
        # each op's status change once: no message twice
        bodies = [orjson.dumps(body, option=orjson.OPT_SORT_KEYS) for _, body in received(got)]
        assert len(bodies) == len(set(bodies))
        assert {body["jobId"] for _, body in received(got)} == {20, 12, 23}
        # the instance info where eventd sent it
        with_info = [body for _, body in received(got) if "instance_nics" in body]
        assert with_info and all(b["instance_hvparams"]["boot_order"] == "disk" for b in with_info)


async def test_a_restart_publishes_the_queue_again_from_none(rabbitmq: str, tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    queue.mkdir()
    last = _versions("lifecycle-job-12")[-1]
    write_like_ganeti(queue, last, 0)  # written while nothing ran
    master = MasterCheck(_ssconf(tmp_path, NODE), node_name=NODE)
    exchange = f"test.eventd.{uuid.uuid4().hex}"
    want = as_pairs(expected([last]))
    async with (
        consumer(rabbitmq, exchange) as got,
        publishing(queue, rabbitmq, exchange, master, StubRapi()) as (publisher, _),
    ):
        await eventually(lambda: len(got.messages) >= len(want) and not publisher.pending)
        assert received(got) == want


async def test_not_the_master_publishes_nothing_until_it_is(rabbitmq: str, tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    queue.mkdir()
    ssconf = _ssconf(tmp_path, "node2.ganeti.test")
    master = MasterCheck(ssconf, node_name=NODE)
    exchange = f"test.eventd.{uuid.uuid4().hex}"
    paths = _versions("lifecycle-job-20")
    async with consumer(rabbitmq, exchange) as got:
        async with publishing(queue, rabbitmq, exchange, master, StubRapi()) as (publisher, _):
            await feed(queue, publisher, paths)
            await eventually(lambda: publisher.dropped == len(paths), what="every version dropped")
            assert publisher.published == 0
            assert "not master" in repr(publisher)
            # a master failover to this node: the queue read again, each job from None
            (ssconf / "ssconf_master_node").write_text(NODE + "\n")
            want = as_pairs(expected(paths[-1:]))
            await eventually(lambda: len(got.messages) >= len(want) and not publisher.pending)
            assert received(got) == want and publisher.is_master
        assert all(orjson.loads(m.body)["jobId"] == 20 for m in got.messages)


async def test_a_broker_outage_loses_nothing(
    rabbitmq: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    queue = tmp_path / "queue"
    queue.mkdir()
    master = MasterCheck(_ssconf(tmp_path, NODE), node_name=NODE)
    exchange = f"test.eventd.{uuid.uuid4().hex}"
    paths = [p for folder in LIFECYCLES for p in _versions(folder)]
    half = len(paths) // 2
    proxy = Proxy()
    await proxy.start()
    try:
        async with consumer(rabbitmq, exchange) as got:
            async with publishing(queue, proxy.url, exchange, master, StubRapi()) as (publisher, _):
                await feed(queue, publisher, paths[:half])
                await eventually(lambda: publisher.published > 0 and not publisher.pending)
                await proxy.stop()  # the broker goes away
                await feed(queue, publisher, paths[half:], start=half)
                await eventually(lambda: publisher.failures >= 1, what="a failure seen")
                assert publisher.pending > 0
                await proxy.start()
                want = as_pairs(expected(paths))
                await eventually(lambda: not publisher.pending, what="all confirmed")
                await eventually(lambda: len(got.messages) >= len(want))
            # at least once, in order: with repeats of a resent tail dropped, exactly what was wanted
            got_pairs = received(got)
            firsts: list[tuple[str, Any]] = []
            for pair in got_pairs:
                if pair not in firsts:
                    firsts.append(pair)
            assert firsts == want
    finally:
        await proxy.stop()
    assert "guest:guest" not in caplog.text and "cannot publish" in caplog.text


async def test_a_rapi_failure_or_timeout_sends_without_instance_info(
    rabbitmq: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    master = MasterCheck(_ssconf(tmp_path, NODE), node_name=NODE)
    paths = _versions("lifecycle-job-20")
    want = as_pairs(expected(paths, info=False))
    for mode in ("fail", "hang"):
        queue = tmp_path / f"queue-{mode}"
        queue.mkdir()
        exchange = f"test.eventd.{uuid.uuid4().hex}"
        rapi = StubRapi(mode)
        async with (
            consumer(rabbitmq, exchange) as got,
            publishing(queue, rabbitmq, exchange, master, rapi, info_timeout=0.2) as (publisher, _),
        ):
            await feed(queue, publisher, paths)
            await eventually(
                lambda p=publisher, g=got: len(g.messages) >= len(want) and not p.pending  # type: ignore[misc]
            )
            assert received(got) == want and publisher.info_failures == 1
        assert rapi.asked == ["inst5.ganeti.test"]
    assert "no instance info for inst5.ganeti.test (job 20)" in caplog.text


def test_master_check(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    check = MasterCheck(tmp_path, node_name=NODE)
    assert not check.is_master() and "cannot read" in (check.problem or "")
    assert "cannot read" in caplog.text
    (tmp_path / "ssconf_master_node").write_text(f"{NODE}\n")
    assert (
        check.is_master() and check.problem is None and repr(check) == f"<MasterCheck {NODE} (master {NODE})>"
    )
    (tmp_path / "ssconf_master_node").write_text("node2\n")
    assert not check.is_master()
    assert MasterCheck(tmp_path).node_name  # the FQDN by default


# -- the CLI's option errors -----------------------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, ["watch", *args], catch_exceptions=False, env=env)


def test_cli_option_errors(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    queue.mkdir()
    ssconf = _ssconf(tmp_path, NODE)
    base = ["--queue-dir", str(queue), "--ssconf-dir", str(ssconf)]
    cases = [
        ([*base, "--eventd-compat"], "give --amqp amqp://USER:PASS@HOST:5672/ or --amqp-url-file FILE"),
        ([*base, "--eventd-compat", "--amqp", "http://x/"], "must be an amqp:// or amqps:// URL"),
        ([*base, "--eventd-compat", "--amqp", "amqp://h/", "--backend", "c1"], "drop --backend"),
        (
            [*base, "--eventd-compat", "--amqp", "amqp://h/", "--rapi", "https://h:5080"],
            "needs --rapi-username",
        ),
        ([*base, "--eventd-compat", "--amqp", "amqp://h/", "--rapi-username", "u"], "need --rapi URL"),
        ([*base, "--amqp", "amqp://h/"], "--amqp: only with --eventd-compat"),
        (["--queue-dir", str(queue), "--db", "sqlite:///x.db"], "Missing option '--backend'"),
        (
            [
                "--queue-dir",
                str(queue),
                "--ssconf-dir",
                str(tmp_path / "none"),
                "--eventd-compat",
                "--amqp",
                "amqp://h/",
            ],
            "give --cluster-name NAME",
        ),
    ]
    for args, message in cases:
        result = _cli(*args, env={"SYNNEFO_GANETI_AMQP_URL": ""})
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
    loose = tmp_path / "amqp.url"
    loose.write_text("amqp://guest:guest@127.0.0.1/\n")
    loose.chmod(0o644)
    result = _cli(*base, "--eventd-compat", "--amqp-url-file", str(loose))
    assert result.exit_code == 2 and str(loose) in result.output and "guest:guest" not in result.output


async def test_the_command_publishes_and_stops_on_sigterm(rabbitmq: str, tmp_path: Path) -> None:
    """``watch --eventd-compat`` as a process: the URL from a file, the cluster from ssconf."""
    queue = tmp_path / "queue"
    queue.mkdir()
    ssconf = _ssconf(tmp_path, NODE)
    url_file = tmp_path / "amqp.url"
    url_file.write_text(rabbitmq + "\n")
    url_file.chmod(0o600)
    exchange = f"test.eventd.{uuid.uuid4().hex}"
    paths = _versions("lifecycle-job-12")
    want = as_pairs(expected(paths[-1:], info=False))
    async with consumer(rabbitmq, exchange) as got:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "synnefo_ganeti", "watch", "--queue-dir", str(queue), "--eventd-compat",
            "--amqp-url-file", str(url_file), "--exchange", exchange, "--ssconf-dir", str(ssconf),
            "--node-name", NODE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            write_like_ganeti(queue, paths[-1], 0)
            await eventually(lambda: len(got.messages) >= len(want), what="the command's messages")
            process.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(process.communicate(), 30)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert process.returncode == 0, err.decode()
    assert received(got) == want
    text = err.decode()
    assert "stopped after" in text and "guest:guest" not in text and f"cluster {CLUSTER}" in text


async def test_a_create_on_the_fake_ganeti_carries_its_rapi_instance_info(
    rabbitmq: str, tmp_path: Path
) -> None:
    """The fake Ganeti writes the job files and answers the RAPI: the create's success carries
    the instance's NICs, disks and hvparams as the RAPI client reads them."""
    queue = tmp_path / "queue"
    master = MasterCheck(_ssconf(tmp_path, NODE), node_name=NODE)
    exchange = f"test.eventd.{uuid.uuid4().hex}"
    async with (
        FakeGaneti(tls=False, queue_dir=queue, op_times=QUICK) as fake,
        RapiClient(fake.url, username=fake.username, password=fake.password) as client,
        consumer(rabbitmq, exchange) as got,
        publishing(queue, rabbitmq, exchange, master, client) as (publisher, _),
    ):
        job_id = await client.create_instance(spec("vm1.fake.test"))
        await client.wait_for_job(job_id, timeout=30)

        def created() -> list[Any]:
            return [
                body
                for _, body in received(got)
                if body.get("operation") == "OP_INSTANCE_CREATE" and body["status"] == "success"
            ]

        (body,) = await eventually(created, what="the create's success")
        assert body["jobId"] == job_id and body["instance"] == "vm1.fake.test"
        instance = await client.get_instance("vm1.fake.test")
        want = InstanceInfo.from_rapi(instance)
        assert body["instance_nics"] == list(want.nics) and body["instance_disks"] == list(want.disks)
        assert body["instance_hvparams"] == want.hvparams and publisher.info_failures == 0
        statuses = [b["status"] for _, b in received(got) if b.get("jobId") == job_id]
        assert len(statuses) == len(set(statuses))  # each status once


async def test_a_shutdown_while_the_rapi_is_asked_keeps_the_version_for_flush(
    rabbitmq: str, tmp_path: Path
) -> None:
    master = MasterCheck(_ssconf(tmp_path, NODE), node_name=NODE)
    exchange = f"test.eventd.{uuid.uuid4().hex}"
    rapi = StubRapi("hang")
    paths = _versions("lifecycle-job-20")
    publisher = EventdPublisher(
        rabbitmq, cluster=CLUSTER, master=master.is_master, rapi=rapi, exchange=exchange, info_timeout=60
    )
    async with consumer(rabbitmq, exchange) as got:
        for path in paths:
            await publisher.put(JobVersion("c1", parse_job_file(path.read_bytes())))
        task = asyncio.create_task(publisher.run())
        await eventually(lambda: rapi.asked, what="the RAPI asked")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert publisher.pending > 0
        rapi.mode = "ok"
        assert await publisher.flush(10.0)
        want = as_pairs(expected(paths))
        await eventually(lambda: len(got.messages) >= len(want))
        assert received(got) == want
