"""The console's aiohttp application: routes, templates, static files, login, the event stream.

``Console(settings)`` owns what the pages need: a :class:`ControlPlane` (its store
borrowed when one is given: the dispatcher's), the live :class:`~._live.Hub`, the node
stats (:class:`~._data.Capacity`), the last reconcile reports and the sessions.

* ``synnefo-ganeti web``: :meth:`Console.serve` runs it on ``[web] host:port``;
* the dispatcher's status server (``[web] enabled = true``): :meth:`Console.install`
  adds the routes to that server's application (``/metrics``, ``/healthz`` and
  ``/readyz`` stay unauthenticated, as before);
* ``synnefo-ganeti demo --web``: the same, on the demo's world, with a one-time login.

Security headers on every answer: a Content-Security-Policy allowing only this origin's
scripts and styles (no inline script), ``X-Frame-Options: DENY``, ``nosniff``,
``Referrer-Policy: same-origin``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import aiohttp_jinja2
import jinja2
from aiohttp import web
from aiohttp_sse import sse_response

from synnefo_ganeti._serial import to_json_bytes
from synnefo_ganeti.config import Settings
from synnefo_ganeti.console._actions import Actions
from synnefo_ganeti.console._auth import SESSION, Auth, Role, page
from synnefo_ganeti.console._data import Capacity, Reports
from synnefo_ganeti.console._instance_actions import InstanceActions
from synnefo_ganeti.console._live import CLOSED, Hub
from synnefo_ganeti.console._maintenance import MaintenancePages
from synnefo_ganeti.console._nodes import NodePages
from synnefo_ganeti.console._views import Views
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.store import Store

__all__ = ["Console"]

log = logging.getLogger("synnefo_ganeti.console")

HERE = Path(__file__).parent
#: the topics a page may ask for (see _live)
_TOPIC = re.compile(
    r"^(overview|requests|instances|jobs|events|drift|request:[\w-]+|instance:[\w-]+|job:[\w.-]+:\d+)$"
)
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
_APP_KEY = web.AppKey("synnefo_ganeti_console", object)


def _when(value: datetime | float | None) -> str:
    """A time in UTC, to the second (the pages say UTC; naive datetimes from the store are UTC)."""
    if value is None:
        return ""
    if isinstance(value, int | float):
        value = datetime.fromtimestamp(value, UTC)
    elif value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _mib(value: int | None) -> str:
    if value is None:
        return "?"
    return f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value} MiB"


class Console:
    """The operator console over ``settings``; ``store`` is borrowed when given."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        reports: Reports | None = None,
        capacity_interval: float = 30.0,
        live_interval: float = 0.3,
    ) -> None:
        self.settings = settings
        web_settings = settings.web
        self._given_store = store
        self._cp: ControlPlane | None = None
        self.auth = Auth(
            users_file=web_settings.users_file,
            tokens_file=web_settings.tokens_file,
            secure_cookies=web_settings.secure_cookies,
            session_hours=web_settings.session_hours,
        )
        self.reports = reports or Reports()
        self.capacity = Capacity(self.control_plane, interval=capacity_interval)
        self.views = Views(self.control_plane, self.capacity, self.reports)
        self.hub = Hub(lambda: self.control_plane().store, self.views.render_live, interval=live_interval)
        self.actions = Actions(self.control_plane, self.hub, self.capacity, self.reports)
        self.nodes = NodePages(self.control_plane, self.actions)  # node pages, drain, evacuate, failover
        self.instance_actions = InstanceActions(self.control_plane, self.actions)  # start ... delete
        self.maintenance = MaintenancePages(self.control_plane)  # rolling maintenance runs (read only)
        self.reports.on_record.append(lambda: self.hub.mark(("drift", "")))
        self.capacity.on_refresh.append(lambda: self.hub.mark(("overview", "")))
        self._capacity_task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<Console {self.hub!r} {self.auth.sessions!r}>"

    def control_plane(self) -> ControlPlane:
        if self._cp is None:
            raise RuntimeError("the console is not started: serve() it or install() it on a running app")
        return self._cp

    def one_time_login(self, user: str = "demo", role: Role = "operator") -> str:
        """The path of a login that works once (``/login/once/<token>``), within ten minutes."""
        return f"/login/once/{self.auth.sessions.one_time_login(user, role)}"

    def attach(self, dispatcher: Dispatcher) -> None:
        """Serve from ``dispatcher``'s status server (on its store) and show its reconcile reports."""
        dispatcher.status_setup.append(lambda app: self.install(app, store=dispatcher.store))
        dispatcher.on_reconcile.append(self.reports.record)

    # -- the application ---------------------------------------------------------------------

    def build(self) -> web.Application:
        """A new application serving only the console."""
        app = web.Application()
        self.install(app)
        return app

    def install(self, app: web.Application, *, store: Store | None = None) -> None:
        """Add the console to ``app`` (before it starts): routes, middleware, templates, life.

        ``store`` (borrowed): the store to read, e.g. the dispatcher's, open by then."""
        self.auth.check_files()  # a missing or broken users file: ConfigError now
        if store is not None:
            self._given_store = store
        app[_APP_KEY] = self
        app.middlewares.append(_security_headers)
        app.middlewares.append(self.auth.middleware)
        env = aiohttp_jinja2.setup(
            app,
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=jinja2.select_autoescape(default=True),
            undefined=jinja2.StrictUndefined,
        )
        env.filters["when"] = _when
        env.filters["mib"] = _mib
        self.views.app = app
        app.router.add_static("/static/", HERE / "static")
        app.router.add_routes(
            [
                web.get("/login", self.login_page),
                web.post("/login", self.login),
                web.get("/login/once/{token}", self.login_once),
                web.post("/logout", self.logout),
                web.get("/events", self.events),
                *self.views.routes(),
                *self.actions.routes(),
                *self.nodes.routes(),
                *self.instance_actions.routes(),
                *self.maintenance.routes(),
            ]
        )
        app.on_startup.append(self._start)
        app.on_shutdown.append(self._shutdown)
        app.on_cleanup.append(self._cleanup)

    async def _start(self, app: web.Application) -> None:
        if self._cp is None:
            self._cp = ControlPlane(self.settings, store=self._given_store)
            await self._cp.open()
        await self.hub.start()
        self._capacity_task = asyncio.create_task(self.capacity.run(), name="console node stats")

    async def _shutdown(self, app: web.Application) -> None:
        await self.hub.stop()  # the event streams end, so that the server need not wait for them

    async def _cleanup(self, app: web.Application) -> None:
        await self.nodes.work.stop()  # node moves under way: cut off (each job runs on in Ganeti)
        if self._capacity_task is not None:
            self._capacity_task.cancel()
            await asyncio.gather(self._capacity_task, return_exceptions=True)
            self._capacity_task = None
        if self._cp is not None:
            await self._cp.close()
            self._cp = None

    @contextlib.asynccontextmanager
    async def serve(self, host: str | None = None, port: int | None = None) -> AsyncIterator[str]:
        """Serve on ``host:port`` (default ``[web]``'s) until the block ends; yields the URL."""
        host = host if host is not None else self.settings.web.host
        port = port if port is not None else self.settings.web.port
        runner = web.AppRunner(self.build(), access_log=None, handle_signals=False, shutdown_timeout=5)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            try:
                await site.start()
            except OSError as exc:
                raise OSError(
                    exc.errno, f"cannot serve the console on {host}:{port}: {exc.strerror}"
                ) from None
            bound = runner.addresses[0][1] if port == 0 and runner.addresses else port
            url = f"http://{'[' + host + ']' if ':' in host else host}:{bound}"
            log.info("console on %s", url)
            yield url
        finally:
            await runner.cleanup()

    # -- login, logout, the event stream -----------------------------------------------------

    async def login_page(self, request: web.Request) -> web.Response:
        context = {
            "error": None,
            "next": _safe_next(request.query.get("next")),
            "tokens": self.auth.tokens_file,
        }
        return page("login.html", request, context)

    async def login(self, request: web.Request) -> web.Response:
        origin = request.headers.get("Origin")
        if origin is not None and origin not in (f"http://{request.host}", f"https://{request.host}"):
            raise web.HTTPForbidden(text="refused: log in from the console's own login page")
        form = await request.post()
        peer = request.remote or "?"
        name, password, token = (str(form.get(key, "")) for key in ("username", "password", "token"))
        session = None
        if token:
            session = self.auth.login_token(token, peer)
        elif name and password:
            session = self.auth.login_password(name, password, peer)
        if session is None:
            context = {
                "error": "wrong name, password or token",
                "next": _safe_next(str(form.get("next", ""))),
                "tokens": self.auth.tokens_file,
            }
            return page("login.html", request, context, status=401)
        response = web.HTTPSeeOther(_safe_next(str(form.get("next", ""))))
        self.auth.set_cookie(response, session)
        raise response

    async def login_once(self, request: web.Request) -> web.Response:
        session = self.auth.sessions.use_once(request.match_info["token"])
        if session is None:
            raise web.HTTPForbidden(
                text="this one-time login was used already or has expired; log in with a password"
            )
        log.info(
            "console: %s (%s) logged in with a one-time link from %s",
            session.user,
            session.role,
            request.remote,
        )
        response = web.HTTPSeeOther("/")
        self.auth.set_cookie(response, session)
        raise response

    async def logout(self, request: web.Request) -> web.Response:
        session = request[SESSION]
        self.auth.sessions.close(session.id)
        log.info("console: %s logged out", session.user)
        response = web.HTTPSeeOther("/login")
        self.auth.clear_cookie(response)
        raise response

    async def events(self, request: web.Request) -> web.StreamResponse:
        """The page's event stream: ``fragment`` events (JSON: target, html, into), ``reload``."""
        topics = [t for t in request.query.get("topics", "").split(",") if t]
        if not topics or len(topics) > 10 or not all(_TOPIC.match(t) for t in topics):
            raise web.HTTPBadRequest(text="topics: up to 10 of overview, requests, request:<id>, ...")
        async with self.hub.subscribe(topics) as sub, sse_response(request) as stream:
            await stream.send("subscribed", event="ready")
            # the keep-alive pings (every 15 s) end when the page is gone: so does the stream then,
            # even when nothing is pushed to it
            gone = asyncio.ensure_future(stream.wait())
            try:
                while True:
                    coming = asyncio.ensure_future(sub.next())
                    await asyncio.wait({coming, gone}, return_when=asyncio.FIRST_COMPLETED)
                    if not coming.done():
                        coming.cancel()
                        break
                    fragment = coming.result()
                    if fragment is CLOSED:
                        break
                    if fragment is None:
                        await stream.send("behind", event="reload")
                        break
                    await stream.send(to_json_bytes(fragment.to_json()).decode(), event="fragment")
            except ConnectionResetError:  # the page went away while we wrote to it
                pass
            finally:
                gone.cancel()
        return stream


def _safe_next(value: str | None) -> str:
    """Only a path of this site (no //host, no scheme): an open redirect otherwise."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value if not value.startswith("/login") else "/"


@web.middleware
async def _security_headers(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        _headers(exc, request)
        raise
    _headers(response, request)
    return response


def _headers(response: web.StreamResponse, request: web.Request) -> None:
    if response.prepared or request.path in ("/metrics", "/healthz", "/readyz"):
        return
    response.headers.setdefault("Content-Security-Policy", _CSP)
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
