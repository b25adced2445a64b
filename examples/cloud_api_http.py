"""The HTTP plumbing of the example cloud API (examples/cloud_api.py): the app's keys, the library's
errors as statuses, and reading a JSON body and query arguments with clear errors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from synnefo_ganeti import (
    ConflictError,
    ControlPlane,
    GanetiError,
    InvalidError,
    NotFoundError,
    StoreError,
    TransportError,
    UnavailableError,
)

__all__ = [
    "CONTROL_PLANE",
    "ERRORS",
    "MAX_PAGE",
    "STOPPING",
    "error_response",
    "errors",
    "field",
    "json_body",
    "query_int",
]

log = logging.getLogger("cloud_api")

#: the app's control plane, opened on startup; set when the app stops (event streams end)
CONTROL_PLANE = web.AppKey("control_plane", ControlPlane)
STOPPING = web.AppKey("stopping", asyncio.Event)
MAX_PAGE = 1000  # the largest page a listing gives

#: the library's error types as HTTP statuses: the first match wins; any other GanetiError is a 502
ERRORS: tuple[tuple[type[GanetiError], int], ...] = (
    (InvalidError, 400),  # ValidationError (a spec no backend takes), ConfigError (an unknown backend), ...
    (NotFoundError, 404),  # no such server or request
    (ConflictError, 409),  # a name taken, an idempotency key reused, an action in progress
    (StoreError, 503),  # the database cannot answer now: try again
    (UnavailableError, 503),  # Ganeti's queue is full or drained
    (TransportError, 503),  # Ganeti did not answer
)


def error_response(exc: GanetiError) -> web.Response:
    status = next((code for kind, code in ERRORS if isinstance(exc, kind)), 502)
    body: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    field = getattr(exc, "field", None)  # a ValidationError names the spec field
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status)


@web.middleware
async def errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except GanetiError as exc:
        if not isinstance(exc, InvalidError | NotFoundError | ConflictError):
            log.warning("%s %s: %r", request.method, request.path, exc)
        return error_response(exc)


async def json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise InvalidError("the body is not JSON: send a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidError("the body must be a JSON object")
    return body


def field(
    body: dict[str, Any], name: str, kind: type[Any], default: Any = None, *, required: bool = False
) -> Any:
    value = body.get(name, default)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise InvalidError(f"{name}: give {'an integer' if kind is int else 'a string'} (got {value!r})")
    return value


def query_int(request: web.Request, name: str, default: int, *, low: int, high: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidError(f"{name}: give an integer from {low} to {high} (got {text!r})") from None
    if not low <= value <= high:
        raise InvalidError(f"{name}: give an integer from {low} to {high} (got {value})")
    return value
