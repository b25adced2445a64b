"""The fake Ganeti never hands out a job id twice on one queue directory: a restart goes on from
the last id, as luxid does with the queue's ``serial`` file (issue 28, item 6)."""

from __future__ import annotations

from pathlib import Path

from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import eventually, fake_client, spec

FAST = {"OP_INSTANCE_CREATE": 0.01, "OP_INSTANCE_REMOVE": 0.01, "OP_TEST_DELAY": 0.01}


def create(name: str) -> dict[str, object]:
    return {
        "instance_name": name, "mode": "create", "disk_template": "diskless", "disks": [],
        "nics": [{}], "os_type": "noop", "pnode": "node1.fake.test",
    }  # fmt: skip


async def run_jobs(fake: FakeGaneti, names: list[str]) -> list[int]:
    ids = [
        fake.cluster.submit([("OP_INSTANCE_CREATE", create(name))], resource="instances") for name in names
    ]

    def all_ended() -> bool:
        return all(fake.cluster.job(job_id).status.is_final for job_id in ids)  # type: ignore[union-attr]

    await eventually(all_ended, what="the jobs' ends")
    return ids


async def test_a_restart_on_the_same_queue_dir_goes_on_from_the_last_id(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    async with FakeGaneti(tls=False, queue_dir=queue, op_times=FAST) as fake:
        first = await run_jobs(fake, ["vm1", "vm2", "vm3"])
    assert first == [1, 2, 3]
    assert (queue / "serial").read_text() == "3\n"
    async with FakeGaneti(tls=False, queue_dir=queue, op_times=FAST) as fake:
        # through RAPI, as a client sees it
        async with fake_client(fake) as client:
            job_id = await client.create_instance(spec("vm4", pnode="node1.fake.test"))
        assert job_id == 4
        await eventually(lambda: fake.cluster.job(4).status.is_final, what="job 4's end")  # type: ignore[union-attr]
        assert await run_jobs(fake, ["vm5"]) == [5]
    assert (queue / "serial").read_text() == "5\n"
    # the earlier run's job files are still there, none written over
    assert sorted(p.name for p in queue.glob("job-*")) == [f"job-{n}" for n in range(1, 6)]


async def test_the_serial_file_is_where_the_ids_go_on(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    queue.mkdir()
    (queue / "serial").write_text("41\n")  # a queue dir that held jobs 1..41, all archived and gone
    async with FakeGaneti(tls=False, queue_dir=queue, op_times=FAST) as fake:
        assert await run_jobs(fake, ["vm1"]) == [42]
    assert (queue / "serial").read_text() == "42\n"


async def test_archived_jobs_count_when_the_serial_file_is_gone(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    async with FakeGaneti(tls=False, queue_dir=queue, op_times=FAST) as fake:
        await run_jobs(fake, ["vm1", "vm2"])
        assert fake.archive_jobs() == 2
    assert (queue / "archive" / "0" / "job-2").exists()
    (queue / "serial").unlink()
    async with FakeGaneti(tls=False, queue_dir=queue, op_times=FAST) as fake:
        assert (queue / "serial").read_text() == "2\n"  # written at start, as Ganeti's queue init does
        assert await run_jobs(fake, ["vm3"]) == [3]


async def test_a_serial_behind_the_job_files_never_reuses_an_id(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    async with FakeGaneti(tls=False, queue_dir=queue, op_times=FAST) as fake:
        await run_jobs(fake, ["vm1", "vm2", "vm3"])
    (queue / "serial").write_text("1\n")
    async with FakeGaneti(tls=False, queue_dir=queue, op_times=FAST) as fake:
        assert await run_jobs(fake, ["vm4"]) == [4]


async def test_a_new_queue_dir_starts_at_one_with_serial_zero(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    async with FakeGaneti(tls=False, queue_dir=queue, op_times=FAST) as fake:
        assert (queue / "serial").read_text() == "0\n"  # jstore.InitAndVerifyQueue writes 0
        assert await run_jobs(fake, ["vm1"]) == [1]
    # without a queue dir of its own, each fake starts at 1
    async with FakeGaneti(tls=False, op_times=FAST) as fake:
        assert await run_jobs(fake, ["vm1"]) == [1]
