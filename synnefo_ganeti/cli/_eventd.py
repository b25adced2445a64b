"""``synnefo-ganeti watch --eventd-compat --amqp URL``: Synnefo's snf-ganeti-eventd, replaced.

No database: the queue watcher hands each ``job-N`` version to an
:class:`~synnefo_ganeti.dispatch.EventdPublisher`, which publishes eventd's messages to
RabbitMQ while this node is the cluster's master. The flags and the ``--config`` file's
``[synnefo]`` section are merged first (:mod:`._eventd_options`: flags win, then keys, then
defaults); every problem there is a usage error, exit status 2.

The watcher, the publisher and the systemd pings are root tasks of a
:class:`~synnefo_ganeti.daemon.Supervisor`, as in ``watch``: if one of them ends (the
publisher's loop raised), its traceback is logged, ``/readyz`` answers 503, the others are
stopped and the command exits 1. On SIGINT/SIGTERM the watcher stops, and what it read is
published for at most ``SHUTDOWN_TIMEOUT`` seconds. The watcher is made with
``wants=publisher.accepting`` and the publisher's ``on_master`` and ``on_drained`` rescan
the queue: while the publisher holds ``max_pending`` versions and messages (a long broker
outage) nothing more is read, and once they are published the queue is read again.

Like the dispatcher it is a daemon: it logs at ``info`` unless ``--log-level`` says
otherwise, JSON lines off a terminal (``--log-format json`` always), and its start and stop
lines are log lines too, so that stderr holds nothing but log lines. With ``--metrics-port``
(or ``[synnefo] status_port``) it serves ``/metrics`` (``synnefo_ganeti_eventd_*`` and the
watcher's), ``/healthz`` and ``/readyz`` (the queue scanned, the broker confirming, every
root task running).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import click
from click.core import ParameterSource

from synnefo_ganeti.cli._eventd_options import (
    EventdOptions,
    EventdPlan,
    eventd_config,
    eventd_options,
)
from synnefo_ganeti.cli._main import configure_cli_logging
from synnefo_ganeti.cli._output import run
from synnefo_ganeti.config import SynnefoSettings
from synnefo_ganeti.daemon import StatusServer, Supervisor, SystemdNotifier
from synnefo_ganeti.dispatch import EventdPublisher, MasterCheck
from synnefo_ganeti.errors import ConfigError
from synnefo_ganeti.watch import QueueWatcher

__all__ = ["EventdOptions", "eventd_config", "eventd_options", "run_eventd"]

log = logging.getLogger("synnefo_ganeti.cli")

#: seconds to publish what was read, at shutdown
SHUTDOWN_TIMEOUT = 10.0
#: the parameters whose default a ``[synnefo]`` key replaces (the others are None by default)
_DEFAULTED = ("queue_dir", "exchange", "ssconf_dir", "metrics_port", "metrics_host")


@dataclass
class _Outcome:
    publisher: EventdPublisher
    failure: str | None
    seconds: float


def run_eventd(
    queue_dir: Path,
    options: EventdOptions,
    section: SynnefoSettings,
    retry_interval: float,
    *,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Merge the flags with ``section``, then publish until SIGINT/SIGTERM; exit 1 if a root task failed."""
    context = click.get_current_context()
    explicit = {
        name
        for name in _DEFAULTED
        if context.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)
    }
    plan = options.plan(
        section, queue_dir=queue_dir, metrics_port=metrics_port, metrics_host=metrics_host, explicit=explicit
    )
    if plan.rapi is not None:
        try:
            plan.rapi.password()
        except ConfigError as exc:
            raise click.UsageError(str(exc)) from None
    if context.find_root().get_parameter_source("log_level") in (ParameterSource.DEFAULT, None):
        configure_cli_logging("info")  # a daemon tells what it does unless asked otherwise
    outcome = run(_eventd(plan, retry_interval))
    publisher = outcome.publisher
    log.info(
        "stopped after %.1f s: read %d job-file versions, published %d messages (%d versions dropped, "
        "%d deferred at max_pending, %d not confirmed)",
        outcome.seconds,
        publisher.read,
        publisher.published,
        publisher.dropped,
        publisher.deferred,
        publisher.pending,
        extra={
            "versions_read": publisher.read,
            "messages_published": publisher.published,
            "versions_dropped": publisher.dropped,
            "versions_deferred": publisher.deferred,
            "not_confirmed": publisher.pending,
        },
    )
    if outcome.failure is not None:
        log.error("the eventd publisher stopped: %s", outcome.failure)
        raise SystemExit(1)


