"""The reads of the dispatcher's and the API's set-based steps (:mod:`._requests_batch`), each one
statement built once: built per batch (and a burst's API writes batches of a few requests), their
construction and cache keys cost more than running them."""

from __future__ import annotations

from sqlalchemy import JSON, Integer, String, cast, func, literal_column, null, select, text, union_all

from synnefo_ganeti.store.db._any import any_of
from synnefo_ganeti.store.db._checked import checked
from synnefo_ganeti.store.db._schema import BigId
from synnefo_ganeti.store.instances._instances import InstanceStatus, instance_jobs_t, instances_t, jobs_t
from synnefo_ganeti.store.requests._names import renames_in_progress
from synnefo_ganeti.store.requests._requests import requests_t, select_requests

__all__ = ["ADD_CHECKS", "ADD_CHECKS_PG", "PLACE_CHECKS", "REQUESTS", "SUBMIT_CHECKS"]

_DESTROYED = InstanceStatus.DESTROYED.value

# the requests of these ids, with their backend's name
REQUESTS = select_requests().where(any_of(requests_t.c.id, "b_ids"))
# Names compare whatever their case (``lower(name)``, as store/requests/_names.py): the checks
# below take lowered names. They read the requests of the names whatever their status, the open
# ones picked in Python, not in SQL: statistics made while every request had ended (a cloud's
# past) say "no open request", and with the status in the query PostgreSQL read every open one (a
# burst's thousands) by the status index for each batch instead of the few of its names (issue
# 31). Likewise the instances of the names, DESTROYED ones too: with the status in the query
# PostgreSQL may read the whole partial index of live names instead of the names'.
#
# What a batch of new requests checks, in one read (one round trip, not three): the batch's ids
# already taken and the requests of its names (two arms, not an OR: each takes its own index, the
# primary key and ix_requests_name_lower), the instances of its names (by name alone, DESTROYED
# ones left out in Python: see above) and the renames in progress (their new names, as
# renaming_to reads them: the few in flight, by the partial index)
_NO_TEXT = cast(null(), String)
_NO_PARAMS = cast(null(), JSON)
ADD_CHECKS = union_all(
    select(
        literal_column("'id'").label("kind"),
        requests_t.c.id,
        requests_t.c.name,
        requests_t.c.status,
        _NO_PARAMS.label("params"),
    ).where(any_of(requests_t.c.id, "b_ids")),
    select(
        literal_column("'request'"), requests_t.c.id, requests_t.c.name, requests_t.c.status, _NO_PARAMS
    ).where(any_of(func.lower(requests_t.c.name), "b_names")),
    select(
        literal_column("'instance'"), _NO_TEXT, instances_t.c.name, instances_t.c.status, _NO_PARAMS
    ).where(any_of(func.lower(instances_t.c.name), "b_names")),
    renames_in_progress(literal_column("'rename'"), _NO_TEXT, _NO_TEXT, _NO_TEXT, instance_jobs_t.c.params),
)
# PostgreSQL: the same reads in a function that keeps a generic plan of them (migration 0018:
# with its arrays as parameters the statement was planned again at each execution), called by
# one that first takes the batch's locks, as lock_keys does (migration 0020: one round trip, not two)
ADD_CHECKS_PG = text(
    "SELECT c_kind AS kind, c_id AS id, c_name AS name, c_status AS status, c_params AS params"
    " FROM synnefo_ganeti_add_checks_locking("
    "CAST(:b_ids AS text[]), CAST(:b_names AS text[]), CAST(:b_keys AS text[]))"
).columns(kind=String, id=String, name=String, status=String, params=JSON)
_NO_ROW = cast(null(), BigId)
_NO_INT = cast(null(), Integer)
# What a placement checks once it has read its requests, in one read (one round trip, not three;
# each arm takes its own index): the instances of their names and the requests of their names
# (whatever their status: see above) and the instance rows already written with their ids
PLACE_CHECKS = union_all(
    select(
        literal_column("'instance'").label("kind"),
        _NO_TEXT.label("id"),
        instances_t.c.id.label("row_id"),
        instances_t.c.backend_id,
        instances_t.c.name,
        instances_t.c.status,
    ).where(any_of(func.lower(instances_t.c.name), "b_names")),
    select(
        literal_column("'request'"), requests_t.c.id, _NO_ROW, _NO_INT, requests_t.c.name, requests_t.c.status
    ).where(any_of(func.lower(requests_t.c.name), "b_names")),
    select(literal_column("'written'"), instances_t.c.uuid, _NO_ROW, _NO_INT, _NO_TEXT, _NO_TEXT).where(
        any_of(instances_t.c.uuid, "b_uuids")
    ),
)
# What a submissions' record checks once their jobs' keys are locked, in one read (not three):
# the live instance rows of their names, their jobs' records and their jobs as stored
SUBMIT_CHECKS = union_all(
    select(
        literal_column("'live'").label("kind"),
        instances_t.c.id.label("row_id"),
        instances_t.c.backend_id,
        _NO_ROW.label("job_id"),
        instances_t.c.name,
        _NO_TEXT.label("status"),
    ).where(any_of(instances_t.c.name, "b_names"), checked(instances_t.c.status) != _DESTROYED),
    select(
        literal_column("'recorded'"), _NO_ROW, instance_jobs_t.c.backend_id, instance_jobs_t.c.job_id,
        _NO_TEXT, _NO_TEXT,
    ).where(any_of(instance_jobs_t.c.backend_id, "b_backends"), any_of(instance_jobs_t.c.job_id, "b_jobs")),
    select(
        literal_column("'stored'"), _NO_ROW, jobs_t.c.backend_id, jobs_t.c.job_id, _NO_TEXT, jobs_t.c.status
    ).where(any_of(jobs_t.c.backend_id, "b_backends"), any_of(jobs_t.c.job_id, "b_jobs")),
)  # fmt: skip
