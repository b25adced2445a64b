"""Prometheus metrics of the library (served by the dispatcher's ``/metrics``).

Labels: ``backend`` is the configured backend name (``[[backends]] name``; a
:class:`~synnefo_ganeti.rapi.RapiClient` made without one uses its URL's
``host:port``). Every label takes a bounded set of values: no job ids, instance
names or paths.

They live in their own registry, so that embedding the library in a cloud API
does not mix them into the API's default registry unless it asks to
(``prometheus_client.generate_latest(synnefo_ganeti.metrics.REGISTRY)``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = [
    "AMQP_FAILURES",
    "AMQP_LAG",
    "AMQP_PUBLISHED",
    "BACKEND_UP",
    "DRIFT_FOUND",
    "EVENTD_DEFERRED",
    "EVENTD_FAILURES",
    "EVENTD_LAST_PUBLISH",
    "EVENTD_MASTER",
    "EVENTD_PENDING",
    "EVENTD_PUBLISHED",
    "JOBS_TRACKED",
    "RAPI_LATENCY",
    "RAPI_LATENCY_BUCKETS",
    "RAPI_REQUESTS",
    "REGISTRY",
    "REQUESTS",
    "REQUESTS_PENDING",
    "REQUESTS_WAITING",
    "RESERVATIONS_RECLAIMED",
    "STORE_EVENTS",
    "STORE_PENDING",
    "STORE_VERSIONS",
    "STORE_WRITE_RETRIES",
    "STRANDED_JOBS",
    "SUBMISSIONS",
    "WATCH_BAD_FILES",
    "WATCH_LAG",
    "WATCH_RESCANS",
    "WATCH_VERSIONS",
]

REGISTRY = CollectorRegistry(auto_describe=True)

WATCH_VERSIONS = Counter(
    "synnefo_ganeti_watch_versions",
    "Job-file versions the queue watcher read and handed to the store",
    ["backend"],
    registry=REGISTRY,
)
WATCH_BAD_FILES = Counter(
    "synnefo_ganeti_watch_bad_files",
    "Job files skipped because they could not be used (truncated, not JSON or UTF-8, too large, "
    "a symlink, unexpected shape); each bad version counted once",
    ["backend"],
    registry=REGISTRY,
)
WATCH_RESCANS = Counter(
    "synnefo_ganeti_watch_rescans",
    "Full scans of the queue directory, by reason (start, overflow, watch_lost)",
    ["backend", "reason"],
    registry=REGISTRY,
)
WATCH_LAG = Histogram(
    "synnefo_ganeti_watch_lag_seconds",
    "From reading a job-file version to its commit in the database",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
STORE_VERSIONS = Counter(
    "synnefo_ganeti_store_versions",
    "Job-file versions the writer handled, by outcome (applied, skipped)",
    ["outcome"],
    registry=REGISTRY,
)
STORE_EVENTS = Counter("synnefo_ganeti_store_events", "Job events stored", registry=REGISTRY)
STORE_WRITE_RETRIES = Counter(
    "synnefo_ganeti_store_write_retries",
    "Writer transactions retried (database unavailable, or a conflict with another process)",
    registry=REGISTRY,
)
STORE_PENDING = Gauge(
    "synnefo_ganeti_store_pending_versions",
    "Job-file versions queued for the writer",
    registry=REGISTRY,
)

# -- the RAPI client (synnefo_ganeti.rapi._transport) -----------------------------------------------

RAPI_REQUESTS = Counter(
    "synnefo_ganeti_rapi_requests",
    "RAPI requests sent (each attempt, retries included), by HTTP method and outcome: ok, "
    "http_<status> (http_401, http_503, ...), timeout, connection, tls, bad_answer (not JSON), canceled",
    ["backend", "method", "outcome"],
    registry=REGISTRY,
)
#: 10 ms to 30 s: a healthy ganeti-rapi answers in tens of milliseconds, a loaded one in
#: seconds, and the client's default timeout is 30 s
RAPI_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0)
RAPI_LATENCY = Histogram(
    "synnefo_ganeti_rapi_request_duration_seconds",
    "Time of a RAPI request on the wire (from holding a connection slot to the whole answer read), "
    "whatever its outcome; /2/jobs/ID/wait long-polls are left out (they last as long as Ganeti "
    "makes them wait)",
    ["backend", "method"],
    buckets=RAPI_LATENCY_BUCKETS,
    registry=REGISTRY,
)

# -- the dispatcher (it increments these; the library only defines them) ----------------------------

REQUESTS = Counter(
    "synnefo_ganeti_requests",
    "Requests reaching a status (pending, submitted, succeeded, failed, canceled)",
    ["status"],
    registry=REGISTRY,
)
SUBMISSIONS = Counter(
    "synnefo_ganeti_submissions",
    "Submissions of requests to a backend, by outcome (ok, refused, unknown, error)",
    ["backend", "outcome"],
    registry=REGISTRY,
)
RESERVATIONS_RECLAIMED = Counter(
    "synnefo_ganeti_reservations_reclaimed",
    "Reservations of submitted creates given back because their request ended (or went elsewhere) "
    "without the dispatcher seeing the job's end (a job the backend lost)",
    registry=REGISTRY,
)
STRANDED_JOBS = Counter(
    "synnefo_ganeti_stranded_jobs",
    "Create jobs Ganeti listed queued but never enqueued (they run only when ganeti-luxid restarts); "
    "each request placed again on its backend. One in Ganeti's queue asks an operator to look",
    ["backend"],
    registry=REGISTRY,
)
REQUESTS_PENDING = Gauge(
    "synnefo_ganeti_requests_pending",
    "Requests waiting to be submitted",
    registry=REGISTRY,
)
REQUESTS_WAITING = Gauge(
    "synnefo_ganeti_requests_waiting",
    "Requests this dispatcher holds that no backend takes now, by why (reason: no_room, "
    "backend_down, drained, not_offered, failed_there; Request.waiting_reason has the words)",
    ["reason"],
    registry=REGISTRY,
)
BACKEND_UP = Gauge(
    "synnefo_ganeti_backend_up",
    "Whether the backend's RAPI answered its last check (1) or not (0)",
    ["backend"],
    registry=REGISTRY,
)
JOBS_TRACKED = Gauge(
    "synnefo_ganeti_jobs_tracked",
    "Ganeti jobs being followed until they end",
    ["backend"],
    registry=REGISTRY,
)

AMQP_PUBLISHED = Counter(
    "synnefo_ganeti_amqp_published",
    "Changes of the feed confirmed by the AMQP broker (a change published again after a failure "
    "counts again)",
    registry=REGISTRY,
)
AMQP_FAILURES = Counter(
    "synnefo_ganeti_amqp_failures",
    "Failed connects to the AMQP broker and batches of changes it did not confirm (each retried)",
    registry=REGISTRY,
)
AMQP_LAG = Gauge(
    "synnefo_ganeti_amqp_lag",
    "Changes of the feed not yet confirmed by the AMQP broker (the last change id minus the "
    "publisher's cursor, as of its last batch or failure)",
    registry=REGISTRY,
)

# -- watch --eventd-compat (synnefo_ganeti.dispatch._eventd_publish) --------------------------------

EVENTD_PUBLISHED = Counter(
    "synnefo_ganeti_eventd_published",
    "Synnefo eventd messages confirmed by the AMQP broker (one published again after a failure counts again)",
    registry=REGISTRY,
)
EVENTD_FAILURES = Counter(
    "synnefo_ganeti_eventd_failures",
    "Failed connects to the AMQP broker and eventd batches it did not confirm (each retried)",
    registry=REGISTRY,
)
EVENTD_PENDING = Gauge(
    "synnefo_ganeti_eventd_pending",
    "Job-file versions read but not yet turned into eventd messages, plus messages not yet "
    "confirmed (held in memory, at most [synnefo] max_pending)",
    registry=REGISTRY,
)
EVENTD_DEFERRED = Counter(
    "synnefo_ganeti_eventd_deferred",
    "Job-file versions not taken in while the eventd backlog was at max_pending (read again by "
    "the rescan once it drained)",
    registry=REGISTRY,
)
EVENTD_LAST_PUBLISH = Gauge(
    "synnefo_ganeti_eventd_last_publish_timestamp_seconds",
    "When the broker last confirmed eventd messages (Unix time; 0: not yet)",
    registry=REGISTRY,
)
EVENTD_MASTER = Gauge(
    "synnefo_ganeti_eventd_master",
    "Whether this node is the cluster's master, so publishes eventd messages (1) or not (0)",
    registry=REGISTRY,
)

# -- the reconciler -----------------------------------------------------------------------------------

DRIFT_FOUND = Counter(
    "synnefo_ganeti_drift_found",
    "Drifts between the database and Ganeti found by reconcile passes, by kind (stale, orphan, "
    "building, operstate, flavor, nics, disks, tags, job); a drift that lasts counts at every pass",
    ["backend", "kind"],
    registry=REGISTRY,
)
