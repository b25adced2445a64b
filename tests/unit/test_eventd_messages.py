"""Synnefo eventd's messages from real Ganeti 3.0 job files (issue 32 item 2).

Every expected message below is derived by hand from eventd.py (grnet/synnefo v0.21,
``process_IN_MOVED_TO``, ``process_instance_op``, ``process_network_op``,
``process_tag_op``, ``get_time_from_status``) and the recorded file: ``event_time`` is the
file's own ``[seconds, microseconds]`` chosen by the op's status, ``logmsg`` the text of the
op's last log entry. The last tests feed the messages to Synnefo's dispatcher parsing, ported
in :mod:`tests.unit._synnefo_callbacks`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synnefo_ganeti.jobs import JobSummary, parse_job_file
from synnefo_ganeti.rapi import Instance
from synnefo_ganeti.watch._eventd import (
    EventdMessage,
    InstanceInfo,
    eventd_messages,
    eventd_time,
    instances_needing_info,
    needs_instance_info,
)
from tests.helpers import FIXTURES, QUEUE_FIXTURES
from tests.unit import _synnefo_callbacks as synnefo

CLUSTER = "cluster.ganeti.test"
SURFACE = QUEUE_FIXTURES / "surface"


def _job(path: Path, replace: dict[str, str] | None = None) -> Any:
    data = path.read_text()
    for old, new in (replace or {}).items():
        data = data.replace(old, new)
    return parse_job_file(data.encode())


def _raw(path: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def _op(
    instance: str, operation: str, status: str, event_time: list[int], job_id: int, **extra: Any
) -> EventdMessage:
    """A ``ganeti-op-status`` message as ``process_instance_op`` + ``process_IN_MOVED_TO`` build it."""
    body: dict[str, Any] = {
        "type": "ganeti-op-status",
        "instance": instance,
        "operation": operation,
        "job_fields": {},
        "tags": [],
        "event_time": event_time,
        "status": status,
        "cluster": CLUSTER,
        "logmsg": None,
        "result": None,
        "jobId": job_id,
    }
    body.update(extra)
    return EventdMessage(f"ganeti.{instance.split('-')[0]}.event.op", body)


# instance info as GET /2/instances/NAME answers it (fixture instance_with_network.json),
# with NIC names and a firewall tag as Cyclades sets them
RAPI_INSTANCE = {
    **_raw(FIXTURES / "ganeti-3.0-rapi" / "instance_with_network.json"),
    "nic.names": ["snf-nic-3", "snf-nic-4"],
    "disk.names": ["snf-vol-9"],
    "disk.sizes": [1024],
    "disk.uuids": ["d1e2"],
    "hvparams": {"boot_order": "disk", "cdrom_image_path": "", "kernel_path": "/boot/vmlinuz"},
    "tags": ["synnefo:network:snf-nic-4:protected", "synnefo:network:bad", "owner:demo"],
}
INSTANCE_NICS = [
    {
        "name": "snf-nic-3",
        "network": None,
        "ip": None,
        "mac": "aa:00:00:0f:9a:0b",
        "mode": "bridged",
        "link": "gntbr0",
        "uuid": "b5ee78a2-ae9d-4950-971a-77ef8420be54",
    },
    {
        "name": "snf-nic-4",
        "network": "fxnet",
        "ip": "10.99.0.2",
        "mac": "aa:00:00:8b:f2:9e",
        "mode": "bridged",
        "link": "gntbr0",
        "uuid": "9863ef90-1dad-4adf-ac87-037864c7be94",
        "firewall": "protected",
    },
]
INSTANCE_DISKS = [{"name": "snf-vol-9", "size": 1024, "uuid": "d1e2"}]
INSTANCE_HVPARAMS = {"boot_order": "disk", "cdrom_image_path": ""}
ENRICHED = {
    "instance_nics": INSTANCE_NICS,
    "instance_disks": INSTANCE_DISKS,
    "instance_hvparams": INSTANCE_HVPARAMS,
}

CREATE_11_FIELDS = {"nics": [{}], "disks": [], "hvparams": {}, "beparams": {"maxmem": 128, "minmem": 128}}

SINGLE_FILES: list[tuple[str, dict[str, InstanceInfo] | None, list[EventdMessage]]] = [
    (
        "job-11.op_instance_create.success.json",
        {"inst4.ganeti.test": InstanceInfo.from_rapi(RAPI_INSTANCE)},
        [
            _op(
                "inst4.ganeti.test",
                "OP_INSTANCE_CREATE",
                "success",
                [1795327426, 716149],
                11,
                job_fields=CREATE_11_FIELDS,
                logmsg="* starting instance...",
                result=["node1.ganeti.test"],
                **ENRICHED,
            )
        ],
    ),
    (
        # the same without the RAPI's answer: no instance_* keys
        "job-11.op_instance_create.success.json",
        None,
        [
            _op(
                "inst4.ganeti.test",
                "OP_INSTANCE_CREATE",
                "success",
                [1795327426, 716149],
                11,
                job_fields=CREATE_11_FIELDS,
                logmsg="* starting instance...",
                result=["node1.ganeti.test"],
            )
        ],
    ),
    (
        "job-12.op_instance_shutdown.success.json",
        None,
        [_op("inst4.ganeti.test", "OP_INSTANCE_SHUTDOWN", "success", [1795327427, 472233], 12)],
    ),
    (
        "job-13.op_instance_startup.success.json",
        {"inst4.ganeti.test": InstanceInfo.from_rapi(RAPI_INSTANCE)},
        [_op("inst4.ganeti.test", "OP_INSTANCE_STARTUP", "success", [1795327428, 320663], 13, **ENRICHED)],
    ),
    (
        "job-17.op_instance_remove.success.json",
        None,
        [_op("inst4.ganeti.test", "OP_INSTANCE_REMOVE", "success", [1795327430, 539485], 17)],
    ),
    (
        # canceled while queued: end_timestamp of the op
        "job-22.op_instance_shutdown.canceled.json",
        None,
        [_op("inst3.ganeti.test", "OP_INSTANCE_SHUTDOWN", "canceled", [1795327459, 619565], 22)],
    ),
    (
        # OP_TEST_DELAY ops send nothing
        "job-23.multi_op.success.json",
        None,
        [_op("inst3.ganeti.test", "OP_INSTANCE_SHUTDOWN", "success", [1795327494, 747133], 23)],
    ),
    (
        "job-24.multi_op.error.json",
        None,
        [
            _op(
                "nosuch.ganeti.test",
                "OP_INSTANCE_STARTUP",
                "error",
                [1795327502, 820449],
                24,
                result=["OpPrereqError", ["Instance 'nosuch.ganeti.test' not known", "unknown_entity"]],
            )
        ],
    ),
    # two instances in one multi-alloc: "no or multiple instances", no message
    ("job-1528.op_instance_multi_alloc.success.json", None, []),
    # OP_CLUSTER_VERIFY_GROUP: process_cluster_op sends only OP_CLUSTER_SET_PARAMS
    ("job-5.op_cluster_verify_group.success_with_log.json", None, []),
    # a running OP_TEST_DELAY: no handler
    ("job-19.op_test_delay.running.json", None, []),
    (
        "job-21.op_instance_shutdown.queued.json",
        None,
        [_op("inst2.ganeti.test", "OP_INSTANCE_SHUTDOWN", "queued", [1795327456, 966003], 21)],
    ),
    (
        "job-20.op_instance_create.running_with_log.json",
        None,
        [
            _op(
                "inst5.ganeti.test",
                "OP_INSTANCE_CREATE",
                "running",
                [1795327466, 621917],
                20,
                job_fields={
                    "nics": [{}],
                    "disks": [],
                    "hvparams": {},
                    "beparams": {"maxmem": 128, "minmem": 128},
                },
                logmsg="adding disks to cluster config",
            )
        ],
    ),
    (
        "surface/job-105.op_tags_set.success_tags_add_instance.json",
        None,
        [
            EventdMessage(
                "ganeti.fx.event.op",
                {
                    "type": "ganeti-op-status",
                    "instance": "fx-a.ganeti.test",
                    "tags": ["fx:inst"],
                    "job_fields": {"dry_run": False},
                    "event_time": [1795715596, 91719],
                    "operation": "OP_TAGS_SET",
                    "status": "success",
                    "cluster": CLUSTER,
                    "logmsg": None,
                    "result": None,
                    "jobId": 105,
                },
            )
        ],
    ),
    (
        "surface/job-106.op_tags_del.success_tags_del_instance.json",
        None,
        [
            EventdMessage(
                "ganeti.fx.event.op",
                {
                    "type": "ganeti-op-status",
                    "instance": "fx-a.ganeti.test",
                    "tags": ["fx:inst"],
                    "job_fields": {"dry_run": False},
                    "event_time": [1795715596, 455413],
                    "operation": "OP_TAGS_DEL",
                    "status": "success",
                    "cluster": CLUSTER,
                    "logmsg": None,
                    "result": None,
                    "jobId": 106,
                },
            )
        ],
    ),
    (
        "surface/job-108.op_instance_grow_disk.success_instance_grow_disk.json",
        {"fx-b.ganeti.test": InstanceInfo.from_rapi(RAPI_INSTANCE)},
        [
            _op(
                "fx-b.ganeti.test",
                "OP_INSTANCE_GROW_DISK",
                "success",
                [1795715598, 527735],
                108,
                logmsg=" - INFO: Instance fx-b.ganeti.test's disks are in sync",
                **ENRICHED,
            )
        ],
    ),
    (
        "surface/job-120.op_instance_set_params.success_instance_modify_nic_remove.json",
        {"fx-a.ganeti.test": InstanceInfo.from_rapi(RAPI_INSTANCE)},
        [
            _op(
                "fx-a.ganeti.test",
                "OP_INSTANCE_SET_PARAMS",
                "success",
                [1795715623, 945913],
                120,
                job_fields={"nics": [["remove", -1, {}]], "disks": [], "hvparams": {}, "beparams": {}},
                result=[["NIC/1", "remove"]],
                **ENRICHED,
            )
        ],
    ),
    (
        "surface/job-121.op_network_disconnect.success_network_disconnect.json",
        None,
        [
            EventdMessage(
                "ganeti.fxnet.event.network",
                {
                    "operation": "OP_NETWORK_DISCONNECT",
                    "type": "ganeti-network-status",
                    "network": "fxnet",
                    "job_fields": {
                        "subnet": None,
                        "gateway": None,
                        "add_reserved_ips": None,
                        "remove_reserved_ips": None,
                        "group_name": "default",
                    },
                    "event_time": [1795715624, 459044],
                    "status": "success",
                    "cluster": CLUSTER,
                    "logmsg": None,
                    "result": None,
                    "jobId": 121,
                },
            )
        ],
    ),
    (
        "surface/job-119.op_network_disconnect.error_network_disconnect_error_in_use.json",
        None,
        [
            EventdMessage(
                "ganeti.fxnet.event.network",
                {
                    "operation": "OP_NETWORK_DISCONNECT",
                    "type": "ganeti-network-status",
                    "network": "fxnet",
                    "job_fields": {
                        "subnet": None,
                        "gateway": None,
                        "add_reserved_ips": None,
                        "remove_reserved_ips": None,
                        "group_name": "default",
                    },
                    "event_time": [1795715623, 199225],
                    "status": "error",
                    "cluster": CLUSTER,
                    "logmsg": " - WARNING: IP addresses from network 'fxnet', which is about to disconnect from"
                    " node group 'default', are in use: fx-a.ganeti.test: nic1/10.99.0.2",
                    "result": [
                        "OpPrereqError",
                        [
                            "Conflicting IP addresses found;  remove/modify the corresponding network interfaces",
                            "wrong_state",
                        ],
                    ],
                    "jobId": 119,
                },
            )
        ],
    ),
]


@pytest.mark.parametrize(
    ("name", "info", "expected"), SINGLE_FILES, ids=[f"{n}-{i is not None}" for n, i, _ in SINGLE_FILES]
)
def test_messages_of_one_recorded_file(
    name: str, info: dict[str, InstanceInfo] | None, expected: list[EventdMessage]
) -> None:
    messages = eventd_messages(None, _job(QUEUE_FIXTURES / name), cluster=CLUSTER, instance_info=info)
    assert messages == expected
    # what is published is JSON: the body goes through json.dumps unchanged
    assert [json.loads(json.dumps(m.body)) for m in messages] == [m.body for m in expected]


@pytest.mark.parametrize(
    "name",
    [
        "job-14.op_instance_create.error_already_exists.json",
        "job-15.op_instance_create.error_type_enforcement.json",
        "job-16.op_instance_create.error_bad_os.json",
        "job-306.op_instance_create_file.error_ipolicy.json",
    ],
)
def test_a_failed_create_carries_its_whole_input(name: str) -> None:
    """``op.Serialize()["input"]``: the opcode as the file holds it, ``OP_ID`` included."""
    raw = _raw(QUEUE_FIXTURES / name)
    (raw_op,) = raw["ops"]
    name_ = raw_op["input"]["instance_name"]
    expected = _op(
        name_,
        "OP_INSTANCE_CREATE",
        "error",
        raw_op["end_timestamp"],
        raw["id"],
        job_fields=raw_op["input"],
        tags=raw_op["input"]["tags"],
        logmsg=raw_op["log"][-1][-1] if raw_op["log"] else None,
        result=raw_op["result"],
    )
    assert eventd_messages(None, _job(QUEUE_FIXTURES / name), cluster=CLUSTER) == [expected]


def test_job_14_by_hand() -> None:
    (message,) = eventd_messages(
        None, _job(QUEUE_FIXTURES / "job-14.op_instance_create.error_already_exists.json"), cluster=CLUSTER
    )
    assert message.routing_key == "ganeti.inst1.ganeti.test.event.op"
    assert message.body["event_time"] == [1795327428, 827025]
    assert message.body["result"] == [
        "OpPrereqError",
        ["Instance 'inst1.ganeti.test' is already in the cluster", "already_exists"],
    ]
    assert message.body["job_fields"]["OP_ID"] == "OP_INSTANCE_CREATE"
    assert message.body["job_fields"]["opportunistic_locking"] is False
    assert message.body["jobId"] == 14


LIFECYCLES = {
    "lifecycle-job-12": [
        ("01-queued.json", "OP_INSTANCE_SHUTDOWN", "queued", [1795327426, 976266], None),
        ("04-waiting.json", "OP_INSTANCE_SHUTDOWN", "waiting", [1795327427, 275879], None),
        ("05-running.json", "OP_INSTANCE_SHUTDOWN", "running", [1795327427, 294326], None),
        ("06-success.json", "OP_INSTANCE_SHUTDOWN", "success", [1795327427, 472233], None),
    ],
    # five running versions (the log grows 0..4): one running message, with no log yet
    "lifecycle-job-20": [
        ("01-queued.json", "OP_INSTANCE_CREATE", "queued", [1795327455, 924848], None),
        ("04-waiting.json", "OP_INSTANCE_CREATE", "waiting", [1795327456, 148103], None),
        ("05-running.json", "OP_INSTANCE_CREATE", "running", [1795327466, 621917], None),
        ("10-success.json", "OP_INSTANCE_CREATE", "success", [1795327467, 416143], "* starting instance..."),
    ],
    # ops 0 and 2 are OP_TEST_DELAY: only op 1's changes
    "lifecycle-job-23": [
        ("01-queued_queued_queued.json", "OP_INSTANCE_SHUTDOWN", "queued", [1795327493, 299865], None),
        ("07-success_waiting_queued.json", "OP_INSTANCE_SHUTDOWN", "waiting", [1795327494, 615944], None),
        ("08-success_running_queued.json", "OP_INSTANCE_SHUTDOWN", "running", [1795327494, 622406], None),
        ("09-success_success_queued.json", "OP_INSTANCE_SHUTDOWN", "success", [1795327494, 747133], None),
    ],
}


@pytest.mark.parametrize("folder", sorted(LIFECYCLES))
@pytest.mark.parametrize("summary", [False, True], ids=["previous-file", "previous-summary"])
def test_each_op_status_change_once_over_every_version(folder: str, summary: bool) -> None:
    seen: list[tuple[str, str, str, list[int], str | None]] = []
    previous: Any = None
    for path in sorted((QUEUE_FIXTURES / folder).iterdir()):
        job = parse_job_file(path.read_bytes())
        for message in eventd_messages(previous, job, cluster=CLUSTER):
            body = message.body
            seen.append((path.name, body["operation"], body["status"], body["event_time"], body["logmsg"]))
        # the same version read again (an inotify event twice) publishes nothing
        assert eventd_messages(job, job, cluster=CLUSTER) == []
        previous = JobSummary.of(job) if summary else job
    assert seen == LIFECYCLES[folder]


def test_versions_skipped_give_the_latest_status_only() -> None:
    versions = sorted((QUEUE_FIXTURES / "lifecycle-job-12").iterdir())
    first, last = (parse_job_file(p.read_bytes()) for p in (versions[0], versions[-1]))
    assert [
        (m.body["status"], m.body["event_time"]) for m in eventd_messages(first, last, cluster=CLUSTER)
    ] == [("success", [1795327427, 472233])]


def _variant(path: Path, **changes: Any) -> Any:
    """A real file with its only op's input changed (opcodes Ganeti 3.0 was not recorded running)."""
    raw = _raw(path)
    raw["ops"][0]["input"] = {
        k: v for k, v in {**raw["ops"][0]["input"], **changes}.items() if v is not _DROP
    }
    return parse_job_file(json.dumps(raw).encode())


