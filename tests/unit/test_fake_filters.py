"""The fake Ganeti applies job filter rules as Ganeti 3.0's luxid does (``Ganeti.JQScheduler.Filtering``
and ``Ganeti.JQScheduler``; tests/integration/test_filters_real.py runs the same steps on real Ganeti).

A job that must stay queued is shown to by a job submitted after it, which its rule does not
stop, ending first: no test waits a fixed time."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from synnefo_ganeti import JobStatus, RapiClient
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.testing._filtering import applying_filter
from synnefo_ganeti.testing._jobs import FakeJob
from synnefo_ganeti.testing._model import FakeFilter
from tests.helpers import eventually, fake_client


@asynccontextmanager
async def ganeti(**options: Any) -> AsyncIterator[tuple[FakeGaneti, RapiClient]]:
    async with FakeGaneti(tls=False, **options) as fake, fake_client(fake) as client:
        yield fake, client


async def status(client: RapiClient, job_id: int) -> JobStatus:
    return (await client.get_job(job_id)).status


async def test_pause_keeps_a_job_queued_until_the_rule_goes(tmp_path: Any) -> None:
    """``jobFiltering``: PAUSE leaves the job queued (a later job runs past it); deleting the rule
    reschedules (``configChangeNeedsRescheduling``) and the job runs."""
    async with ganeti() as (_fake, client):
        rule = await client.add_filter(
            priority=1, predicates=[["opcode", ["=", "OP_ID", "OP_TAGS_SET"]]], action="PAUSE"
        )
        paused = await client.add_cluster_tags(["paused"])
        later = await client.redistribute_config()
        assert (await client.wait_for_job(later, timeout=20)).status is JobStatus.SUCCESS
        assert await status(client, paused) is JobStatus.QUEUED
        await client.delete_filter(rule)
        assert (await client.wait_for_job(paused, timeout=20)).status is JobStatus.SUCCESS
        assert "paused" in await client.get_cluster_tags()


async def test_reject_cancels_the_jobs_it_applies_to(tmp_path: Any) -> None:
    """``cancelRejectedJobs``: a queued job a REJECT rule applies to is canceled, as Ganeti
    shows it (no start, no result, an end); a job of another reason runs."""
    async with ganeti() as (fake, client):
        await client.add_filter(priority=1, predicates=[["reason", ["=", "reason", "no"]]], action="REJECT")
        rejected = await client.add_cluster_tags(["rejected"], reason="no")
        job = await client.wait_for_job(rejected, timeout=20)
        assert job.status is JobStatus.CANCELED and job.start_ts is None and job.end_ts is not None
        assert [op.status for op in fake.cluster.jobs[rejected].ops] == [JobStatus.CANCELED]
        fine = await client.add_cluster_tags(["fine"], reason="yes")
        assert (await client.wait_for_job(fine, timeout=20)).status is JobStatus.SUCCESS
        assert await client.get_cluster_tags() == ["fine"]


async def test_a_reject_rule_added_later_cancels_jobs_already_queued(tmp_path: Any) -> None:
    """Rules that change make the queue be looked at again: jobs a PAUSE held, then a REJECT rule
    of higher priority (a smaller number) applying to them: canceled at once."""
    async with ganeti() as (_fake, client):
        tags = ["opcode", ["=", "OP_ID", "OP_TAGS_SET"]]
        await client.add_filter(priority=5, predicates=[tags], action="PAUSE")
        held = [await client.add_cluster_tags([f"held{i}"]) for i in range(3)]
        await client.add_filter(priority=1, predicates=[tags], action="REJECT")
        for job_id in held:
            assert (await client.wait_for_job(job_id, timeout=20)).status is JobStatus.CANCELED
        assert await client.get_cluster_tags() == []


async def test_the_watermark_continue_and_the_order_of_rules(tmp_path: Any) -> None:
    """``matchPredicate``'s ``"watermark"``: the highest job id when the rule was added; jobs
    above it are paused, those at or below not. ``applyingFilter``: rules by priority, the first
    that matches and does not CONTINUE applies: an ACCEPT of priority 1 lets one opcode through."""
    async with ganeti() as (_fake, client):
        before = await client.add_cluster_tags(["before"])
        await client.wait_for_job(before, timeout=20)
        await client.add_filter(priority=5, predicates=[["jobid", [">", "id", "watermark"]]], action="PAUSE")
        await client.add_filter(priority=0, predicates=[["jobid", [">", "id", 0]]], action="CONTINUE")
        await client.add_filter(
            priority=1, predicates=[["opcode", ["=", "OP_ID", "OP_TAGS_DEL"]]], action="ACCEPT"
        )
        paused = await client.add_cluster_tags(["after"])
        accepted = await client.delete_cluster_tags(["before"])
        assert (await client.wait_for_job(accepted, timeout=20)).status is JobStatus.SUCCESS
        assert await status(client, paused) is JobStatus.QUEUED
        assert await client.get_cluster_tags() == []


async def test_rate_limit_runs_at_most_n_of_its_jobs_at_once(tmp_path: Any) -> None:
    """``queueRateLimitSlotMap``/``jobFiltering``: RATE_LIMIT 1 runs one of its jobs at a time; a
    rate-limited job does not hold back a later job the rule does not apply to."""
    async with ganeti(op_times={"OP_TAGS_SET": 0.3}) as (fake, client):
        await client.add_filter(
            priority=1, predicates=[["opcode", ["=", "OP_ID", "OP_TAGS_SET"]]], action=["RATE_LIMIT", 1]
        )
        limited = [await client.add_cluster_tags([f"t{i}"]) for i in range(3)]
        other = await client.redistribute_config()
        assert (await client.wait_for_job(other, timeout=20)).status is JobStatus.SUCCESS
        ended = [await client.wait_for_job(job_id, timeout=20) for job_id in limited]
        assert all(job.status is JobStatus.SUCCESS for job in ended)
        spans = sorted(
            (
                _ts(fake.cluster.jobs[job_id].ops[0].exec_timestamp),
                _ts(fake.cluster.jobs[job_id].end_timestamp),
            )
            for job_id in limited
        )
        assert all(first[1] <= second[0] for first, second in itertools.pairwise(spans)), spans
        # the other job ran while the limited ones waited
        assert _ts(fake.cluster.jobs[other].end_timestamp) < spans[-1][0]


def _ts(stamp: list[int] | None) -> float:
    assert stamp is not None
    return stamp[0] + stamp[1] / 1e6


def test_which_rule_applies() -> None:
    """``applyingFilter`` and ``matchPredicate`` on their own: all predicates of a rule must match;
    opcode fields are read dotted and a missing field does not match; ``jobid`` and ``reason``
    count only comparisons."""
    from synnefo_ganeti.testing._jobs import FakeOp

    job = FakeJob(
        id=7,
        ops=[
            FakeOp(
                luxid={
                    "OP_ID": "OP_INSTANCE_CREATE",
                    "beparams": {"maxmem": 512},
                    "reason": [["gnt:client:x", "why", 5]],
                }
            )
        ],
        received_timestamp=[0, 0],
    )

    def rule(priority: int, predicates: list[Any], action: Any = "PAUSE", uuid: str = "u") -> FakeFilter:
        return FakeFilter(uuid, priority, predicates, action, [], watermark=5)

    big = ["opcode", [">", "beparams.maxmem", 256]]
    assert applying_filter([rule(1, [big])], job) is not None
    assert applying_filter([rule(1, [["opcode", [">", "beparams.nosuch", 256]]])], job) is None
    assert applying_filter([rule(1, [big, ["jobid", ["<", "id", "watermark"]]])], job) is None
    assert applying_filter([rule(1, [["jobid", [">", "id", "watermark"]]])], job) is not None
    assert applying_filter([rule(1, [["jobid", ["=~", "id", "7"]]])], job) is None  # not a comparison
    assert applying_filter([rule(1, [["reason", ["=", "source", "gnt:client:x"]]])], job) is not None
    assert applying_filter([rule(1, [["reason", ["<", "timestamp", 5]]])], job) is None
    first = rule(2, [big], "ACCEPT", "b")
    assert (
        applying_filter([rule(3, [big], "REJECT", "a"), first, rule(1, [big], "CONTINUE", "c")], job) is first
    )
    assert (
        applying_filter([rule(1, [big], "REJECT", "b"), rule(1, [big], "ACCEPT", "a")], job).action
        == "ACCEPT"
    )  # type: ignore[union-attr]


async def test_no_rule_no_change(tmp_path: Any) -> None:
    """Without rules the queue runs as before: max_running_jobs at a time, in id order."""
    async with ganeti(max_running_jobs=1, op_times={"OP_TAGS_SET": 0.05}) as (fake, client):
        jobs = [await client.add_cluster_tags([f"n{i}"]) for i in range(3)]
        for job_id in jobs:
            await client.wait_for_job(job_id, timeout=20)
        starts = [_ts(fake.cluster.jobs[job_id].ops[0].exec_timestamp) for job_id in jobs]
        assert starts == sorted(starts)

        async def tagged() -> bool:
            return sorted(await client.get_cluster_tags()) == ["n0", "n1", "n2"]

        await eventually(tagged, what="every tag set")
