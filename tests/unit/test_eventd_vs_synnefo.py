"""Our eventd messages against Synnefo's own code, on every recorded Ganeti 3.0 job file (issue 32 item 3).

The oracle is eventd itself, ported literally (tests/unit/_synnefo_eventd.py: grnet/synnefo
d06ec8c78, ``snf-cyclades-gtools/synnefo/ganeti/eventd.py``); the consumer is snf-dispatcher's
parsing (tests/unit/_synnefo_callbacks.py). Every recorded job file is compared, the final
versions one by one and the lifecycle series version by version, with the instance info from
one RAPI answer given to both (eventd's ``QueryInstances`` row and our
:meth:`InstanceInfo.from_rapi` read the same ``GET /2/instances/NAME``).

Where we differ from eventd on purpose (synnefo_ganeti/watch/_eventd.py's docstring), the
difference is encoded here, not skipped:

* **once per op status** (:func:`eventd_once`): eventd publishes every op of a job on every
  write (and twice per write: ``IN_CLOSE_WRITE`` of the temp file, then ``IN_MOVED_TO``), so
  its output over a job's versions is kept at the first message per (job, op index, status);
  within one version ours come in time order, eventd's in op order, so one version's
  messages are compared as a multiset.
* **crashes** (:func:`test_where_eventd_crashes_the_rest_of_the_file_is_lost_here_not`): no
  recorded file crashes eventd (asserted); on variants that do, eventd's messages before the
  crash are ours, the crashing op sends nothing in both, and the ops after it are sent by us.
* **"cancelled"**: kept as eventd has it (no instance info for a canceled set-params), checked
  on a variant.
* **instance gone**: eventd sends nothing for that op (its config-file fallback raises a
  ``KeyError`` its ``except KeyError`` swallows); we send it without the ``instance_*`` keys.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from synnefo_ganeti.dispatch import MasterCheck
from synnefo_ganeti.jobs import JobFile, parse_job_file
from synnefo_ganeti.watch import InstanceInfo, eventd_messages, instances_needing_info
from tests.helpers import QUEUE_FIXTURES, RAPI_FIXTURES, eventually
from tests.unit import _synnefo_callbacks as synnefo
from tests.unit import test_amqp_feed
from tests.unit._synnefo_eventd import JobFileHandler, Published, row_from_rapi
from tests.unit.test_amqp_feed import consumer
from tests.unit.test_eventd_messages import CLUSTER, RAPI_INSTANCE
from tests.unit.test_eventd_publish import NODE, StubRapi, _ssconf, feed, publishing, received

#: the RabbitMQ fixture of test_amqp_feed.py (failed under CI without a broker)
rabbitmq = test_amqp_feed.rabbitmq

MULTI = QUEUE_FIXTURES / "multi-node"
#: GET /2/instances/rec32-a.ganeti.test on the 3-node lab after jobs 6-12 (two NICs, no disk)
REC32_INSTANCE: dict[str, Any] = json.loads((RAPI_FIXTURES / "instance_rec32_multi_node.json").read_text())

FINAL_FILES = sorted(
    [
        *QUEUE_FIXTURES.glob("job-*.json"),
        *(QUEUE_FIXTURES / "surface").glob("job-*.json"),
        *MULTI.glob("job-*.json"),
        QUEUE_FIXTURES / "archive" / "0" / "job-2",
    ]
)
LIFECYCLE_DIRS = sorted([*QUEUE_FIXTURES.glob("lifecycle-job-*"), *MULTI.glob("lifecycle-job-*")])


def _rel(path: Path) -> str:
    return path.relative_to(QUEUE_FIXTURES).as_posix()


def _rapi_answer(name: str) -> dict[str, Any]:
    """The RAPI instance both sides read: the recorded one for the lab's rec32 instances."""
    return REC32_INSTANCE if name.startswith("rec32-") else RAPI_INSTANCE


def _oracle(raw: dict[str, Any], answer: Any = _rapi_answer) -> Published:
    return JobFileHandler(
        CLUSTER, lambda name, fields: row_from_rapi(answer(name), fields)
    ).process_IN_MOVED_TO(raw)


