"""Job filter rules applied, on real Ganeti and on the fake: the same steps, the same outcomes.

PAUSE keeps a job queued until its rule is deleted; REJECT cancels a queued job (shown as Ganeti
shows it: no start, no result, an end); the ``"watermark"`` of a ``jobid`` predicate; an ACCEPT
rule of a smaller priority number letting one opcode through a PAUSE. Every rule also names this
run's own reason, so no other job on the testbed is touched. A job that must stay queued is shown
to by a later job its rules let through ending first (tests/unit/test_fake_filters.py has the
rest: RATE_LIMIT, CONTINUE, a REJECT added while jobs wait).
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest

from synnefo_ganeti import JobStatus, RapiClient
from synnefo_ganeti.testing import FakeGaneti

pytestmark = [pytest.mark.ganeti, pytest.mark.timeout(300)]

DEADLINE = 120.0


async def steps(rapi: RapiClient, run: str) -> dict[str, Any]:
    """The steps, on one cluster; what each job ended as, and the rejected job's answer."""
    seen: dict[str, Any] = {}
    paused_reason, rejected_reason = f"{run}-pause", f"{run}-reject"
    mine = ["reason", ["=", "reason", paused_reason]]
    rules: list[str] = []

    async def status(job_id: int) -> str:
        return (await rapi.get_job(job_id)).status.value

    async def ended(job_id: int) -> str:
        return (await rapi.wait_for_job(job_id, timeout=DEADLINE)).status.value

    try:
        rule = await rapi.add_filter(priority=1, predicates=[mine], action="PAUSE")
        rules.append(rule)
        paused = await rapi.add_cluster_tags([f"{run}-a"], reason=paused_reason)
        seen["later, not paused"] = await ended(await rapi.add_cluster_tags([f"{run}-b"], reason=run))
        seen["paused"] = await status(paused)
        await rapi.delete_filter(rule)
        rules.remove(rule)
        seen["paused, rule deleted"] = await ended(paused)

        rules.append(
            await rapi.add_filter(
                priority=1, predicates=[["reason", ["=", "reason", rejected_reason]]], action="REJECT"
            )
        )
        rejected = await rapi.add_cluster_tags([f"{run}-c"], reason=rejected_reason)
        seen["rejected"] = await ended(rejected)
        answer = await rapi._get(f"/2/jobs/{rejected}")
        seen["rejected job"] = {key: answer[key] for key in ("status", "opstatus", "opresult", "oplog")} | {
            "start_ts": answer["start_ts"],
            "has end_ts": answer["end_ts"] is not None,
        }

        rules.append(
            await rapi.add_filter(
                priority=5, predicates=[["jobid", [">", "id", "watermark"]], mine], action="PAUSE"
            )
        )
        rules.append(
            await rapi.add_filter(
                priority=1, predicates=[["opcode", ["=", "OP_ID", "OP_TAGS_DEL"]], mine], action="ACCEPT"
            )
        )
        above = await rapi.add_cluster_tags([f"{run}-d"], reason=paused_reason)
        seen["accepted first"] = await ended(
            await rapi.delete_cluster_tags([f"{run}-a", f"{run}-b"], reason=paused_reason)
        )
        seen["above the watermark"] = await status(above)
        for rule in list(rules):
            await rapi.delete_filter(rule)
            rules.remove(rule)
        seen["above the watermark, rules deleted"] = await ended(above)
        seen["tags left"] = sorted(tag for tag in await rapi.get_cluster_tags() if tag.startswith(run))
    finally:
        for rule in rules:
            with contextlib.suppress(Exception):
                await rapi.delete_filter(rule)
        leftover = [tag for tag in await rapi.get_cluster_tags() if tag.startswith(run)]
        if leftover:
            await rapi.wait_for_job(await rapi.delete_cluster_tags(leftover), timeout=DEADLINE)
    return seen


async def test_filter_rules_applied_on_real_ganeti_and_on_the_fake(testbed) -> None:
    run = f"sg-filter-{uuid.uuid4().hex[:6]}"
    async with RapiClient(
        testbed.url, username=testbed.username, password=testbed.password, ca_file=testbed.ca_file
    ) as real:
        on_real = await steps(real, run)
    async with (
        FakeGaneti(tls=False, version=testbed.series) as fake,
        RapiClient(fake.url, username=fake.username, password=fake.password) as client,
    ):
        on_fake = await steps(client, run)
    assert on_real == on_fake
    assert on_real["paused"] == JobStatus.QUEUED.value and on_real["rejected"] == JobStatus.CANCELED.value
    assert on_real["above the watermark"] == JobStatus.QUEUED.value and on_real["tags left"] == [f"{run}-d"]
