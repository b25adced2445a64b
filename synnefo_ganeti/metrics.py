"""Prometheus metrics of the library (served by the dispatcher's ``/metrics``).

They live in their own registry, so that embedding the library in a cloud API
does not mix them into the API's default registry unless it asks to
(``prometheus_client.generate_latest(synnefo_ganeti.metrics.REGISTRY)``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = [
    "REGISTRY",
    "STORE_EVENTS",
    "STORE_PENDING",
    "STORE_VERSIONS",
    "STORE_WRITE_RETRIES",
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
