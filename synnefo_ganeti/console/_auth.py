"""Who may use the console: users and tokens from files, sessions, roles and CSRF tokens.

Nothing is served without a session, except the login page and the static files.

* **Users** (``[web] users_file``): one ``name:role:hash`` per line, ``hash`` an argon2
  hash (``synnefo-ganeti web --hash-password`` makes one); ``#`` starts a comment.
  **Tokens** (``[web] tokens_file``): ``name:role:sha256:<hex>``, the SHA-256 of a long
  random token (a token is as good as a password: high entropy makes a plain hash
  enough). The files are read again at each login, so edits need no restart.
* **Roles**: ``viewer`` reads every page; ``operator`` also acts (reconcile, fixes,
  deleting an orphan, draining, canceling, node and instance actions). An action by a viewer is
  a 403. ``operator@b1,b2`` is an operator of those backends only (a viewer of the others): an
  action on another backend, or on every backend at once, is a 403.
* **Sessions** live in memory (a restart logs everyone out): a random id in a cookie
  that is ``HttpOnly``, ``SameSite=Strict`` and ``Secure`` (unless ``[web]
  secure_cookies = false``, for plain HTTP on loopback); it ends after ``session_hours``
  without a request, or at logout.
* **CSRF**: every session has a random token, put in each form (``csrf``) and in a meta
  tag (htmx sends it as ``X-CSRF-Token``); a POST without the session's token is a 403,
  as is one whose ``Origin`` is another site's.
* **One-time logins** (``synnefo-ganeti demo --web``): a random token that opens one
  session, once, within ten minutes.

No password, hash, token or session id is ever logged, shown in a page, or put in a
``repr``; failed logins are logged with the name given and the peer's address.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import aiohttp_jinja2
from aiohttp import web
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from synnefo_ganeti.errors import ConfigError

__all__ = [
    "COOKIE",
    "ROLES",
    "SESSION",
    "Auth",
    "Role",
    "Session",
    "Sessions",
    "User",
    "hash_password",
    "hash_token",
    "page",
    "read_users",
    "require_operator",
    "session_of",
]

log = logging.getLogger("synnefo_ganeti.console")

Role = Literal["viewer", "operator"]
ROLES: tuple[Role, ...] = ("viewer", "operator")

#: the session cookie's name
COOKIE = "sg_console"
#: paths served without a session
PUBLIC_PREFIXES = ("/login", "/static/")

_hasher = PasswordHasher()
# verify() against this when the name is unknown, so that a wrong name takes as long as a wrong password
_DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))


def hash_password(password: str) -> str:
    """An argon2id hash of ``password`` for a users file line (``name:role:<hash>``)."""
    return _hasher.hash(password)


def hash_token(token: str) -> str:
    """What a tokens file holds for ``token``: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class User:
    name: str
    role: Role
    secret_hash: str = field(repr=False)
    #: an operator of these backends only (``operator@b1,b2``); None: of every backend
    backends: frozenset[str] | None = None

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"


