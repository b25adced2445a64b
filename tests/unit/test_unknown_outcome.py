"""An unknown outcome is never "not sent" (issue 27, item 1), on both databases.

- A create whose answer was lost is looked for in Ganeti's job list until its job shows up or
  ``[dispatcher] unknown_outcome_wait`` has passed; only then may it be sent again.
- A request's outcome is that of the job that made (or failed to make) its instance, never that of
  a duplicate Ganeti refused by name ("already in the cluster").
- A name held in Ganeti by someone else's instance fails the request as a conflict naming it, and
  its row is never left to be adopted.
"""

from __future__ import annotations

from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.store import InstanceStatus, RequestStatus, Store, request_tag
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import creates, finished, running
from tests.unit.test_dispatcher_crash import one_backend


async def _request_statuses(store: Store, request_id: str) -> list[str | None]:
    """Every status the change feed carried for the request, in order."""
    changes = await store.list_changes(limit=None)
    return [c.status for c in changes if c.kind == "request" and c.key == request_id]


async def test_a_duplicate_refused_by_name_leaves_the_request_to_its_first_job(db_url: str) -> None:
    """The request's first create reached Ganeti although the dispatcher believes nothing did
    (its answer lost): the create sent again is refused "already in the cluster", and the request
    follows the first job, succeeding, instead of failing for a VM that runs."""
    async with one_backend(db_url) as (f1, settings, store, cp, client):
        request_id = await cp.request_instance(spec("vm-dup.example"))
        tags = [*settings.ownership.tags_for_new(), request_tag(request_id)]
        first = await client.create_instance(spec("vm-dup.example", tags=tags), request_id=request_id)
        assert (await client.wait_for_job(first)).status is JobStatus.SUCCESS
        async with running(Dispatcher(settings, store=store, status_server=False)):
            done = await finished(cp, request_id)
        assert done.status is RequestStatus.SUCCEEDED, done.error
        assert done.job_id == first
        assert creates(f1, name="vm-dup.example") == 2  # the first, and the duplicate refused
        refused = [job for job in f1.cluster.jobs.values() if job.id != first]
        assert [job.status for job in refused] == [JobStatus.ERROR]
        instance = await store.get_instance("f1", "vm-dup.example")
        assert instance is not None and instance.status is InstanceStatus.STARTED
        assert instance.last_error is None
        assert "failed" not in await _request_statuses(store, request_id)


async def test_a_name_held_by_someone_elses_instance_is_a_conflict_and_never_adopted(db_url: str) -> None:
    async with one_backend(db_url) as (f1, settings, store, cp, client):
        theirs = await client.create_instance(spec("vm-theirs.example"))  # an operator's, untagged
        assert (await client.wait_for_job(theirs)).status is JobStatus.SUCCESS
        request_id = await cp.request_instance(spec("vm-theirs.example"))
        async with running(Dispatcher(settings, store=store, status_server=False)):
            done = await finished(cp, request_id)
        assert done.status is RequestStatus.FAILED and done.error is not None
        assert done.error.startswith("conflict:") and "vm-theirs.example" in done.error
        instance = await store.get_instance("f1", "vm-theirs.example")
        assert instance is not None and instance.status is InstanceStatus.DESTROYED
        # Ganeti's instance is untouched: still there, without our marks, no job sent for it
        assert "vm-theirs.example" in f1.cluster.instances
        assert request_tag(request_id) not in f1.cluster.instances["vm-theirs.example"].tags
        assert creates(f1, name="vm-theirs.example") == 2


async def test_a_lost_answer_is_looked_for_before_the_create_goes_again(db_url: str) -> None:
    """A 504 (ganeti-rapi's timeout on its master daemon: the create may be queued yet) is not
    sent again at once: the job list is read until ``unknown_outcome_wait`` has passed, then the
    create goes again, once."""
    async with one_backend(db_url) as (f1, settings, store, cp, _client):
        settings = settings.model_copy(
            update={"dispatcher": settings.dispatcher.model_copy(update={"unknown_outcome_wait": 1.0})}
        )
        f1.inject_fault("504", method="POST", path="/2/instances", times=1)
        request_id = await cp.request_instance(spec("vm-late.example"))
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            done = await finished(cp, request_id)
        assert done.status is RequestStatus.SUCCEEDED and done.attempts == 2
        assert d.stats.resubmitted == 1 and d.stats.submitted == 1
        assert creates(f1, name="vm-late.example") == 1


async def test_a_create_whose_job_appears_after_the_client_gave_up_is_recorded_not_sent_again(
    db_url: str,
) -> None:
    """ganeti-rapi answers after the client's timeout and queues the job meanwhile (the real lab
    with a node dead: POSTs of 5 to 20 s): the dispatcher finds the job while it looks, records
    and follows it; one create in Ganeti, sent once."""
    async with one_backend(db_url) as (f1, settings, store, cp, _client):
        settings = settings.model_copy(
            update={
                "backends": [settings.backends[0].model_copy(update={"timeout": 0.5})],
                "dispatcher": settings.dispatcher.model_copy(update={"unknown_outcome_wait": 60.0}),
            }
        )
        # the job 2.5 s after the POST: well after the client's own look (at its 0.5 s timeout),
        # which found it when a loaded machine delayed that look past a job_after of 1 s
        f1.slow_submit(4.0, job_after=2.5, times=1)
        request_id = await cp.request_instance(spec("vm-slow.example"))
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            done = await finished(cp, request_id)
        assert done.status is RequestStatus.SUCCEEDED, done.error
        assert d.stats.resubmitted == 0 and d.stats.recovered == 1
        assert creates(f1, name="vm-slow.example") == 1


async def test_a_create_queued_after_the_wait_is_refused_by_name_and_the_request_still_succeeds(
    db_url: str,
) -> None:
    """Past ``unknown_outcome_wait`` the create goes again; the first POST's job reaches the queue
    later still and Ganeti refuses it by name: one instance, the request succeeded, never failed."""
    async with one_backend(db_url) as (f1, settings, store, cp, _client):
        settings = settings.model_copy(
            update={
                "backends": [settings.backends[0].model_copy(update={"timeout": 0.3})],
                "dispatcher": settings.dispatcher.model_copy(update={"unknown_outcome_wait": 0.3}),
            }
        )
        f1.slow_submit(4.0, job_after=2.0, times=1)
        request_id = await cp.request_instance(spec("vm-later.example"))
        async with running(Dispatcher(settings, store=store, status_server=False)):
            done = await finished(cp, request_id)
            await eventually(lambda: creates(f1, name="vm-later.example") == 2, what="the late first job")
            await eventually(
                lambda: all(job.status.is_final for job in f1.cluster.jobs.values()), what="both jobs ended"
            )
        assert done.status is RequestStatus.SUCCEEDED, done.error
        assert list(f1.cluster.instances) == ["vm-later.example"]
        assert "failed" not in await _request_statuses(store, request_id)
        final = await store.get_request(request_id)
        assert final is not None and final.status is RequestStatus.SUCCEEDED
