"""The console's pages (GET), and the fragments the live hub pushes into them.

Every page is a Jinja2 template rendered on the server (``templates/``); the parts that
change live are also templates of their own (``_*.html``), rendered by a page and, once
per change for every viewer at once, by :meth:`Views.render_live` (see :mod:`._live`).
A page names the topics it wants in ``<body data-topics="...">``; ``static/console.js``
opens the event stream with them and swaps the fragments in.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp_jinja2
from aiohttp import web

from synnefo_ganeti.console._attention import LIMIT as ATTENTION_LIMIT
from synnefo_ganeti.console._attention import attention
from synnefo_ganeti.console._auth import page
from synnefo_ganeti.console._data import Capacity, Reports, dispatchers, last_reports, overview, unplaced
from synnefo_ganeti.console._live import Dirty, Fragment
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.errors import ConfigError, NotFoundError
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.reconcile import DriftKind, Fix
from synnefo_ganeti.store import (
    InstanceStatus,
    Request,
    RequestStatus,
    StatusStore,
    StoredInstance,
    StoredJob,
)

__all__ = ["AGES", "Views"]

#: the requests page's age filter: label -> how far back
AGES = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
#: rows on a list page
PAGE = 200
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _job_key(backend: str, job_id: int) -> str:
    return f"{backend}:{job_id}"


def _progress(job: StoredJob) -> int:
    """Percent of the job's ops that ended."""
    if not job.ops:
        return 100 if job.is_final else 0
    done = sum(1 for op in job.ops if op.status.is_final)
    return round(100 * done / len(job.ops))


