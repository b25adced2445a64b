"""The dispatcher daemon (``synnefo-ganeti dispatcher``): durable requests to jobs, on many backends.

See :class:`Dispatcher` for what it runs; :class:`JobTracker` follows the jobs of a
backend whose queue directory is not local; :class:`DispatcherLock` tells live
dispatchers from dead ones.

Where things live: ``_dispatcher`` the lifecycle (root tasks under a supervisor, stop,
reload, the reconcile/metrics/lock/watchdog loops); ``_submitter`` claim, place, submit;
``_webhook`` the change-feed webhook; ``_amqp`` the change feed on AMQP; ``_eventd_publish`` Synnefo eventd's messages on AMQP (``watch --eventd-compat``); ``_recovery``
take-over of dead dispatchers' requests and the look in Ganeti before a create is sent again; ``_wiring`` per-backend clients, job followers, health and node
stats; ``_base`` the state and small steps they share.
"""

from __future__ import annotations

from synnefo_ganeti.dispatch._amqp import AMQP_CURSOR_NAME, CHANGE_ID_HEADER, AmqpPublisher, amqp_message
from synnefo_ganeti.dispatch._dispatcher import DAEMON_FIXES, Dispatcher, DispatcherStats
from synnefo_ganeti.dispatch._eventd_publish import (
    DEFAULT_EXCHANGE,
    EventdPublisher,
    MasterCheck,
    eventd_amqp_message,
)
from synnefo_ganeti.dispatch._liveness import DispatcherLock, new_dispatcher_id
from synnefo_ganeti.dispatch._tracker import JobTracker
from synnefo_ganeti.dispatch._webhook import SIGNATURE_HEADER, WebhookDeliverer, sign

__all__ = [
    "AMQP_CURSOR_NAME",
    "CHANGE_ID_HEADER",
    "DAEMON_FIXES",
    "DEFAULT_EXCHANGE",
    "SIGNATURE_HEADER",
    "AmqpPublisher",
    "Dispatcher",
    "DispatcherLock",
    "DispatcherStats",
    "EventdPublisher",
    "JobTracker",
    "MasterCheck",
    "WebhookDeliverer",
    "amqp_message",
    "eventd_amqp_message",
    "new_dispatcher_id",
    "sign",
]