_DROP = object()
TAGS_SET = SURFACE / "job-105.op_tags_set.success_tags_add_instance.json"


def test_cluster_set_params_and_the_heartbeat() -> None:
    job = _variant(QUEUE_FIXTURES / "job-12.op_instance_shutdown.success.json", OP_ID="OP_CLUSTER_SET_PARAMS")
    assert eventd_messages(None, job, cluster=CLUSTER) == [
        EventdMessage(
            "ganeti.event.cluster",
            {
                "operation": "OP_CLUSTER_SET_PARAMS",
                "type": "ganeti-cluster-status",
                "event_time": [1795327427, 472233],
                "status": "success",
                "cluster": CLUSTER,
                "logmsg": None,
                "result": None,
                "jobId": 12,
            },
        )
    ]
    # dispatcher.py handle_request adds "snf:eventd:heartbeat:<host>:<pid>" with dry_run
    beat = "snf:eventd:heartbeat:disp1:42"
    versions = sorted((QUEUE_FIXTURES / "lifecycle-job-12").iterdir())
    seen = []
    previous = None
    for path in versions:
        raw = _raw(path)
        raw["ops"][0]["input"] = {"OP_ID": "OP_TAGS_SET", "kind": "cluster", "tags": [beat], "dry_run": True}
        job = parse_job_file(json.dumps(raw).encode())
        seen += eventd_messages(previous, job, cluster=CLUSTER)
        previous = job
    assert seen == [
        EventdMessage(
            "eventd.heartbeat",
            {
                "type": "eventd-heartbeat",
                "cluster": CLUSTER,
                "event_time": [1795327427, 275879],
                "operation": "OP_TAGS_SET",
                "status": "waiting",
                "logmsg": None,
                "result": None,
                "jobId": 12,
            },
        )
    ]


