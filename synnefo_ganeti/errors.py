"""The one exception tree of synnefo-ganeti.

Every error raised by the library derives from :class:`GanetiError`, so a caller
can catch everything with one ``except`` clause, or pick the branch it can act on::

    GanetiError                     root; ``.url`` names the backend (no credentials)
    ├── RapiError                   ganeti-rapi answered with an HTTP error status
    │   ├── AuthenticationError     401/403: wrong credentials or no write access
    │   ├── NotFoundError           404, or a job that Ganeti does not know
    │   │   └── JobNotFoundError    unknown job id (Ganeti 3.0 answers 200 with nulls)
    │   ├── BadRequestError         400/415: Ganeti refused the parameters
    │   └── UnavailableError        502/503/504: queue drained or full, proxy trouble
    ├── TransportError              no usable HTTP answer
    │   ├── RapiTimeoutError        no answer in time (also ``TimeoutError``)
    │   ├── TLSError                certificate verification or fingerprint mismatch
    │   └── RapiConnectionError     refused, reset or closed connection
    ├── ConfigError                 bad client settings (also ``ValueError``)
    ├── CreateOutcomeUnknownError   a create was sent, its fate could not be established
    ├── JobFailedError              a job ended in ``error``; ``.ecode`` as Ganeti gives it
    └── StoreError                  the database is unreachable, locked, or at another schema

Every message names the backend URL and what to do next. No message, log line or
``repr`` ever carries a password: errors are built from the URL (credentials are
never part of it) and from Ganeti's answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from synnefo_ganeti.rapi._models import JobFailure

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "ConfigError",
    "CreateOutcomeUnknownError",
    "GanetiError",
    "JobFailedError",
    "JobNotFoundError",
    "NotFoundError",
    "RapiConnectionError",
    "RapiError",
    "RapiTimeoutError",
    "StoreError",
    "TLSError",
    "TransportError",
    "UnavailableError",
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


class NotFoundError(RapiError):
    """404: the instance, node or resource does not exist."""


class JobNotFoundError(NotFoundError):
    """Ganeti does not know this job id (neither in the queue nor in the archive)."""

    def __init__(self, message: str, *, url: str | None = None, job_id: int) -> None:
        super().__init__(message, url=url, status=None)
        self.job_id = job_id


class BadRequestError(RapiError):
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


class ConfigError(GanetiError, ValueError):
    """A setting is wrong (a missing CA file, a malformed fingerprint, ...); the message names it."""


class CreateOutcomeUnknownError(GanetiError):
    """A create was sent, the answer was lost, and no job or instance shows its fate.

    ``request_id`` is the id the create carried in its reason trail
    (``gnt:user`` / ``synnefo-ganeti:<request_id>``); search for it before retrying by hand.
    """

    def __init__(self, message: str, *, url: str | None = None, request_id: str) -> None:
        super().__init__(message, url=url)
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
