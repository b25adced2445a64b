"""The console's maintenance page: every rolling maintenance run with its progress (read only).

``/maintenance`` lists the runs, newest first (backend, status, steps done of all, the group,
phase and node it is at, who started it, its last heartbeat, its error); ``/maintenance/ID``
shows one run's plan, group by group, and where it is. Runs start, resume and are canceled from
the CLI (``synnefo-ganeti maintenance run|cancel``): a run lasts as long as its nodes take to
reboot, which a console request must not hold. The pages read the database only
(:class:`~synnefo_ganeti.store.operations._maintenance.MaintenanceStore`), so a separate ``web`` process
sees the CLI's runs; a run whose heartbeat is older than :data:`STALE_AFTER` seconds is shown
as "not running (killed?)": ``maintenance run BACKEND`` resumes it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from synnefo_ganeti.allocate import MaintenancePlan
from synnefo_ganeti.console._auth import page
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.errors import NotFoundError
from synnefo_ganeti.store.operations._maintenance import MaintenanceRecord, MaintenanceStore

__all__ = ["STALE_AFTER", "MaintenancePages", "run_view"]

#: a running run whose heartbeat is older than this (seconds) is shown as not running
STALE_AFTER = 60.0


def run_view(record: MaintenanceRecord, now: datetime | None = None) -> dict[str, Any]:
    """What the pages show of a run: the record, its progress in percent, where it is, its groups."""
    now = now or datetime.now(UTC)
    total = record.steps_total
    percent = 100 if record.status == "done" else (100 * record.steps_done // total if total else 0)
    pos = record.position
    group = int(pos.get("group", 0))
    at = "" if record.status in ("done", "canceled") else f"group {group + 1}"
    if at and pos.get("phase"):
        at += f": {pos.get('phase')} {pos.get('node')}"
    groups = []
    for index, g in enumerate(MaintenancePlan.from_json(record.plan).groups):
        state = "done" if index < group or record.status == "done" else "now" if index == group else "next"
        groups.append({"nodes": g.nodes, "master": g.master, "moves": g.moves, "state": state})
    stale = record.status == "running" and not record.alive(STALE_AFTER, now)
    return {"r": record, "percent": percent, "at": at, "groups": groups, "stale": stale}


class MaintenancePages:
    """The routes of the maintenance pages."""

    def __init__(self, cp: Callable[[], ControlPlane]) -> None:
        self._cp = cp

    def __repr__(self) -> str:
        return "<MaintenancePages>"

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/maintenance", self.runs_page), web.get("/maintenance/{run_id}", self.run_page)]

    async def runs_page(self, request: web.Request) -> web.Response:
        records = await MaintenanceStore(self._cp().store).runs(limit=100)
        views = [run_view(r) for r in records]
        return page("maintenance.html", request, {"page": "maintenance", "runs": views})

    async def run_page(self, request: web.Request) -> web.Response:
        try:
            record = await MaintenanceStore(self._cp().store).get(request.match_info["run_id"])
        except NotFoundError as exc:
            raise web.HTTPNotFound(text=str(exc)) from None
        return page("maintenance_run.html", request, {"page": "maintenance", **run_view(record)})