class Views:
    """The GET handlers; ``cp()`` gives the open control plane."""

    def __init__(self, cp: Callable[[], ControlPlane], capacity: Capacity, reports: Reports) -> None:
        self._cp = cp
        self.capacity = capacity
        self.reports = reports
        self.app: web.Application | None = None  # set by Console.install (fragments render with its env)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/", self.overview_page),
            web.get("/requests", self.requests_page),
            web.get("/requests/{id}", self.request_page),
            web.get("/instances", self.instances_page),
            web.get("/instances/{id}", self.instance_page),
            web.get("/jobs", self.jobs_page),
            web.get("/jobs/{backend}/{job_id:\\d+}", self.job_page),
            web.get("/drift", self.drift_page),
            web.get("/backend-events", self.events_page),
            web.get("/audit", self.audit_page),
            web.get("/attention", self.attention_page),
        ]

    def _render(self, template: str, context: dict[str, Any]) -> str:
        assert self.app is not None
        return aiohttp_jinja2.get_env(self.app).get_template(template).render(context)

    # -- pages -------------------------------------------------------------------------------

    async def overview_page(self, request: web.Request) -> web.Response:
        return page("overview.html", request, await self._overview_context())

    async def _overview_context(self) -> dict[str, Any]:
        cp = self._cp()
        return {
            "backends": await overview(cp, self.capacity),
            "unplaced": await unplaced(cp),
            "dispatchers": await dispatchers(cp),
            "now": datetime.now(UTC),
            "page": "overview",
        }

    async def requests_page(self, request: web.Request) -> web.Response:
        cp = self._cp()
        status = request.query.get("status") or None
        backend = request.query.get("backend") or None
        age = request.query.get("age") or None
        if status is not None and status not in {s.value for s in RequestStatus}:
            raise web.HTTPBadRequest(text=f"unknown status {status!r}: one of {', '.join(RequestStatus)}")
        if age is not None and age not in AGES:
            raise web.HTTPBadRequest(text=f"unknown age {age!r}: one of {', '.join(AGES)}")
        rows = await cp.store.list_requests(
            status=[status] if status else None, backend=backend, limit=PAGE, newest_first=True
        )
        if age is not None:
            since = datetime.now(UTC) - AGES[age]
            rows = [r for r in rows if r.created_at >= since]
        context = {
            "page": "requests",
            "requests": rows,
            "filters": {"status": status or "", "backend": backend or "", "age": age or ""},
            "statuses": [s.value for s in RequestStatus],
            "backends": [b.name for b in cp.settings.backends],
            "ages": list(AGES),
            "limit": PAGE,
        }
        return page("requests.html", request, context)

    async def request_page(self, request: web.Request) -> web.Response:
        req = await self._request(request.match_info["id"])
        context = {"page": "requests", "r": req, **await self._request_extra(req)}
        return page("request.html", request, context)

    async def _request(self, request_id: str) -> Request:
        try:
            return await self._cp().get_request(request_id)
        except NotFoundError as exc:
            raise web.HTTPNotFound(text=str(exc)) from None

    async def _request_extra(self, req: Request) -> dict[str, Any]:
        job = None
        if req.backend is not None and req.job_id is not None:
            job = await self._cp().store.get_job(req.backend, req.job_id)
        return {"job": job}

    async def instances_page(self, request: web.Request) -> web.Response:
        cp = self._cp()
        q = (request.query.get("q") or "").strip()
        backend = request.query.get("backend") or None
        status = request.query.get("status") or None
        if status is not None and status not in {s.value for s in InstanceStatus}:
            raise web.HTTPBadRequest(text=f"unknown status {status!r}: one of {', '.join(InstanceStatus)}")
        if _UUID.match(q):
            found = await cp.get_instance(q)
            rows = [found] if found is not None else []
        else:
            rows = await cp.store.list_instances(
                backend=backend, status=[status] if status else None, name_prefix=q or None, limit=PAGE
            )
            rows.sort(key=lambda i: (i.backend, i.name))
        context = {
            "page": "instances",
            "instances": rows,
            "filters": {"q": q, "backend": backend or "", "status": status or ""},
            "statuses": [s.value for s in InstanceStatus],
            "backends": [b.name for b in cp.settings.backends],
            "limit": PAGE,
        }
        return page("instances.html", request, context)

    async def instance_page(self, request: web.Request) -> web.Response:
        instance = await self._cp().get_instance(request.match_info["id"])
        if instance is None:
            raise web.HTTPNotFound(text=f"instance {request.match_info['id']} is not in the database")
        context = {"page": "instances", "i": instance, **await self._instance_extra(instance)}
        return page("instance.html", request, context)

    async def _instance_extra(self, instance: StoredInstance) -> dict[str, Any]:
        store = self._cp().store
        if instance.backend is None:
            return {"jobs": []}  # a request's instance not placed yet: no job of it so far
        recorded = await store.instance_jobs(instance.backend, instance.name)
        jobs = []
        for entry in recorded[-20:]:
            job = await store.get_job(instance.backend, entry["job_id"])
            events = await store.list_events(backend=instance.backend, job_id=entry["job_id"], limit=200)
            jobs.append({"recorded": entry, "job": job, "log": [e for e in events if e.log_message]})
        return {"jobs": list(reversed(jobs))}

    async def jobs_page(self, request: web.Request) -> web.Response:
        cp = self._cp()
        backend = request.query.get("backend") or None
        status = request.query.get("status") or None
        if status is not None and status not in {s.value for s in JobStatus}:
            raise web.HTTPBadRequest(text=f"unknown status {status!r}: one of {', '.join(JobStatus)}")
        jobs = await cp.store.list_jobs(backend=backend, status=[status] if status else None)
        jobs.sort(key=lambda j: j.first_seen_at, reverse=True)
        context = {
            "page": "jobs",
            "jobs": jobs[:PAGE],
            "progress": _progress,
            "filters": {"backend": backend or "", "status": status or ""},
            "statuses": [s.value for s in JobStatus],
            "backends": [b.name for b in cp.settings.backends],
            "limit": PAGE,
        }
        return page("jobs.html", request, context)

    async def job_page(self, request: web.Request) -> web.Response:
        backend, job_id = request.match_info["backend"], int(request.match_info["job_id"])
        context = await self._job_context(backend, job_id)
        if context["job"] is None:
            raise web.HTTPNotFound(text=f"job {job_id} of backend {backend} is not in the database")
        return page("job.html", request, {"page": "jobs", **context})

    async def _job_context(self, backend: str, job_id: int) -> dict[str, Any]:
        store = self._cp().store
        job = await store.get_job(backend, job_id)
        events = await store.list_events(backend=backend, job_id=job_id, limit=1000) if job else []
        return {"job": job, "events": events, "progress": _progress}

    async def drift_page(self, request: web.Request) -> web.Response:
        return page("drift.html", request, {"page": "drift", **await self._drift_context()})

    async def _drift_context(self) -> dict[str, Any]:
        cp = self._cp()
        return {
            "backends": [b.name for b in cp.settings.backends],
            "reports": await last_reports(cp, self.reports),
            "fixes": [fix.value for fix in Fix],
            "fix_of": {fix.kind.value: fix.value for fix in Fix},
            "orphan": DriftKind.ORPHAN.value,
        }

    async def events_page(self, request: web.Request) -> web.Response:
        backend = request.query.get("backend") or None
        cp = self._cp()
        if backend is not None:
            try:
                cp.settings.backend(backend)
            except ConfigError as exc:
                raise web.HTTPNotFound(text=str(exc)) from None
        events = await cp.store.backend_events(backend=backend, limit=500)
        context = {
            "page": "events",
            "events": events,
            "backend": backend or "",
            "backends": [b.name for b in cp.settings.backends],
        }
        return page("events.html", request, context)

    async def attention_page(self, request: web.Request) -> web.Response:
        """Failed jobs with their messages, instances in error, requests waiting and why."""
        found = await attention(self._cp())
        return page("attention.html", request, {"page": "attention", "a": found, "limit": ATTENTION_LIMIT})

    async def audit_page(self, request: web.Request) -> web.Response:
        """Every operator action, newest first (of one backend, of one actor)."""
        cp = self._cp()
        backend = request.query.get("backend") or None
        actor = request.query.get("actor") or None
        entries = await StatusStore(cp.store).audit_log(limit=500, backend=backend, actor=actor)
        context = {
            "page": "audit",
            "entries": entries,
            "backend": backend or "",
            "actor": actor or "",
            "backends": [b.name for b in cp.settings.backends],
        }
        return page("audit.html", request, context)

    # -- live fragments ----------------------------------------------------------------------

    async def render_live(self, dirty: set[Dirty], topics: frozenset[str]) -> list[Fragment]:
        """The fragments for what changed, each rendered once, only for topics held open."""
        store = self._cp().store
        out: list[Fragment] = []
        instance_pages = [t.split(":", 1)[1] for t in topics if t.startswith("instance:")]
        job_instances: set[tuple[str, str]] = set()  # (backend, instance name) of the jobs that moved
        for kind, key in sorted(dirty):
            if kind == "request" and ("requests" in topics or f"request:{key}" in topics):
                req = await store.get_request(key)
                if req is None:
                    continue
                out.append(
                    self._fragment("requests", f"request-{key}", "_request_row.html", {"r": req}, "rows")
                )
                if f"request:{key}" in topics:
                    extra = await self._request_extra(req)
                    out.append(
                        self._fragment(
                            f"request:{key}", "detail", "_request_detail.html", {"r": req, **extra}
                        )
                    )
            elif kind == "instance" and ("instances" in topics or f"instance:{key}" in topics):
                instance = await self._cp().get_instance(key)
                if instance is None:
                    continue
                out.append(
                    self._fragment(
                        "instances", f"instance-{key}", "_instance_row.html", {"i": instance}, "rows"
                    )
                )
                if f"instance:{key}" in topics:
                    extra = await self._instance_extra(instance)
                    out.append(
                        self._fragment(
                            f"instance:{key}", "detail", "_instance_detail.html", {"i": instance, **extra}
                        )
                    )
            elif kind == "job" and ("jobs" in topics or f"job:{key}" in topics or instance_pages):
                backend, _, number = key.rpartition(":")
                job = await store.get_job(backend, int(number))
                if job is None:
                    continue
                if job.instance is not None:
                    job_instances.add((backend, job.instance))
                if "jobs" in topics:
                    context = {"j": job, "progress": _progress}
                    out.append(
                        self._fragment("jobs", f"job-{backend}-{number}", "_job_row.html", context, "rows")
                    )
                if f"job:{key}" in topics:
                    context = await self._job_context(backend, int(number))
                    out.append(self._fragment(f"job:{key}", "detail", "_job_detail.html", context))
        # an instance's page shows its jobs' log lines: a job of it that moved renders it again
        for instance_id in instance_pages if job_instances else ():
            if ("instance", instance_id) in dirty:
                continue  # rendered above
            instance = await self._cp().get_instance(instance_id)
            if instance is not None and (instance.backend, instance.name) in job_instances:
                extra = await self._instance_extra(instance)
                context = {"i": instance, **extra}
                out.append(
                    self._fragment(f"instance:{instance_id}", "detail", "_instance_detail.html", context)
                )
        if "overview" in topics and ("overview", "") in dirty:
            out.append(
                self._fragment("overview", "overview", "_overview.html", await self._overview_context())
            )
        if "drift" in topics and ("drift", "") in dirty:
            out.append(self._fragment("drift", "drift", "_drift.html", await self._drift_context()))
        if "events" in topics and ("overview", "") in dirty:
            events = await store.backend_events(limit=500)
            out.append(self._fragment("events", "events", "_events.html", {"events": events, "backend": ""}))
        return out

    def _fragment(
        self, topic: str, target: str, template: str, context: dict[str, Any], into: str | None = None
    ) -> Fragment:
        # rendered once for every viewer: no session (console.js gives each form its CSRF token)
        return Fragment(topic, target, self._render(template, {"session": None, **context}), into)
