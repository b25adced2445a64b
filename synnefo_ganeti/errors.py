"""The one exception tree of synnefo-ganeti.

Every error raised by the library derives from :class:`GanetiError`, so a caller
can catch everything with one ``except`` clause, or pick the branch it can act on::

    GanetiError                     root; ``.url`` names the backend (no credentials)
    ├── NotFoundError               no such thing: an instance, request, job or resource (HTTP 404)
    ├── ConflictError               a name taken, an id reused, a request no longer held (409)
    │   └── RequestNotHeldError     the dispatcher lost the request (ended, canceled, taken over)
    ├── InvalidError                the caller's input was refused; nothing done (also ``ValueError``; 400)
    │   ├── ConfigError             bad settings: the message names the file and key
    │   ├── ValidationError         a create spec no backend would take; ``.field`` names the spec field
    │   ├── JobFileError            a job file that cannot be used (not UTF-8/JSON, too large, ...)
    │   └── UnsupportedError        the backend's Ganeti version lacks the call; ``.version``, ``.needed``
    ├── RapiError                   ganeti-rapi answered with an HTTP error status
    │   ├── AuthenticationError     401/403: wrong credentials or no write access
    │   ├── RapiNotFoundError       404 (also a :class:`NotFoundError`)
    │   │   └── JobNotFoundError    unknown job id (Ganeti 3.0 answers 200 with nulls)
    │   ├── BadRequestError         400/415: Ganeti refused the parameters (also an :class:`InvalidError`)
    │   └── UnavailableError        502/503/504: queue drained or full, proxy trouble (503)
    ├── TransportError              no usable HTTP answer (503)
    │   ├── RapiTimeoutError        no answer in time (also ``TimeoutError``)
    │   ├── TLSError                certificate verification or fingerprint mismatch
    │   └── RapiConnectionError     refused, reset or closed connection
    ├── NoCapacityError             no backend can take the spec; ``.reasons`` per backend
    ├── OutcomeUnknownError         a write was sent, its answer lost, and no job shows it yet; ``.reason``
    │   └── CreateOutcomeUnknownError   a create's; ``.request_id``
    ├── JobFailedError              a job ended in ``error``; ``.ecode`` as Ganeti gives it
    ├── RequestTimeoutError         ``wait_request`` gave up waiting (also ``TimeoutError``)
    ├── RootTaskEnded               a daemon's root task returned or was cancelled while it should run
    │                               (also ``RuntimeError``); the supervisor stops the process with it
    └── StoreError                  the database could not do it: unreachable, locked, other schema (503)

A caller maps errors to actions (or HTTP statuses) by type, never by message: the
statuses in brackets are what a web API built on this library would answer.

Every message names the backend URL and what to do next. No message, log line or
``repr`` ever carries a password: errors are built from the URL (credentials are
never part of it) and from Ganeti's answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from synnefo_ganeti.allocate._placement import Requirement
    from synnefo_ganeti.rapi._models import JobFailure

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "ConfigError",
    "ConflictError",
    "CreateOutcomeUnknownError",
    "GanetiError",
    "InvalidError",
    "JobFailedError",
    "JobFileError",
    "JobNotFoundError",
    "MaintenanceStepError",
    "NoCapacityError",
    "NotFoundError",
    "OutcomeUnknownError",
    "RapiConnectionError",
    "RapiError",
    "RapiNotFoundError",
    "RapiTimeoutError",
    "RequestNotHeldError",
    "RequestTimeoutError",
    "RootTaskEnded",
    "StoreError",
    "TLSError",
    "TransportError",
    "UnavailableError",
    "UnsupportedError",
    "ValidationError",
]


class GanetiError(Exception):
    """Root of every error raised by synnefo-ganeti."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.url = url

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class NotFoundError(GanetiError):
    """No such thing: an instance or request not in the database, or a 404 from ganeti-rapi."""


class ConflictError(GanetiError):
    """The call clashes with what exists: a name taken, an id reused with another meaning."""


class RequestNotHeldError(ConflictError):
    """The dispatcher no longer holds the request (it ended, was canceled, or was taken over)."""


class InvalidError(GanetiError, ValueError):
    """The caller's input was refused before anything was done; the message names the field."""


class ValidationError(InvalidError):
    """A create spec refused before anything was written: no backend would take it.

    ``field`` names the spec field (``"name"``, ``"beparams.memory"``, ``"os"``,
    ``"disk_template"``, ``"disks[0].size"``, ...); the message says what would be accepted.
    """

    def __init__(self, message: str, *, field: str, url: str | None = None) -> None:
        super().__init__(message, url=url)
        self.field = field


class JobFileError(InvalidError):
    """A job file that cannot be used: not UTF-8, not JSON, too large, or not shaped like a job."""


class UnsupportedError(InvalidError):
    """The backend's Ganeti version does not have what the call needs; nothing was sent.

    ``version`` is the backend's version (``"3.0.2"``), ``needed`` the first version that has it
    (``"3.1"``).
    """

    def __init__(self, message: str, *, url: str | None = None, version: str, needed: str) -> None:
        super().__init__(message, url=url)
        self.version = version
        self.needed = needed