def test_where_eventd_crashed_or_skipped_nothing_is_sent() -> None:
    one = QUEUE_FIXTURES / "job-12.op_instance_shutdown.success.json"
    # OP_TAGS_SEARCH has no kind, OP_TAGS_GET no tags: eventd's AttributeError
    assert (
        eventd_messages(None, _variant(TAGS_SET, OP_ID="OP_TAGS_SEARCH", kind=_DROP), cluster=CLUSTER) == []
    )
    assert eventd_messages(None, _variant(TAGS_SET, OP_ID="OP_TAGS_GET", tags=_DROP), cluster=CLUSTER) == []
    # an instance op without an instance, a network op without a network
    assert eventd_messages(None, _variant(one, instance_name=_DROP), cluster=CLUSTER) == []
    assert (
        eventd_messages(None, _variant(one, OP_ID="OP_NETWORK_ADD", instance_name=_DROP), cluster=CLUSTER)
        == []
    )
    # a one-instance multi-alloc holds an opcode, not a name (eventd: AttributeError)
    multi = QUEUE_FIXTURES / "job-1528.op_instance_multi_alloc.success.json"
    raw = _raw(multi)
    raw["ops"][0]["input"]["instances"] = raw["ops"][0]["input"]["instances"][:1]
    assert eventd_messages(None, parse_job_file(json.dumps(raw).encode()), cluster=CLUSTER) == []
    # an opcode whose OP_ID has no second word
    assert eventd_messages(None, _variant(one, OP_ID="OPX"), cluster=CLUSTER) == []


