"""Ganeti's RAPI error answers: ``{"code", "message", "explain"}`` as ganeti-rapi writes them."""

from __future__ import annotations

import html

import orjson
from aiohttp import web

__all__ = ["HTTPError", "ganeti_error", "invalid"]

_EXPLAIN = {
    400: "Bad request syntax or unsupported method", 401: "No permission -- see authorization schemes",
    404: "Nothing matches the given URI", 415: "Entity body in unsupported format",
    500: "Server got itself in trouble", 501: "Server does not support this operation",
    502: "Invalid responses from another server/proxy",
    503: "The server cannot process the request due to a high load",
    504: "The gateway server did not receive a timely response",
}  # fmt: skip
_REASON = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 415: "Unsupported Media Type",
           501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}  # fmt: skip


class HTTPError(Exception):
    def __init__(self, status: int, message: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message or _REASON.get(status, "Error")


def ganeti_error(status: int, message: str | None = None) -> web.Response:
    body = {
        "code": status,
        "message": message or _REASON.get(status, "Error"),
        "explain": _EXPLAIN.get(status, ""),
    }
    headers = {"Connection": "close"} | (
        {"WWW-Authenticate": 'Basic realm="Ganeti Remote API"'} if status == 401 else {}
    )
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)  # fmt: skip


def invalid(op: str, parameter: str) -> HTTPError:
    text = f"Invalid body parameters: (\"Parameter '{op}.{parameter}' fails validation\", 'wrong_input')"
    return HTTPError(400, html.escape(text, quote=True))