class RapiError(GanetiError):
    """ganeti-rapi answered with an HTTP error status.

    ``status`` is the HTTP status, ``explain`` Ganeti's ``explain`` field and
    ``ganeti_message`` its ``message`` field (HTML entities decoded).
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        status: int | None = None,
        ganeti_message: str | None = None,
        explain: str | None = None,
    ) -> None:
        super().__init__(message, url=url)
        self.status = status
        self.ganeti_message = ganeti_message
        self.explain = explain


class AuthenticationError(RapiError):
    """401 or 403: the credentials were refused, or the user lacks write access."""


class RapiNotFoundError(RapiError, NotFoundError):
    """404: the instance, node or resource does not exist in Ganeti."""


class JobNotFoundError(RapiNotFoundError):
    """Ganeti does not know this job id (neither in the queue nor in the archive)."""

    def __init__(self, message: str, *, url: str | None = None, job_id: int) -> None:
        super().__init__(message, url=url, status=None)
        self.job_id = job_id


class BadRequestError(RapiError, InvalidError):
    """400 or 415: Ganeti refused the request's parameters."""


class UnavailableError(RapiError):
    """502, 503 or 504: Ganeti (or a proxy before it) cannot take the request now."""


class TransportError(GanetiError):
    """No usable HTTP answer.

    ``maybe_sent`` tells whether the request may have reached ganeti-rapi: it is
    ``False`` only when the connection was never established, so a write that
    failed that way is safe to send again.
    """

    def __init__(self, message: str, *, url: str | None = None, maybe_sent: bool = True) -> None:
        super().__init__(message, url=url)
        self.maybe_sent = maybe_sent


class RapiTimeoutError(TransportError, TimeoutError):
    """No answer within the timeout."""


class TLSError(TransportError):
    """The server's certificate was not trusted (verification or fingerprint mismatch)."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message, url=url, maybe_sent=False)


class RapiConnectionError(TransportError):
    """The connection was refused, reset or closed before a full answer."""


class ConfigError(InvalidError):
    """A setting is wrong (a missing CA file, a malformed fingerprint, ...); the message names it."""


class OutcomeUnknownError(GanetiError):
    """A write was sent, its answer was lost (a timeout, a broken connection, a 504), and no job
    carrying its reason shows its fate yet: it may still become a job (ganeti-rapi queues a request
    it accepted even after the client gave up). Never "not sent": look for a job whose reason
    trail holds ``reason`` before doing it again.
    """

    def __init__(self, message: str, *, url: str | None = None, reason: str) -> None:
        super().__init__(message, url=url)
        self.reason = reason


class CreateOutcomeUnknownError(OutcomeUnknownError):
    """A create was sent, the answer was lost, and no job or instance shows its fate.

    ``request_id`` is the id the create carried in its reason trail
    (``gnt:user`` / ``synnefo-ganeti:<request_id>``, the ``reason``); search for it before
    retrying by hand.
    """

    def __init__(self, message: str, *, url: str | None = None, request_id: str) -> None:
        super().__init__(message, url=url, reason=f"synnefo-ganeti:{request_id}")
        self.request_id = request_id


class JobFailedError(GanetiError):
    """A Ganeti job ended in ``error``.

    ``failure`` is the parsed result of the first failed op; ``ecode`` is Ganeti's
    error code (``already_exists``, ``wrong_input``, ...) or ``None``.
    """

    def __init__(self, message: str, *, url: str | None = None, job_id: int, failure: JobFailure) -> None:
        super().__init__(message, url=url)
        self.job_id = job_id
        self.failure = failure

    @property
    def ecode(self) -> str | None:
        return self.failure.ecode


class NoCapacityError(GanetiError):
    """No backend can take the spec; ``reasons`` maps each backend to why not."""

    def __init__(self, requirement: Requirement, reasons: dict[str, str]) -> None:
        if reasons:
            detail = "; ".join(f"{name}: {reason}" for name, reason in reasons.items())
        else:
            detail = "no backends are known (add backends to the configuration)"
        super().__init__(f"no backend can take an instance of {requirement.describe()}: {detail}")
        self.requirement = requirement
        self.reasons = dict(reasons)


class MaintenanceStepError(GanetiError):
    """A step of a rolling maintenance did not reach its end (no master candidate, a node that did
    not come back, the operator's command failed); the message says which and why. The run is
    stored as failed at that step: ``synnefo-ganeti maintenance run BACKEND`` resumes it there."""


class RootTaskEnded(GanetiError, RuntimeError):
    """A daemon's root task returned or was cancelled while it should have run until stopped
    (a root task that raised keeps its own exception). :attr:`Supervisor.failed
    <synnefo_ganeti.daemon.Supervisor.failed>` holds it; the daemon then exits non-zero, its
    health turned unhealthy for good. The message names the task."""


class StoreError(GanetiError):
    """The database could not be used: unreachable, locked too long, or at another schema version.

    ``url`` is the database URL with its password masked.
    """


class RequestTimeoutError(GanetiError, TimeoutError):
    """``wait_request`` gave up: the request has not ended yet (it goes on; wait again)."""

    def __init__(self, message: str, *, request_id: str, status: str) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.status = status