def test_query_data_of_one_named_instance_and_a_snapshot() -> None:
    one = QUEUE_FIXTURES / "job-12.op_instance_shutdown.success.json"
    job = _variant(one, OP_ID="OP_INSTANCE_QUERY_DATA", instance_name=_DROP, instances=["snf-7"])
    (message,) = eventd_messages(None, job, cluster=CLUSTER)
    assert message == _op("snf-7", "OP_INSTANCE_QUERY_DATA", "success", [1795327427, 472233], 12)
    info = json.dumps({"snapshot_id": 5})
    snap = _variant(
        one,
        OP_ID="OP_INSTANCE_SNAPSHOT",
        disks=[["d-uuid", {"snapshot_name": "s"}]],
        reason=[["gnt:user", info, 1]],
    )
    (message,) = eventd_messages(None, snap, cluster=CLUSTER)
    assert message.body["job_fields"] == {
        "disks": [["d-uuid", {"snapshot_name": "s", "snapshot_info": info}]]
    }
    assert snap.ops[0].input["disks"] == [
        ["d-uuid", {"snapshot_name": "s"}]
    ]  # the parsed file is not touched
    # a reason not from gnt:user: a warning, the disks as they are
    bad = _variant(one, OP_ID="OP_INSTANCE_SNAPSHOT", disks=[["d-uuid", {}]], reason=None)
    assert eventd_messages(None, bad, cluster=CLUSTER)[0].body["job_fields"] == {"disks": [["d-uuid", {}]]}


