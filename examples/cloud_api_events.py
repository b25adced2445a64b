"""The change events of the example cloud API (examples/cloud_api.py): ``GET /events``, as
server-sent events (``Accept: text/event-stream``) or as a long-poll, from the library's change
feed (``cp.changes()``; docs/changes.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from aiohttp import web

from examples.cloud_api_http import CONTROL_PLANE, MAX_PAGE, STOPPING, query_int
from synnefo_ganeti import Change, GanetiError, InvalidError

__all__ = ["events"]

log = logging.getLogger("cloud_api")

KEEPALIVE = 15.0  # seconds between comments on an idle event stream
LONG_POLL, MAX_LONG_POLL = 25.0, 60.0


def since_of(request: web.Request) -> int | None:
    """``?since=N`` (or an event stream's ``Last-Event-ID`` on reconnect); None: from now on."""
    text = request.query.get("since") or request.headers.get("Last-Event-ID")
    if text is None:
        return None
    if not text.isdigit():
        raise InvalidError(f"since: give the id of the last change you have, an integer (got {text!r})")
    return int(text)


async def events(request: web.Request) -> web.StreamResponse:
    if "text/event-stream" in request.headers.get("Accept", ""):
        return await stream_events(request, since_of(request))
    return await poll_events(request, since_of(request))


async def poll_events(request: web.Request, since: int | None) -> web.Response:
    """A long-poll: the changes after ``since`` as soon as there is one, or none after ``timeout``;
    ``last`` is the ``since`` of the next call."""
    cp = request.app[CONTROL_PLANE]
    limit = query_int(request, "limit", 100, low=1, high=MAX_PAGE)
    timeout = query_int(request, "timeout", int(LONG_POLL), low=0, high=int(MAX_LONG_POLL))
    after = await cp.store.last_change_id() if since is None else since
    changes = await cp.store.list_changes(after=after, limit=limit)
    if not changes and timeout:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout), contextlib.aclosing(cp.changes(after)) as feed:
                async for _ in feed:
                    break
        changes = await cp.store.list_changes(after=after, limit=limit)
    last = changes[-1].id if changes else after
    return web.json_response({"changes": [change.to_json() for change in changes], "last": last})


def sse(change: Change) -> bytes:
    return f"id: {change.id}\nevent: {change.kind}\ndata: {json.dumps(change.to_json())}\n\n".encode()


async def stream_events(request: web.Request, since: int | None) -> web.StreamResponse:
    """Server-sent events, one per change, until the client leaves or the app stops."""
    cp, stopping = request.app[CONTROL_PLANE], request.app[STOPPING]
    queue: asyncio.Queue[Change | None] = asyncio.Queue(maxsize=1000)

    async def pump() -> None:
        try:
            async with contextlib.aclosing(cp.changes(since)) as feed:
                async for change in feed:
                    await queue.put(change)
        except GanetiError as exc:
            log.warning("event stream: %r", exc)
            await queue.put(None)  # the stream ends; the client reconnects with Last-Event-ID

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    await response.write(b": connected\n\n")
    feeding = asyncio.create_task(pump(), name="event stream feed")
    stopped = asyncio.create_task(stopping.wait(), name="event stream stop")
    try:
        while not stopping.is_set():
            get = asyncio.create_task(queue.get())
            await asyncio.wait({get, stopped}, timeout=KEEPALIVE, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                await response.write(b": keep-alive\n\n")
                continue
            change = get.result()
            if change is None:
                break
            await response.write(sse(change))
    except ConnectionResetError:
        pass  # the client left
    finally:
        for task in (feeding, stopped):
            task.cancel()
        await asyncio.gather(feeding, stopped, return_exceptions=True)
    return response
