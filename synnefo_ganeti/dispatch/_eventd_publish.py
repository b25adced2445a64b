"""Synnefo's ``snf-ganeti-eventd``, replaced: eventd's messages from the queue watcher to RabbitMQ.

Design. The :class:`~synnefo_ganeti.watch.QueueWatcher` reads Ganeti's ``job-N`` files
(never temp files, and here not the archive: ``archive=False``) and hands each version to
:meth:`EventdPublisher.put`, which only appends it to an in-memory list and wakes
:meth:`EventdPublisher.run`. One task then does everything in order, so nothing can overtake:

1. checks that this node is the cluster's master (:class:`MasterCheck`, the file
   ``ssconf_master_node`` read again for each batch and every ``check_interval`` seconds).
   Not the master: the versions are read and dropped, and what was seen of each job is
   forgotten; when the node becomes the master the caller's ``on_master`` (the CLI: a
   rescan of the queue) reads every job again, each from ``None``. eventd ran on every
   master candidate and published each message once per candidate;
2. turns each version into eventd's messages with
   :func:`~synnefo_ganeti.watch.eventd_messages`, against the version of the same job seen
   before (kept per job, at most ``max_jobs`` jobs, the oldest forgotten first). The first
   version seen of a job counts from ``None``, as eventd does: every op's status is sent.
   That includes the scan at start: every job still in the queue directory (Ganeti archives
   finished jobs after some hours) is published again after a restart, so that what ended
   while this process was down reaches Cyclades (eventd never did; Cyclades drops a message
   older than what it has, by ``event_time``). Where :func:`~synnefo_ganeti.watch.
   instances_needing_info` names an instance, ``GET /2/instances/NAME`` is asked, at most
   ``info_timeout`` seconds; a failure or a timeout sends the message without the
   ``instance_*`` fields (a warning);
3. publishes the messages, oldest first, on one channel in publisher-confirm mode to a
   durable topic exchange (``ganeti``, Synnefo's ``settings.EXCHANGE_GANETI``): persistent,
   ``application/json``. A message leaves memory once the broker confirmed it and every one
   before it; anything else (a nack, no confirm within ``timeout``, the connection lost, the
   broker down) closes the connection and, after a backoff (0.5 s doubling up to
   ``retry_max``), publishes again from the first unconfirmed message: *at least once*, in
   order. Meanwhile the watcher goes on reading into memory.

What is not kept: the messages wait in this process's memory, not in a database (the
change feed of :mod:`._amqp` keeps its outbox in the database). A crash, a kill or a
shutdown past its deadline loses what was not confirmed yet; the scan at the next start
publishes every job still in the queue directory again, which covers it but for jobs
archived meanwhile. The URL's password is never logged: log lines and the ``repr`` show it
as ``***``.

The memory bound. :attr:`~EventdPublisher.pending` (versions read plus messages not
confirmed) is held under ``max_pending``: when :meth:`~EventdPublisher.put` finds it
there (a long broker outage), the publisher is *full*: a warning naming the bound, the
version is not taken (counted in ``deferred``), and :meth:`~EventdPublisher.accepting`
says no, so that a watcher made with ``wants=publisher.accepting`` drops what inotify marks
without reading the files. Nothing is lost, as long as the job is still in the queue
directory: what was seen of each job (its op statuses as last turned into messages) stays,
and once the backlog drained to nothing (the broker back, every message confirmed) the
publisher takes versions again and calls ``on_drained`` (the CLI: a rescan of the queue,
as at start), so each job's file is read again and only the op statuses that changed since
are published. A version with no op status changed since the job's last messages is not
held at all (``unchanged``): so the rescan fills the bound only with jobs that have
something to publish, and each drain-and-rescan round publishes some of them, even when
the queue holds more jobs than ``max_pending``. Jobs archived meanwhile are missed, as after a restart. Memory stays under
the bound plus the messages of one version.

Metrics (:mod:`synnefo_ganeti.metrics`): ``synnefo_ganeti_eventd_published_total``,
``..._failures_total``, ``..._deferred_total``, the gauges ``synnefo_ganeti_eventd_pending``,
``synnefo_ganeti_eventd_master`` and ``synnefo_ganeti_eventd_last_publish_timestamp_seconds``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import aio_pika
import orjson

from synnefo_ganeti import metrics
from synnefo_ganeti._backoff import Backoff
from synnefo_ganeti.config._notify import mask_url
from synnefo_ganeti.config._synnefo import DEFAULT_EVENTD_EXCHANGE, DEFAULT_MAX_PENDING
from synnefo_ganeti.dispatch._amqp import _BROKER_ERRORS, BrokerLink
from synnefo_ganeti.jobs import JobSummary
from synnefo_ganeti.watch import EventdMessage, InstanceInfo, eventd_messages, instances_needing_info

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel

    from synnefo_ganeti.store import JobVersion

__all__ = ["DEFAULT_EXCHANGE", "EventdPublisher", "MasterCheck", "eventd_amqp_message"]

log = logging.getLogger("synnefo_ganeti.dispatch.eventd")

#: Synnefo's ``settings.EXCHANGE_GANETI``
DEFAULT_EXCHANGE = DEFAULT_EVENTD_EXCHANGE
#: messages published (their confirms awaited together) in one round
_BATCH = 200


class InstanceSource(Protocol):
    """What answers ``GET /2/instances/NAME``: a :class:`~synnefo_ganeti.rapi.RapiClient`."""

    async def get_instance(self, name: str) -> Any: ...


class _BrokerFailed(Exception):
    """A message was not confirmed: reconnect, publish again from it."""


def eventd_amqp_message(message: EventdMessage) -> aio_pika.Message:
    """The AMQP message of one eventd message: its JSON body, persistent."""
    return aio_pika.Message(
        orjson.dumps(message.body, option=orjson.OPT_NON_STR_KEYS),
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


class MasterCheck:
    """Is this node the cluster's master? ``ssconf_master_node`` against this node's name.

    The name is Ganeti's ``netutils.Hostname.GetSysName()``, ``socket.getfqdn()``, unless
    given. The file is read again when :meth:`is_master` is asked ``fresh`` or ``interval``
    seconds after the last read; a file that cannot be read means "not the master" (a
    warning when that starts).
    """

    def __init__(self, ssconf_dir: str | os.PathLike[str], *, node_name: str | None = None) -> None:
        self.path = Path(ssconf_dir) / "ssconf_master_node"
        self.node_name = node_name or socket.getfqdn()
        self.master: str | None = None
        self.problem: str | None = None

    def __repr__(self) -> str:
        state = self.problem or f"master {self.master}"
        return f"<MasterCheck {self.node_name} ({state})>"

    def is_master(self) -> bool:
        """Read the file again; True when it names this node."""
        try:
            master = self.path.read_text().strip()
        except OSError as exc:
            problem = f"cannot read {self.path}: {exc.strerror or exc}"
            if problem != self.problem:
                log.warning("eventd: %s; not publishing until it names this node", problem)
            self.problem, self.master = problem, None
            return False
        if self.problem is not None:
            log.info("eventd: %s is readable again", self.path)
        self.problem, self.master = None, master
        return master == self.node_name


class EventdPublisher:
    """``await EventdPublisher(url, cluster=..., master=...).run()``: publish, until cancelled."""

    def __init__(
        self,
        url: str,
        *,
        cluster: str,
        master: Callable[[], bool],
        rapi: InstanceSource | None = None,
        exchange: str = DEFAULT_EXCHANGE,
        timeout: float = 10.0,
        info_timeout: float = 10.0,
        retry_max: float = 30.0,
        check_interval: float = 5.0,
        max_jobs: int = 20000,
        max_pending: int = DEFAULT_MAX_PENDING,
        on_master: Callable[[], None] | None = None,
        on_drained: Callable[[], None] | None = None,
    ) -> None:
        if not cluster:
            raise ValueError("the eventd publisher needs the cluster's name")
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self._url = url
        self.display_url = mask_url(url)
        self.cluster = cluster
        self.exchange_name = exchange
        self._master = master
        self._rapi = rapi
        self.timeout = timeout
        self.info_timeout = info_timeout
        self.retry_max = retry_max
        self.check_interval = check_interval
        self.max_jobs = max_jobs
        self.max_pending = max_pending
        #: read every job file again: called when this node becomes the master
        self.on_master = on_master
        #: read every job file again: called when a backlog that reached max_pending drained
        self.on_drained = on_drained
        self._versions: collections.deque[JobVersion] = collections.deque()
        self._outbox: collections.deque[EventdMessage] = collections.deque()
        self._seen: collections.OrderedDict[int, JobSummary] = collections.OrderedDict()
        self._wake = asyncio.Event()
        self._link = BrokerLink(url, exchange, timeout, f"eventd amqp {self.display_url}")
        self.is_master = False
        self.read = 0  # versions handed in
        self.dropped = 0  # versions dropped (not the master, archived)
        self.published = 0  # messages confirmed by the broker
        self.failures = 0  # failed connects and rounds (each retried)
        self.info_failures = 0  # instance info the RAPI did not give in time
        self.deferred = 0  # versions not taken: pending was at max_pending
        self.unchanged = 0  # versions not taken: no op status changed since last seen
        self.rescans = 0  # on_drained calls
        self.full = False  # at max_pending: not taking versions until the backlog drained
        self.failing_since: float | None = None
        self.last_published: float | None = None  # Unix time of the last confirm

    def __repr__(self) -> str:
        role = "master" if self.is_master else "not master"
        link = "connected" if self._link.connected else "not connected"
        state = "failing" if self.failing_since is not None else "ok"
        full = f", full at {self.max_pending} ({self.deferred} deferred)" if self.full else ""
        return (
            f"<EventdPublisher {self.display_url} exchange {self.exchange_name} ({role}): "
            f"{self.read} read, {self.published} published, {len(self._outbox)} waiting, "
            f"{self.failures} failures, {link}, {state}{full}>"
        )

    @property
    def pending(self) -> int:
        """Versions not yet turned into messages plus messages not yet confirmed."""
        return len(self._versions) + len(self._outbox)

    # -- the watcher's side (VersionSink) ----------------------------------------------------------

    async def put(self, version: JobVersion) -> None:
        """Take one job-file version (never blocks: kept in memory until published), unless
        :attr:`pending` reached ``max_pending``: then it is left for the rescan after the drain."""
        self.read += 1
        if self.is_master and JobSummary.of(version.job) == self._seen.get(version.job.job_id):
            # no op status changed since the messages last made of this job (a rescan reading
            # it again): nothing to publish. Not held, so that the rescan after a drain cannot
            # fill the bound with what it had already turned into messages (it makes progress)
            self.unchanged += 1
            return
        if self.full or self.pending >= self.max_pending:
            if not self.full:
                self.full = True
                log.warning(
                    "eventd: %d versions and messages held in memory, the bound (max_pending %d): "
                    "taking no more job-file events until they are published, then reading the "
                    "queue directory again (nothing still in it is lost)",
                    self.pending,
                    self.max_pending,
                )
            self.deferred += 1
            metrics.EVENTD_DEFERRED.inc()
            return
        self._versions.append(version)
        metrics.EVENTD_PENDING.set(self.pending)
        self._wake.set()

    def accepting(self, job_id: int) -> bool:
        """Whether :meth:`put` takes versions now (the watcher's ``wants``: False while full)."""
        return not self.full

    async def archived_final_job_ids(self, backend: str) -> set[int]:
        return set()  # (the watcher runs with archive=False: never asked)

    # -- the loop ----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Check the master, turn versions into messages, publish them; never returns."""
        backoff = Backoff(initial=min(0.5, self.retry_max), maximum=self.retry_max, jitter=True)
        self._check_master()
        try:
            while True:
                if self.full and not self.pending:
                    self._drained()
                if not self._versions and not self._outbox:
                    # (not wait_for: on 3.11 it can swallow a cancel that comes as the event is set)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.check_interval):
                            await self._wake.wait()
                    self._wake.clear()
                    self._check_master()
                await self._convert()
                if not self._outbox:
                    continue
                try:
                    await self._publish_some()
                except (_BrokerFailed, *_BROKER_ERRORS) as exc:
                    await self._failed(exc, backoff)
                    continue
                backoff.reset()
        finally:
            await self.close()

    async def flush(self, timeout: float) -> bool:
        """Turn what was read into messages and publish them, for at most ``timeout`` seconds
        (at shutdown, after the watcher stopped); True when nothing is left."""
        try:
            async with asyncio.timeout(timeout):
                await self._convert()
                while self._outbox:
                    await self._publish_some()
        except (TimeoutError, _BrokerFailed, *_BROKER_ERRORS):
            pass
        except Exception:  # a bug (the one that stopped run(), likely): the exit must go on
            log.exception("eventd: publishing what was read failed at shutdown")
        await self.close()
        if self.pending:
            log.warning("eventd: %d messages not confirmed at shutdown: lost", self.pending)
        return not self.pending

    def _drained(self) -> None:
        self.full = False
        self.rescans += 1
        log.warning(
            "eventd: the backlog is published; taking job-file events again and reading the queue "
            "directory again (%d versions were deferred at max_pending %d)",
            self.deferred,
            self.max_pending,
        )
        if self.on_drained is not None:
            self.on_drained()

    def _check_master(self) -> bool:
        was, self.is_master = self.is_master, self._master()
        metrics.EVENTD_MASTER.set(1 if self.is_master else 0)
        if self.is_master and not was:
            log.info("eventd: this node is the master: publishing")
            if self.on_master is not None:
                self.on_master()  # (read every job again: they were dropped meanwhile)
        elif was and not self.is_master:
            log.warning("eventd: this node is no longer the master: reading and dropping")
            self._seen.clear()
        return self.is_master

    async def _convert(self) -> None:
        """Every version read so far into messages (or dropped, not on the master)."""
        if not self._versions:
            return
        self._check_master()  # (on each batch)
        while self._versions:
            # A version leaves the list once its messages are in the outbox: cancelled while
            # the RAPI is asked (a shutdown), it is still there for flush().
            version = self._versions[0]
            if not self.is_master or version.archived:
                self._versions.popleft()
                self.dropped += 1
                continue
            job = version.job
            previous = self._seen.get(job.job_id)
            info: dict[str, InstanceInfo] = {}
            for name in instances_needing_info(previous, job):
                if (found := await self._instance_info(name, job.job_id)) is not None:
                    info[name] = found
            self._outbox.extend(eventd_messages(previous, job, cluster=self.cluster, instance_info=info))
            self._versions.popleft()
            self._seen.pop(job.job_id, None)
            self._seen[job.job_id] = JobSummary.of(job)
            while len(self._seen) > self.max_jobs:
                self._seen.popitem(last=False)
        metrics.EVENTD_PENDING.set(self.pending)

    async def _instance_info(self, name: str, job_id: int) -> InstanceInfo | None:
        if self._rapi is None:
            return None
        try:
            async with asyncio.timeout(self.info_timeout):
                return InstanceInfo.from_rapi(await self._rapi.get_instance(name))
        except Exception as exc:  # a RAPI failure must not stop the stream: sent without
            self.info_failures += 1
            problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.warning(
                "eventd: no instance info for %s (job %d) from the RAPI (%s); "
                "publishing without instance_nics/disks/hvparams",
                name,
                job_id,
                problem,
            )
            return None

    async def _publish_some(self) -> None:
        """Publish up to one batch from the head, drop the confirmed prefix, raise on the rest."""
        channel = await self._open()
        underlay = await channel.get_underlay_channel()
        batch = list(itertools.islice(self._outbox, _BATCH))
        # created in order, each task reaches the channel's FIFO lock in that order
        confirms = [
            asyncio.create_task(
                underlay.basic_publish(
                    amqp.body,
                    exchange=self.exchange_name,
                    routing_key=message.routing_key,
                    properties=amqp.properties,
                    timeout=self.timeout,
                ),
                name="eventd publish",
            )
            for message in batch
            for amqp in (eventd_amqp_message(message),)
        ]
        results = await asyncio.gather(*confirms, return_exceptions=True)
        count = 0
        for result in results:
            if isinstance(result, BaseException):
                break
            count += 1
        for _ in range(count):
            self._outbox.popleft()
        self.published += count
        metrics.EVENTD_PENDING.set(self.pending)
        if count:
            self.last_published = time.time()
            metrics.EVENTD_PUBLISHED.inc(count)
            metrics.EVENTD_LAST_PUBLISH.set(self.last_published)
        if count and self.failing_since is not None:
            log.warning(
                "eventd amqp %s: publishing again after %.0f s of failures",
                self.display_url,
                time.monotonic() - self.failing_since,
            )
            self.failing_since = None
        if count < len(batch):
            failure = results[count]
            assert isinstance(failure, BaseException)
            if not isinstance(failure, (*_BROKER_ERRORS, asyncio.CancelledError)):
                raise failure  # a bug: up to the supervisor
            problem = f"{type(failure).__name__}: {failure}" if str(failure) else type(failure).__name__
            raise _BrokerFailed(
                f"a message of job {batch[count].body.get('jobId')} not confirmed ({problem})"
            )

    async def _failed(self, exc: BaseException, backoff: Backoff) -> None:
        await self.close()
        self.failures += 1
        metrics.EVENTD_FAILURES.inc()
        delay = backoff.next()
        problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        problem = problem.replace(self._url, self.display_url)
        if self.failing_since is None:
            self.failing_since = time.monotonic()
            log.warning(
                "eventd amqp %s: cannot publish (%s); %d messages kept in memory, trying again "
                "every %.1f s up to %g s",
                self.display_url,
                problem,
                len(self._outbox),
                delay,
                self.retry_max,
            )
        else:
            log.debug("eventd amqp %s: still failing (%s); again in %.1f s", self.display_url, problem, delay)
        await asyncio.sleep(delay)

    async def _open(self) -> AbstractChannel:
        return await self._link.channel()

    async def close(self) -> None:
        await self._link.close()