def test_which_messages_need_the_rapi() -> None:
    versions = sorted((QUEUE_FIXTURES / "lifecycle-job-20").iterdir())
    jobs = [parse_job_file(p.read_bytes()) for p in versions]
    assert [instances_needing_info(a, b) for a, b in zip([None, *jobs], jobs, strict=False)] == [[]] * 9 + [
        ["inst5.ganeti.test"]
    ]
    assert instances_needing_info(jobs[-1], jobs[-1]) == []
    canceled = _job(QUEUE_FIXTURES / "job-22.op_instance_shutdown.canceled.json")
    assert not needs_instance_info(canceled.ops[0])
    # set-params: success and error; canceled is eventd's "cancelled", never true
    set_params = _job(SURFACE / "job-120.op_instance_set_params.success_instance_modify_nic_remove.json")
    assert needs_instance_info(set_params.ops[0])
    failed = _job(
        QUEUE_FIXTURES / "job-24.multi_op.error.json",
        {'"OP_ID": "OP_INSTANCE_STARTUP"': '"OP_ID": "OP_INSTANCE_SET_PARAMS"'},
    )
    assert needs_instance_info(failed.ops[1])
    startup_error = _job(QUEUE_FIXTURES / "job-24.multi_op.error.json")
    assert not needs_instance_info(startup_error.ops[1])