def _ours(previous: JobFile | None, job: JobFile, answer: Any = _rapi_answer) -> list[tuple[str, Any]]:
    info = {name: InstanceInfo.from_rapi(answer(name)) for name in instances_needing_info(previous, job)}
    messages = eventd_messages(previous, job, cluster=CLUSTER, instance_info=info)
    return [(m.routing_key, orjson.loads(orjson.dumps(m.body))) for m in messages]


def _bag(pairs: Iterable[tuple[str, Any]]) -> list[bytes]:
    """Messages as a multiset (one version's order is not compared: see the module docstring)."""
    return sorted(orjson.dumps(pair, option=orjson.OPT_SORT_KEYS) for pair in pairs)


def eventd_once(
    versions: Sequence[dict[str, Any]],
    seen: set[tuple[int, int, str]] | None = None,
    answer: Any = _rapi_answer,
) -> list[Any]:
    """The encoded difference: eventd over the versions, each write processed twice (temp file
    on ``IN_CLOSE_WRITE``, ``job-N`` on ``IN_MOVED_TO``), each (job, op index, status) kept once.
    One list per version."""
    seen = set() if seen is None else seen
    out: list[list[tuple[str, Any]]] = []
    for raw in versions:
        kept: list[tuple[str, Any]] = []
        for _pass in ("IN_CLOSE_WRITE", "IN_MOVED_TO"):
            published = _oracle(raw, answer)
            assert published.crashed is None, published.crashed
            for index, key, body in published.messages:
                if (body["jobId"], index, body["status"]) not in seen:
                    seen.add((body["jobId"], index, body["status"]))
                    kept.append((key, body))
        out.append(kept)
    return out


# --- every recorded final version: the same messages as eventd's one pass ---


@pytest.mark.parametrize("path", FINAL_FILES, ids=_rel)
def test_one_final_version_gives_eventds_messages(path: Path) -> None:
    raw = json.loads(path.read_text())
    published = _oracle(raw)
    assert published.crashed is None  # no recorded file crashes eventd
    ours = _ours(None, parse_job_file(path.read_bytes()))
    # one write: eventd sends each op once, we send each op's (first seen) status once
    assert _bag(ours) == _bag(published.pairs())


def test_the_final_versions_cover_every_kind_of_message() -> None:
    """The comparison above is not vacuous: every handler of eventd answers on some file."""
    seen: set[tuple[str, str, bool]] = set()
    for path in FINAL_FILES:
        for _index, key, body in _oracle(json.loads(path.read_text())).messages:
            seen.add((key.split(".")[-1], body["status"], "instance_nics" in body))
    assert {
        ("op", "success", True),  # create / startup / set-params
        ("op", "error", True),  # set-params that failed (job 12)
        ("op", "success", False),  # reboot, shutdown, remove, tags
        ("op", "error", False),  # failed create, failed reboot (job 13)
        ("op", "canceled", False),
        ("network", "success", False),
        ("network", "error", False),
        ("cluster", "success", False),
    } <= seen
    operations = {
        body["operation"]
        for path in FINAL_FILES
        for _, _, body in _oracle(json.loads(path.read_text())).messages
    }
    for wanted in (
        "OP_INSTANCE_CREATE",
        "OP_INSTANCE_STARTUP",
        "OP_INSTANCE_SHUTDOWN",
        "OP_INSTANCE_REBOOT",
        "OP_INSTANCE_SET_PARAMS",
        "OP_INSTANCE_REMOVE",
        "OP_NETWORK_ADD",
        "OP_NETWORK_CONNECT",
        "OP_NETWORK_DISCONNECT",
        "OP_NETWORK_REMOVE",
    ):
        assert wanted in operations


# --- every lifecycle, version by version: eventd's output kept once per op status ---


@pytest.mark.parametrize("folder", LIFECYCLE_DIRS, ids=_rel)
def test_version_by_version_gives_eventds_messages_once_per_op_status(folder: Path) -> None:
    paths = sorted(folder.iterdir())
    want = eventd_once([json.loads(p.read_text()) for p in paths])
    previous: JobFile | None = None
    total = 0
    for path, eventd_new in zip(paths, want, strict=True):
        job = parse_job_file(path.read_bytes())
        ours = _ours(previous, job)
        assert _bag(ours) == _bag(eventd_new), path.name
        total += len(ours)
        previous = job
    # and what eventd really sent was more: every op on every write, twice
    raw_count = sum(2 * len(_oracle(json.loads(p.read_text())).messages) for p in paths)
    assert 0 < total < raw_count