async def _eventd(plan: EventdPlan, retry_interval: float) -> _Outcome:
    notifier = SystemdNotifier()
    supervisor = Supervisor("eventd", logger=log)
    master = MasterCheck(plan.ssconf_dir, node_name=plan.node_name)
    async with contextlib.AsyncExitStack() as stack:
        rapi = None
        if plan.rapi is not None:
            rapi = await stack.enter_async_context(plan.rapi.client())
        else:
            log.warning("eventd: no --rapi: messages are sent without instance_nics/disks/hvparams")
        publisher = EventdPublisher(
            plan.url,
            cluster=plan.cluster,
            master=master.is_master,
            rapi=rapi,
            exchange=plan.exchange,
            max_pending=plan.max_pending,
        )
        watcher = QueueWatcher(
            plan.queue_dir,
            publisher,
            plan.cluster,
            retry_interval=retry_interval,
            archive=False,
            wants=publisher.accepting,
        )
        publisher.on_master = publisher.on_drained = watcher.resume
        where = ""
        if plan.metrics_port is not None:
            server = await stack.enter_async_context(_status_server(plan, watcher, publisher, supervisor))
            where = f"; metrics on {server.url}/metrics"
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        started = time.monotonic()
        log.info(
            "publishing eventd messages of %s (cluster %s, node %s) to %s exchange %s, at most %d "
            "held in memory%s (Ctrl-C to stop)",
            plan.queue_dir,
            plan.cluster,
            master.node_name,
            publisher.display_url,
            plan.exchange,
            plan.max_pending,
            where,
        )
        try:
            supervisor.start("watch queue", watcher.run())
            supervisor.start("eventd publish", publisher.run())
            if notifier.enabled:
                supervisor.start("watch systemd", _tell_systemd(notifier, watcher))
            await supervisor.wait(stop)
        finally:
            await supervisor.stop(SHUTDOWN_TIMEOUT)
            notifier.stopping()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        await publisher.flush(SHUTDOWN_TIMEOUT)
        failure = None if supervisor.healthy else supervisor.problem()
        return _Outcome(publisher, failure, time.monotonic() - started)


def _status_server(
    plan: EventdPlan, watcher: QueueWatcher, publisher: EventdPublisher, supervisor: Supervisor
) -> contextlib.AbstractAsyncContextManager[StatusServer]:
    """``/metrics``, ``/healthz`` and ``/readyz`` (the queue scanned, the broker confirming, the tasks)."""

    async def scanned() -> str | None:
        return None if watcher.stats.scans else f"queue directory {plan.queue_dir} not scanned yet"

    async def broker() -> str | None:
        if publisher.failing_since is None:
            return None
        return (
            f"cannot publish to {publisher.display_url} for {time.monotonic() - publisher.failing_since:.0f} s "
            f"({publisher.pending} pending)"
        )

    async def tasks() -> str | None:
        return supervisor.problem()

    server = StatusServer(
        host=plan.metrics_host,
        port=plan.metrics_port if plan.metrics_port is not None else 0,
        checks={"queue": scanned, "amqp": broker, "tasks": tasks},
    )

    @contextlib.asynccontextmanager
    async def serving() -> AsyncIterator[StatusServer]:
        try:
            await server.start()
        except OSError as exc:
            raise ConfigError(str(exc)) from None  # (cannot start: exit status 2)
        try:
            yield server
        finally:
            await server.stop()

    return serving()


async def _tell_systemd(notifier: SystemdNotifier, watcher: QueueWatcher) -> None:
    await watcher.ready.wait()
    notifier.ready("publishing eventd messages")
    interval = notifier.watchdog_interval()
    if not interval:
        await asyncio.Event().wait()
    while interval:
        await asyncio.sleep(interval)
        notifier.watchdog()