def test_instance_info_from_the_rapi_client_model() -> None:
    model = Instance.model_validate(RAPI_INSTANCE)
    assert InstanceInfo.from_rapi(model) == InstanceInfo.from_rapi(RAPI_INSTANCE)
    info = InstanceInfo.from_rapi(RAPI_INSTANCE)
    assert list(info.nics) == INSTANCE_NICS
    assert list(info.disks) == INSTANCE_DISKS
    assert info.hvparams == INSTANCE_HVPARAMS
    # fake hypervisor: no boot_order nor cdrom_image_path (luxid answers None)
    assert InstanceInfo.from_rapi({"hvparams": {}}).hvparams == {"boot_order": None, "cdrom_image_path": None}


def _timestamps(value: Any) -> list[list[int]]:
    if isinstance(value, dict):
        found = [
            ts for key, v in value.items() if key.endswith("timestamp") for ts in [v] if isinstance(ts, list)
        ]
        return found + [t for v in value.values() for t in _timestamps(v)]
    if isinstance(value, list):
        return [t for v in value for t in _timestamps(v)]
    return []


def test_event_time_gives_back_every_recorded_timestamp() -> None:
    for path in QUEUE_FIXTURES.rglob("*.json"):
        raw = _raw(path)
        job = parse_job_file(path.read_bytes())
        recorded = _timestamps(raw)
        parsed = [job.received_time, job.start_time, job.end_time] + [
            t for op in job.ops for t in (op.start_time, op.exec_time, op.end_time)
        ]
        assert sorted(recorded) == sorted(eventd_time(t) or [] for t in parsed if t is not None), path


@given(st.integers(0, 2**32 - 1), st.integers(0, 999_999))
def test_event_time_is_exact(seconds: int, micro: int) -> None:
    assert eventd_time(float(seconds + micro / 1_000_000)) == [seconds, micro]


# --- Synnefo's own parsing (tests/unit/_synnefo_callbacks.py) ---

