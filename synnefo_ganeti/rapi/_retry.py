"""Retry policy: jittered exponential backoff, bounded in count and in time.

Which failures are retried is decided by the caller per call kind:

* safe calls (reads, long-polls): 502/503/504, timeouts and connection errors;
* writes: only what certainly did not reach Ganeti (no connection, or a 503,
  which ganeti-rapi answers before it submits anything);
* creates: as writes, and when the outcome is unknown the client first looks for
  the job that carries the create's request id (see ``RapiClient.create_instance``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

from synnefo_ganeti.errors import GanetiError, TLSError, TransportError, UnavailableError

__all__ = ["RetryPolicy", "is_transient", "is_unsent"]


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How often and how long to retry.

    ``attempts`` counts every try (1 means never retry); delays grow from
    ``backoff`` by doubling up to ``max_backoff``, each drawn uniformly below that
    bound ("full jitter"); no retry starts after ``deadline`` seconds from the first try.
    """

    attempts: int = 4
    backoff: float = 0.2
    max_backoff: float = 5.0
    deadline: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be >= 1")
        if self.backoff < 0 or self.max_backoff < 0 or self.deadline < 0:
            raise ValueError("RetryPolicy delays must be >= 0")

    def delays(self) -> Iterator[float]:
        """The pause before each retry; stops when attempts or the deadline run out."""
        start = time.monotonic()
        for attempt in range(self.attempts - 1):
            delay = random.uniform(0, min(self.max_backoff, self.backoff * (2**attempt)))
            if time.monotonic() + delay - start > self.deadline:
                return
            yield delay


def is_transient(error: GanetiError) -> bool:
    """Worth retrying for a call that is safe to repeat."""
    return isinstance(error, UnavailableError | TransportError) and not _is_tls(error)


def is_unsent(error: GanetiError) -> bool:
    """Certainly not submitted: safe to send a write again."""
    if isinstance(error, UnavailableError):
        return error.status == 503
    if isinstance(error, TransportError) and not _is_tls(error):
        return not error.maybe_sent
    return False


def _is_tls(error: GanetiError) -> bool:
    return isinstance(error, TLSError)
