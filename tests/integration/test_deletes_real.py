"""A delete always wins (issue 28, item 2), on the real Ganeti testbed: a delete taken while the
create runs is followed by the remove once the create ends; a delete of a request not submitted
cancels it for good; a delete while a second create waits for the node's locks cancels that create
in Ganeti. Whatever stage each delete met, the outcome is the same: DESTROYED, Ganeti has nothing.
Instance names start ``ddel-``; they are removed even when a step fails."""

from __future__ import annotations

import uuid

import pytest

from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.store import InstanceStatus, RequestStatus
from tests.helpers import eventually
from tests.integration._testbed import BACKEND, client, spec
from tests.integration.test_operations_real import DEADLINE, operating

pytestmark = [pytest.mark.timeout(600), pytest.mark.ganeti]


def ddel(tag: str) -> str:
    return f"ddel-{tag}-{uuid.uuid4().hex[:6]}.ganeti.test"


async def test_deletes_at_every_stage_of_a_create_on_the_testbed(testbed, db_url) -> None:
    first, second, pending = ddel("run"), ddel("wait"), ddel("req")
    async with operating(testbed, db_url, [first, second, pending]) as cp, client(testbed) as rapi:
        one, one_job = await cp.create_instance(spec(testbed, first), backend=BACKEND)
        two, two_job = await cp.create_instance(spec(testbed, second), backend=BACKEND)
        stages = {}
        for instance, job_id in ((two, two_job), (one, one_job)):
            before = (await rapi.get_job(job_id)).status
            # each delete is taken at once: a create job queued or waiting for its locks is
            # canceled (its id returned); a running one is followed by the remove (None)
            outcome = await cp.delete_instance(instance.id)
            stages[instance.name] = (before, outcome)
            if outcome is None:
                marked = await cp.get_instance(instance.id)
                assert marked is not None
                assert marked.delete_requested_at is not None or marked.status is InstanceStatus.DESTROYED
            else:
                assert outcome == job_id or marked_remove(outcome, job_id)

        # a request no dispatcher sent yet... (the dispatcher runs: it may be sent; either way)
        rid = await cp.request_instance(spec(testbed, pending))
        iid = (await cp.get_request(rid)).instance_id
        assert iid is not None
        await cp.delete_instance(iid)

        async def all_gone() -> bool:
            for instance_id in (one.id, two.id, iid):
                found = await cp.get_instance(instance_id)
                if found is None or found.status is not InstanceStatus.DESTROYED:
                    return False
            return True

        try:
            await eventually(all_gone, timeout=DEADLINE * 2, what="every deleted server DESTROYED")
        except AssertionError:
            states = [await cp.get_instance(i) for i in (one.id, two.id, iid)]
            raise AssertionError(
                f"not all DESTROYED: {states}; stages {stages}; request {await cp.get_request(rid)}"
            ) from None
        names = {i.name for i in await rapi.list_instances()}
        assert not {first, second, pending} & names, (stages, names)
        assert (await cp.get_request(rid)).status in (RequestStatus.CANCELED, RequestStatus.SUCCEEDED)
        # a job that ran was never canceled: the one whose delete followed it succeeded
        for name, (before, outcome) in stages.items():
            if outcome is None and before is JobStatus.RUNNING:
                job_id = one_job if name == first else two_job
                assert (await rapi.get_job(job_id)).status is JobStatus.SUCCESS


def marked_remove(outcome: int, create_job: int) -> bool:
    """A delete sent now (the create ended before it was read) returns the remove's job id."""
    return outcome > create_job
