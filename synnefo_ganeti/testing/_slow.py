"""Slow submits: a write whose job reaches the queue seconds after the request, and whose
answer comes later still, whether or not the client waits for it.

What it models: with a master candidate dead, the lab's ganeti-rapi took 4 to 10 s to answer
a create POST, and six POSTed at once were answered one after the other, after 5.6 to 21 s
(luxid writes each new job to every master candidate and waits on the dead one's RPC
timeout; tests/fixtures/ganeti-3.0-nodefail). ganeti-rapi forks a child per connection
(``http/server.py``, ``HttpServer``), which hands the job to luxid and answers its id: a POST
whose client gave up after 2 s still became a job (its create ran and succeeded). So a
client's timeout never means "not sent". Nor is the job, once listed, in luxid's scheduler
yet: luxid writes it to its own disk first (``/2/jobs`` lists it "queued"), then to every
master candidate, and only then enqueues it. On the lab with a node crashed, a create whose
POST timed out was found in the job list, and its cancel a moment later answered "Job N not
found in queue" (``tests/integration/test_node_crash_real.py``, 2026-12-01): ``queued_for``.

Design: the request's body is read at once (ganeti-rapi reads it before asking luxid); the
rest of the pipeline (authentication, faults, the handler that submits the job) runs in a
task of its own that starts ``job_after`` seconds after the connection was accepted, and that
no client disconnect cancels (the handler awaits it through :func:`asyncio.shield`); the
answer is sent ``answer_after`` seconds after the accept, never before the job exists. The
tasks (each the submit and the wait for the answer) are the fake's: :meth:`SlowSubmits.aclose`
cancels those still waiting when it stops, which ends their requests too.
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from synnefo_ganeti.testing._engine import ENQUEUE_AFTER

__all__ = ["SlowSubmit", "SlowSubmits"]


@dataclass
class SlowSubmit:
    """Requests matching ``method`` (None: every POST, PUT and DELETE) and ``path`` (a glob; None:
    any) get their job ``job_after`` seconds after the request and their answer ``answer_after``
    seconds after it (or when the job exists, if later); ``times`` bounds how many (None: until
    cleared)."""

    answer_after: float
    job_after: float
    method: str | None = "POST"
    #: seconds the job stays written (listed, "queued") before luxid's scheduler takes it, the
    #: answer never before (:data:`~._engine.ENQUEUE_AFTER`)
    queued_for: float = 0.0
    path: str | None = "/2/instances"
    times: int | None = None
    hits: int = 0

    def __post_init__(self) -> None:
        if self.answer_after < 0 or self.job_after < 0 or self.queued_for < 0:
            raise ValueError(
                "answer_after, job_after and queued_for must be >= 0 seconds, not "
                f"{self.answer_after}, {self.job_after}, {self.queued_for}"
            )

    def matches(self, request: web.Request) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if request.method not in ("POST", "PUT", "DELETE"):
            return False
        if self.method is not None and request.method != self.method.upper():
            return False
        return self.path is None or fnmatch.fnmatchcase(request.path, self.path)


@dataclass
class SlowSubmits:
    """The slow submits in force, and the submits they hold back."""

    rules: list[SlowSubmit] = field(default_factory=list)
    pending: set[asyncio.Task[web.StreamResponse]] = field(default_factory=set)

    def __repr__(self) -> str:
        return f"<SlowSubmits {len(self.rules)} rules, {len(self.pending)} submits held back>"

    def match(self, request: web.Request) -> SlowSubmit | None:
        for rule in self.rules:
            if rule.matches(request):
                rule.hits += 1
                return rule
        return None

    async def answer(
        self,
        request: web.Request,
        rule: SlowSubmit,
        accepted: float,
        answer: Callable[[], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """Run ``answer`` (the rest of the pipeline, which submits the job) ``rule.job_after``
        seconds after ``accepted`` (loop time) whatever the client does; answer its response
        ``rule.answer_after`` seconds after ``accepted``."""
        loop = asyncio.get_running_loop()
        await request.read()  # the whole body now: the handler reads it later, the client maybe gone

        async def submit() -> web.StreamResponse:  # (a task: its context is its own)
            await asyncio.sleep(max(0.0, accepted + rule.job_after - loop.time()))
            ENQUEUE_AFTER.set(rule.queued_for)
            response = await answer()  # (the job is written meanwhile; it is enqueued queued_for later)
            enqueued = loop.time() + rule.queued_for
            await asyncio.sleep(max(0.0, accepted + rule.answer_after - loop.time(), enqueued - loop.time()))
            if rule.queued_for:
                await asyncio.sleep(0)  # the enqueue's timer, due no later, runs first
            return response

        task = loop.create_task(submit(), name=f"fake-ganeti-slow-submit {request.method} {request.path}")
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)
        return await asyncio.shield(task)

    async def aclose(self) -> None:
        tasks = list(self.pending)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