CYCLADES_NAMES = {
    "inst4.ganeti.test": "snf-42",
    "inst3.ganeti.test": "snf-43",
    "inst5.ganeti.test": "snf-44",
    "fx-a.ganeti.test": "snf-45",
    "fx-b.ganeti.test": "snf-46",
    "nosuch.ganeti.test": "snf-47",
    "inst2.ganeti.test": "snf-48",
    "inst1.ganeti.test": "snf-49",
    '"fxnet"': '"snf-net-7"',
}
GOLDEN = [
    *(QUEUE_FIXTURES / name for name, _, _ in SINGLE_FILES),
    QUEUE_FIXTURES / "job-14.op_instance_create.error_already_exists.json",
    *sorted((QUEUE_FIXTURES / "lifecycle-job-20").iterdir()),
    *sorted((QUEUE_FIXTURES / "lifecycle-job-23").iterdir()),
]
CYCLADES_INSTANCE = {**RAPI_INSTANCE, "nic.networks.names": ["snf-net-1", "snf-net-7"]}


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.relative_to(QUEUE_FIXTURES).as_posix())
def test_synnefo_dispatcher_parses_our_messages(path: Path) -> None:
    job = _job(path, CYCLADES_NAMES)
    info = {name: InstanceInfo.from_rapi(CYCLADES_INSTANCE) for name in instances_needing_info(None, job)}
    messages = eventd_messages(None, job, cluster=CLUSTER, instance_info=info)
    for message in messages:
        delivery = synnefo.deliver(message.routing_key, json.dumps(message.body).encode())
        assert delivery.outcome == "ack", message
        assert delivery.ignored is None, (delivery, message)
        fields = delivery.fields
        op = next(op for op in job.ops if op.op_id == message.body["operation"])
        assert fields["operation"] == op.op_id
        assert fields["status"] == op.status.value
        assert fields["jobId"] == job.job_id
        assert fields["event_time"].timestamp() == pytest.approx(
            {"queued": job.received_time, "waiting": op.start_time, "running": op.exec_time}.get(
                op.status.value, op.end_time
            ),
            abs=1e-6,
        )
        if needs_instance_info(op):
            assert fields["parsed_nics"] == {
                3: {
                    "index": 0,
                    "network": 1,
                    "mac": "aa:00:00:0f:9a:0b",
                    "ipv4_address": None,
                    "firewall": None,
                },
                4: {
                    "index": 1,
                    "network": 7,
                    "mac": "aa:00:00:8b:f2:9e",
                    "ipv4_address": "10.99.0.2",
                    "firewall": "protected",
                },
            }
            assert fields["parsed_disks"] == {9: {"index": 0, "size": 1, "uuid": "d1e2"}}
            assert fields["parsed_hvparams"] == ("disk", "")


def test_synnefo_dispatcher_on_the_heartbeat_the_cluster_and_foreign_names() -> None:
    beat = EventdMessage("eventd.heartbeat", {"type": "eventd-heartbeat", "cluster": CLUSTER})
    assert synnefo.deliver(beat.routing_key, json.dumps(beat.body).encode()).fields == {"cluster": CLUSTER}
    job = _variant(QUEUE_FIXTURES / "job-12.op_instance_shutdown.success.json", OP_ID="OP_CLUSTER_SET_PARAMS")
    (message,) = eventd_messages(None, job, cluster=CLUSTER)
    delivery = synnefo.deliver(message.routing_key, json.dumps(message.body).encode())
    assert (delivery.outcome, delivery.ignored, delivery.fields["cluster"]) == ("ack", None, CLUSTER)
    # names Cyclades did not make: a routing key no queue binds, as with eventd
    (message,) = eventd_messages(
        None, _job(QUEUE_FIXTURES / "job-12.op_instance_shutdown.success.json"), cluster=CLUSTER
    )
    assert synnefo.deliver(message.routing_key, json.dumps(message.body).encode()).ignored == "no binding"
    # the checks the port makes do fail on a broken message
    broken = {**message.body, "instance": "snf-42", "event_time": None}
    assert synnefo.deliver("ganeti.snf.event.op", json.dumps(broken).encode()).outcome == "nack"
    assert (
        synnefo.deliver(
            "ganeti.snf.event.op", json.dumps({**broken, "event_time": [1, 2], "status": "x"}).encode()
        ).outcome
        == "reject"
    )