# --- the differences kept on purpose, on variants of real files ---


def _raw(path: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def _parse(raw: dict[str, Any]) -> JobFile:
    return parse_job_file(json.dumps(raw).encode())


def test_where_eventd_crashes_the_rest_of_the_file_is_lost_here_not() -> None:
    # job 23: OP_TEST_DELAY, OP_INSTANCE_SHUTDOWN, OP_TEST_DELAY; op 0 made an OP_TAGS_SEARCH
    # (no ``kind``: eventd's ``input.kind`` raises), op 2 a shutdown of a second instance
    raw = _raw(QUEUE_FIXTURES / "job-23.multi_op.success.json")
    raw["ops"][0]["input"] = {"OP_ID": "OP_TAGS_SEARCH", "pattern": "x", "dry_run": False}
    raw["ops"][2]["input"] = {**raw["ops"][1]["input"], "instance_name": "inst9.ganeti.test"}
    published = _oracle(raw)
    assert published.crashed == "AttributeError: kind" and published.messages == []
    ours = _ours(None, _parse(raw))
    assert [body["instance"] for _, body in ours] == ["inst3.ganeti.test", "inst9.ganeti.test"]
    # the crash in the middle: eventd's messages before it are ours, the crashing op none
    raw["ops"][0], raw["ops"][1] = raw["ops"][1], raw["ops"][0]
    published = _oracle(raw)
    assert published.crashed == "AttributeError: kind"
    assert published.pairs() == _ours(None, _parse(raw))[:1]
    # a multi-alloc of one instance: its ``instances`` holds an opcode, which has no split()
    raw = _raw(QUEUE_FIXTURES / "job-1528.op_instance_multi_alloc.success.json")
    raw["ops"][0]["input"]["instances"] = raw["ops"][0]["input"]["instances"][:1]
    assert _oracle(raw).crashed == "AttributeError: 'dict' object has no attribute 'split'"
    assert _ours(None, _parse(raw)) == []


def test_cancelled_is_eventds_word_and_kept() -> None:
    """eventd asks for instance info on ``"cancelled"``, which Ganeti never writes: a canceled
    set-params carries none, in both."""
    raw = _raw(MULTI / "job-12.op_instance_set_params.error_ip_not_available.json")
    raw["ops"][0]["status"] = "canceled"
    (eventd,) = _oracle(raw).pairs()
    assert _ours(None, _parse(raw)) == [eventd]
    assert "instance_nics" not in eventd[1] and eventd[1]["status"] == "canceled"


def test_an_instance_gone_is_sent_without_its_info_where_eventd_sent_nothing() -> None:
    path = MULTI / "job-10.op_instance_set_params.success_beparams_nic_add.json"

    def gone(name: str) -> Any:
        # QueryInstances: OpPrereqError; eventd then reads config.data, whose instances are
        # keyed by uuid since Ganeti 2.12: config["instances"][name] is a KeyError
        raise KeyError(name)

    assert _oracle(_raw(path), gone) == Published()  # swallowed by ``except KeyError``
    job = parse_job_file(path.read_bytes())
    (message,) = eventd_messages(None, job, cluster=CLUSTER, instance_info={})
    assert message.body["status"] == "success" and "instance_nics" not in message.body


# --- what Cyclades records from them (snf-dispatcher's parsing) ---

#: the names Cyclades gives (snf-<id>, snf-net-<id>, snf-nic-<id>) in place of the lab's
CYCLADES_NAMES = {
    "rec32-a.ganeti.test": "snf-61",
    "rec32-gone.ganeti.test": "snf-62",
    '"rec32-net"': '"snf-net-8"',
    "rec32-nic1": "snf-nic-5",
}
CYCLADES_INSTANCE = {
    **REC32_INSTANCE,
    "nic.names": ["snf-nic-4", "snf-nic-5"],
    "nic.networks.names": ["snf-net-1", "snf-net-8"],
    "tags": [*REC32_INSTANCE["tags"], "synnefo:network:snf-nic-5:protected"],
}
PARSED_NICS = {
    4: {"index": 0, "network": 1, "mac": "aa:00:00:5d:b7:10", "ipv4_address": None, "firewall": None},
    5: {
        "index": 1,
        "network": 8,
        "mac": "aa:00:00:56:1e:23",
        "ipv4_address": "10.32.0.2",
        "firewall": "protected",
    },
}


def _cyclades_raw(path: Path) -> dict[str, Any]:
    text = path.read_text()
    for old, new in CYCLADES_NAMES.items():
        text = text.replace(old, new)
    result: dict[str, Any] = json.loads(text)
    return result


def _cyclades(path: Path) -> list[tuple[synnefo.Delivery, dict[str, Any]]]:
    """Our messages for the file (Cyclades' names), each as snf-dispatcher takes it; and they are
    eventd's."""
    raw = _cyclades_raw(path)
    answer = lambda _name: CYCLADES_INSTANCE  # noqa: E731
    ours = _ours(None, _parse(raw), answer)
    assert _bag(ours) == _bag(_oracle(raw, answer).pairs())
    out = []
    for key, body in ours:
        delivery = synnefo.deliver(key, json.dumps(body).encode())
        assert (delivery.outcome, delivery.ignored) == ("ack", None), (delivery, body)
        out.append((delivery, body))
    return out


def _resize(fields: dict[str, Any]) -> tuple[Any, Any] | None:
    """backend.py ``process_op_status``: on success, ``beparams`` ``vcpus``/``maxmem`` pick the flavor."""
    beparams = fields["job_fields"].get("beparams")
    if fields["status"] == "success" and beparams:
        return beparams.get("vcpus"), beparams.get("maxmem")
    return None


CYCLADES_RECORDS = {
    "job-6.op_instance_create.success.json": (
        "update_db",
        "OP_INSTANCE_CREATE",
        "success",
        6,
        True,
        (1, 128),
    ),
    "job-9.op_instance_reboot.success.json": ("update_db", "OP_INSTANCE_REBOOT", "success", 9, False, None),
    "job-10.op_instance_set_params.success_beparams_nic_add.json": (
        "update_db",
        "OP_INSTANCE_SET_PARAMS",
        "success",
        10,
        True,
        (2, 256),
    ),
    "job-11.op_instance_set_params.success_beparams.json": (
        "update_db",
        "OP_INSTANCE_SET_PARAMS",
        "success",
        11,
        True,
        (None, 128),
    ),
    "job-12.op_instance_set_params.error_ip_not_available.json": (
        "update_db",
        "OP_INSTANCE_SET_PARAMS",
        "error",
        12,
        True,
        None,
    ),
    "job-13.op_instance_reboot.error_unknown_instance.json": (
        "update_db",
        "OP_INSTANCE_REBOOT",
        "error",
        13,
        False,
        None,
    ),
    "job-14.op_instance_remove.success.json": ("update_db", "OP_INSTANCE_REMOVE", "success", 14, False, None),
    "job-7.op_network_add.success.json": ("update_network", "OP_NETWORK_ADD", "success", 7, False, None),
    "job-8.op_network_connect.success.json": (
        "update_network",
        "OP_NETWORK_CONNECT",
        "success",
        8,
        False,
        None,
    ),
    "job-15.op_network_disconnect.success.json": (
        "update_network",
        "OP_NETWORK_DISCONNECT",
        "success",
        15,
        False,
        None,
    ),
    "job-16.op_network_remove.success.json": (
        "update_network",
        "OP_NETWORK_REMOVE",
        "success",
        16,
        False,
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(CYCLADES_RECORDS))
def test_what_cyclades_records_from_the_new_recordings(name: str) -> None:
    handler, operation, status, job_id, with_nics, resize = CYCLADES_RECORDS[name]
    ((delivery, body),) = _cyclades(MULTI / name)
    raw = _raw(MULTI / name)
    fields = delivery.fields
    assert delivery.handler == handler
    assert (fields["operation"], fields["status"], fields["jobId"]) == (operation, status, job_id)
    seconds, micro = raw["ops"][0]["end_timestamp"]
    assert fields["event_time"].timestamp() == pytest.approx(seconds + micro / 1e6, abs=1e-6)
    log = raw["ops"][0]["log"]
    assert fields["logmsg"] == (log[-1][-1] if log else None)
    if handler == "update_db":
        assert fields["vm_id"] == (62 if "gone" in json.dumps(raw) else 61)
        assert ("parsed_nics" in fields) is with_nics
        if with_nics:
            assert fields["parsed_nics"] == PARSED_NICS
            assert fields["parsed_disks"] == {}
            assert fields["parsed_hvparams"] == (None, None)  # the fake hypervisor has neither
        assert _resize(fields) == resize
        if status == "error":
            assert fields["result"][0] == "OpPrereqError"
    else:
        assert fields["network_id"] == 8 and fields["cluster"] == CLUSTER
    if operation == "OP_NETWORK_ADD":
        assert fields["job_fields"] == {
            "subnet": "10.32.0.0/28",
            "gateway": "10.32.0.1",
            "add_reserved_ips": ["10.32.0.5", "10.32.0.6"],
            "remove_reserved_ips": None,
            "group_name": None,
        }
    if operation in ("OP_NETWORK_CONNECT", "OP_NETWORK_DISCONNECT"):
        assert fields["job_fields"]["group_name"] == "default"
    if operation == "OP_INSTANCE_SET_PARAMS":
        assert fields["job_fields"]["beparams"] == body["job_fields"]["beparams"] != {}


def test_cyclades_takes_every_version_of_the_new_lifecycles() -> None:
    """Every message of every version (Cyclades' names): acked, read, and in event-time order per job."""
    for folder in sorted(MULTI.glob("lifecycle-job-*")):
        seen: set[tuple[int, int, str]] = set()
        previous: JobFile | None = None
        times = []
        statuses = []
        for path in sorted(folder.iterdir()):
            raw = _cyclades_raw(path)
            job = _parse(raw)
            answer = lambda _name: CYCLADES_INSTANCE  # noqa: E731
            ours = _ours(previous, job, answer)
            assert _bag(ours) == _bag(eventd_once([raw], seen, answer)[0])
            for key, body in ours:
                delivery = synnefo.deliver(key, json.dumps(body).encode())
                assert (delivery.outcome, delivery.ignored) == ("ack", None), (folder.name, path.name)
                assert delivery.fields["status"] == body["status"]
                times.append(delivery.fields["event_time"])
                statuses.append(body["status"])
            previous = job
        # a failed reboot of an unknown instance fails in prereq: never running
        assert statuses in (["queued", "waiting", "running", statuses[-1]], ["queued", "waiting", "error"])
        assert times == sorted(times), folder.name


# --- on real RabbitMQ: the new recordings published, consumed, and eventd's once per op status ---


class RecordedRapi(StubRapi):
    """``get_instance`` answering the lab's recorded instance."""

    async def get_instance(self, name: str) -> Any:
        self.asked.append(name)
        return copy.deepcopy(_rapi_answer(name))


async def test_the_new_recordings_through_rabbitmq_equal_eventds_messages(
    rabbitmq: str, tmp_path: Path
) -> None:
    queue = tmp_path / "queue"
    queue.mkdir()
    master = MasterCheck(_ssconf(tmp_path, NODE), node_name=NODE)
    exchange = f"test.eventd-vs-synnefo.{uuid.uuid4().hex}"
    rapi = RecordedRapi()
    folders = sorted(MULTI.glob("lifecycle-job-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    paths = [p for folder in folders for p in sorted(folder.iterdir())]
    want = [pair for kept in eventd_once([_raw(p) for p in paths]) for pair in kept]
    async with consumer(rabbitmq, exchange) as got:
        async with publishing(queue, rabbitmq, exchange, master, rapi) as (publisher, _watcher):
            await feed(queue, publisher, paths)
            await eventually(
                lambda: len(got.messages) >= len(want) and not publisher.pending,
                what=f"all published ({publisher!r})",
            )
        consumed = received(got)
    # each job's messages in order of its versions; the multiset equals eventd's kept once
    assert _bag(consumed) == _bag(want)
    for job_id in {body["jobId"] for _, body in want}:
        mine = [pair for pair in consumed if pair[1]["jobId"] == job_id]
        assert [b["status"] for _, b in mine] == [b["status"] for _, b in want if b["jobId"] == job_id]
    assert publisher.published == len(want) and publisher.dropped == 0
    assert set(rapi.asked) == {"rec32-a.ganeti.test"}
    assert not any(queue.glob("*.tmp"))