def read_users(path: Path, *, what: str = "users_file") -> dict[str, User]:
    """The users of a users or tokens file; :class:`ConfigError` naming the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"[web] {what} {path} does not exist; create it (see docs/console.md)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"[web] {what} {path} cannot be read: {exc}") from None
    users: dict[str, User] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0] or not parts[2]:
            raise ConfigError(f"[web] {what} {path}, line {number}: expected name:role:hash")
        name, role, secret_hash = parts
        backends: frozenset[str] | None = None
        if role.startswith("operator@"):
            backends = frozenset(b.strip() for b in role.split("@", 1)[1].split(",") if b.strip())
            if not backends:
                raise ConfigError(
                    f"[web] {what} {path}, line {number}: role {role!r} names no backend (operator@b1,b2)"
                )
            role = "operator"
        if role not in ROLES:
            raise ConfigError(
                f"[web] {what} {path}, line {number}: role {role!r} is neither viewer, operator nor "
                "operator@BACKEND,..."
            )
        users[name] = User(name, role, secret_hash, backends)  # role: checked above
    return users


@dataclass(slots=True)
class Session:
    """One logged-in browser: who, with which role, its CSRF token, when it was last used."""

    id: str = field(repr=False)
    user: str
    role: Role
    csrf: str = field(repr=False)
    last_seen: float = field(default_factory=time.monotonic)
    #: what the last actions did, shown once on the next page
    flash: list[str] = field(default_factory=list)
    #: an operator of these backends only; None: of every backend
    backends: frozenset[str] | None = None

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"

    def may_act(self, backend: str | None) -> bool:
        """An operator of ``backend`` (None: of every backend at once)."""
        if not self.is_operator:
            return False
        return self.backends is None or (backend is not None and backend in self.backends)

    @property
    def role_text(self) -> str:
        return f"operator of {', '.join(sorted(self.backends))}" if self.backends is not None else self.role


#: the request's session (set by :meth:`Auth.middleware`)
SESSION = web.RequestKey("synnefo_ganeti_console_session", Session)


def session_of(request: web.Request) -> Session | None:
    return request.get(SESSION)


def page(
    template: str, request: web.Request, context: Mapping[str, object], *, status: int = 200
) -> web.Response:
    """Render a page of the console: ``context`` plus the session and its messages (shown once)."""
    session = request.get(SESSION)
    flash = list(session.flash) if session is not None else []
    if session is not None:
        session.flash.clear()
    full = {"session": session, "flash": flash, **context}
    return aiohttp_jinja2.render_template(template, request, full, status=status)


class Sessions:
    """The sessions of this process (in memory), ending after ``idle`` seconds unused."""

    def __init__(self, *, idle: float) -> None:
        self.idle = idle
        self._sessions: dict[str, Session] = {}
        self._once: dict[str, tuple[str, Role, float]] = {}  # one-time token -> user, role, deadline

    def __repr__(self) -> str:
        return f"<Sessions {len(self._sessions)} open, {len(self._once)} one-time logins>"

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, user: str, role: Role, backends: frozenset[str] | None = None) -> Session:
        session = Session(secrets.token_urlsafe(32), user, role, secrets.token_urlsafe(32), backends=backends)
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        now = time.monotonic()
        if session is None or now - session.last_seen > self.idle:
            self._sessions.pop(session_id, None)
            return None
        session.last_seen = now
        return session

    def close(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def one_time_login(self, user: str, role: Role, *, valid_for: float = 600.0) -> str:
        """A token that opens one session as ``user`` once (``/login/once/<token>``)."""
        token = secrets.token_urlsafe(32)
        self._once[token] = (user, role, time.monotonic() + valid_for)
        return token

    def use_once(self, token: str) -> Session | None:
        entry = self._once.pop(token, None)
        if entry is None or time.monotonic() > entry[2]:
            return None
        return self.open(entry[0], entry[1])


class Auth:
    """Checks logins against the users and tokens files; the middleware every request passes."""

    def __init__(
        self,
        *,
        users_file: Path | None,
        tokens_file: Path | None,
        secure_cookies: bool,
        session_hours: float,
    ) -> None:
        self.users_file = users_file
        self.tokens_file = tokens_file
        self.secure_cookies = secure_cookies
        self.sessions = Sessions(idle=session_hours * 3600)
        self._failures: dict[str, list[float]] = {}  # peer -> times of its failed logins

    def __repr__(self) -> str:
        return f"<Auth users_file={self.users_file} tokens_file={self.tokens_file} {self.sessions!r}>"

    def check_files(self) -> None:
        """Read the files once (at start), so that a broken one is an error now."""
        for path, what in ((self.users_file, "users_file"), (self.tokens_file, "tokens_file")):
            if path is not None:
                read_users(path, what=what)

    def _throttled(self, peer: str) -> bool:
        """More than 10 failed logins from ``peer`` in the last minute."""
        now = time.monotonic()
        recent = [t for t in self._failures.get(peer, []) if now - t < 60]
        self._failures[peer] = recent
        return len(recent) >= 10

    def _failed(self, peer: str) -> None:
        if len(self._failures) > 10_000:  # many peers failing: keep the memory bounded
            self._failures.clear()
        self._failures.setdefault(peer, []).append(time.monotonic())

    def login_password(self, name: str, password: str, peer: str) -> Session | None:
        if self._throttled(peer) or self.users_file is None:
            return None
        user = read_users(self.users_file).get(name)
        try:
            _hasher.verify(user.secret_hash if user is not None else _DUMMY_HASH, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            user = None
        if user is None:
            self._failed(peer)
            log.warning("console: failed login for %r from %s", name, peer)
            return None
        log.info("console: %s (%s) logged in from %s", user.name, user.role, peer)
        return self.sessions.open(user.name, user.role, user.backends)

    def login_token(self, token: str, peer: str) -> Session | None:
        if self._throttled(peer) or self.tokens_file is None:
            return None
        wanted = hash_token(token)
        for user in read_users(self.tokens_file, what="tokens_file").values():
            if hmac.compare_digest(user.secret_hash, wanted):
                log.info("console: %s (%s) logged in with a token from %s", user.name, user.role, peer)
                return self.sessions.open(user.name, user.role, user.backends)
        self._failed(peer)
        log.warning("console: failed token login from %s", peer)
        return None

    def set_cookie(self, response: web.StreamResponse, session: Session) -> None:
        response.set_cookie(
            COOKIE,
            session.id,
            httponly=True,
            secure=self.secure_cookies,
            samesite="Strict",
            path="/",
        )

    def clear_cookie(self, response: web.StreamResponse) -> None:
        response.del_cookie(COOKIE, path="/")

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """No session: the login page (or a 401 for fragments and the event stream). A POST
        must carry the session's CSRF token and come from this site."""
        path = request.path
        if path.startswith(PUBLIC_PREFIXES) or path in ("/metrics", "/healthz", "/readyz"):
            return await handler(request)
        session = self.sessions.get(request.cookies.get(COOKIE))
        if session is None:
            if request.method == "GET" and "HX-Request" not in request.headers and path != "/events":
                raise web.HTTPSeeOther(f"/login?next={path}")
            raise web.HTTPUnauthorized(text="log in first: /login")
        request[SESSION] = session
        if request.method not in ("GET", "HEAD"):
            await self._check_csrf(request, session)
        response = await handler(request)
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    async def _check_csrf(self, request: web.Request, session: Session) -> None:
        origin = request.headers.get("Origin")
        if origin is not None and origin not in _own_origins(request):
            log.warning(
                "console: %s: POST %s from another origin (%s) refused", session.user, request.path, origin
            )
            raise web.HTTPForbidden(text="refused: this form was not sent from the console's own pages")
        given = request.headers.get("X-CSRF-Token")
        if given is None:
            form = await request.post()
            value = form.get("csrf")
            given = value if isinstance(value, str) else None
        if given is None or not hmac.compare_digest(given, session.csrf):
            log.warning("console: %s: POST %s without a valid CSRF token refused", session.user, request.path)
            raise web.HTTPForbidden(
                text="refused: the form's CSRF token is missing or stale; reload the page"
            )


def _own_origins(request: web.Request) -> Iterable[str]:
    host = request.headers.get("Host", request.host)
    return {f"http://{host}", f"https://{host}"}


_ANY = object()


def require_operator(request: web.Request, backend: str | object | None = _ANY) -> Session:
    """The session of an operator; a 403 for a viewer (every action calls it first). With
    ``backend`` (None: every backend at once), an operator of some backends only must be one of it."""
    session = request[SESSION]
    if not session.is_operator:
        log.warning("console: %s (viewer) tried %s %s: refused", session.user, request.method, request.path)
        raise web.HTTPForbidden(text=f"refused: {session.user} is a viewer; only operators act")
    if backend is not _ANY and not session.may_act(backend if isinstance(backend, str) else None):
        where = f"backend {backend}" if isinstance(backend, str) else "every backend at once"
        log.warning("console: %s (%s) tried %s %s on %s: refused", session.user, session.role_text,
                    request.method, request.path, where)  # fmt: skip
        raise web.HTTPForbidden(
            text=f"refused: {session.user} is an {session.role_text} only; not of {where}"
        )
    return session
