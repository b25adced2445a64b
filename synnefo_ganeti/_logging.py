"""Logging for the daemons: JSON lines for collectors, key-value lines on a terminal.

The library itself logs through plain :mod:`logging` (``logging.getLogger(
"synnefo_ganeti....")``) and never configures anything: an application embedding
it keeps its own logging. Only the programs of this package (the ``watch``,
``dispatcher`` and ``demo`` commands) call :func:`configure_logging`, once, at the
edge, before ``asyncio.run()``::

    from synnefo_ganeti._logging import configure_logging

    configure_logging(level="info")            # JSON unless stderr is a terminal
    configure_logging(level="debug", json=True)  # JSON lines, always

It installs one handler on the root logger whose formatter is structlog's
:class:`~structlog.stdlib.ProcessorFormatter`, so every stdlib record, ours and
other libraries', comes out as one JSON object per line (``timestamp`` in ISO 8601
UTC, ``level``, ``logger``, ``event``, then the record's ``extra`` fields) or, on a
terminal, as a readable key-value line. Calling it again replaces that handler
(idempotent). ``synnefo_ganeti.*`` loggers log at ``level``; other libraries
(aiohttp, SQLAlchemy, asyncio) at ``WARNING`` or at ``level`` if that is higher,
so that ``--log-level debug`` shows our detail, not every SQL statement.

:func:`get_logger` gives a structlog logger for code that wants key-value events
(``log.info("submitted", backend="athens", job_id=12)``); it is wired to a stdlib
logger of the same name through ``extra``, so it too works without any structlog
configuration, and under :func:`configure_logging` the keys become JSON fields.

Secrets are redacted as a last defence, after every other processor: the value
of any key that names a secret (``password``, ``passwd``, ``secret``, ``token``,
``authorization``, ``api_key``, ``credentials``, ``cookie``), and inside every
string ``user:password@`` in URLs, ``password=...`` pairs and ``Basic``/``Bearer``
credentials. The code must still never log secrets; this only limits the damage.
"""

from __future__ import annotations

import io
import logging
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final, TextIO, cast

import orjson
import structlog
from structlog.typing import EventDict, ExcInfo, Processor, WrappedLogger

__all__ = ["REDACTED", "configure_logging", "get_logger", "redact", "redact_secrets"]

REDACTED: Final = "***"

_SECRET_KEY: Final = re.compile(
    r"passw(?:or)?d|secret|token|authori[sz]ation|api[-_]?key|credential|cookie", re.IGNORECASE
)
# scheme://user:password@host -- the password may hold '@' (unencoded), so take the last '@'
# before the path or the end of the word.
_URL_USERINFO: Final = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]*):[^\s/]*@")
_KEY_VALUE: Final = re.compile(
    r"(?P<head>(?:passw(?:or)?d|secret|token|api[-_]?key)['\"]?\s*[=:]\s*)"
    r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s&;,'\"}]+)",
    re.IGNORECASE,
)
_AUTHORIZATION: Final = re.compile(
    r"(?P<head>authori[sz]ation['\"]?\s*[=:]\s*['\"]?(?:(?:basic|bearer|token)\s+)?)[^\s'\",}]+",
    re.IGNORECASE,
)
# a Basic credential anywhere: base64 with at least one digit, '+', '/' or '=' (not prose)
_BASIC: Final = re.compile(r"(?P<head>\bBasic\s+)(?=[A-Za-z]*[0-9+/=])[A-Za-z0-9+/]{8,}={0,2}")
_BEARER: Final = re.compile(r"(?P<head>\bBearer\s+)[A-Za-z0-9._~+/=-]{16,}")
_MAX_DEPTH: Final = 8

#: attributes of every LogRecord: keys of a structlog event that clash with them are renamed
_RECORD_KEYS: Final = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_HANDLER_MARK: Final = "_synnefo_ganeti_handler"


def redact(text: str) -> str:
    """``text`` with URL passwords, ``password=...`` pairs and Basic/Bearer credentials masked."""
    if "://" in text:
        text = _URL_USERINFO.sub(rf"\g<head>:{REDACTED}@", text)
    for pattern in (_KEY_VALUE, _AUTHORIZATION, _BASIC, _BEARER):
        text = pattern.sub(rf"\g<head>{REDACTED}", text)
    return text


def _redact_value(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        return redact(value)
    if depth >= _MAX_DEPTH:
        return value
    if isinstance(value, Mapping):
        return {
            key: REDACTED if _is_secret_key(key, item) else _redact_value(item, depth + 1)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(_redact_value(item, depth + 1) for item in value) if value else value
    return value


def _is_secret_key(key: object, value: object) -> bool:
    return isinstance(key, str) and value is not None and _SECRET_KEY.search(key) is not None


def redact_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """A structlog processor: mask secrets in every value (see the module docstring)."""
    for key, value in list(event_dict.items()):
        if key.startswith("_"):  # structlog's own (_record, _from_structlog)
            continue
        if _is_secret_key(key, value):
            event_dict[key] = REDACTED
        else:
            event_dict[key] = _redact_value(value, 0)
    return event_dict


def _to_log_kwargs(logger: WrappedLogger, method: str, event_dict: EventDict) -> EventDict:
    """Hand a structlog event to stdlib: ``event`` as the message, the other keys as ``extra``."""
    for key in [k for k in event_dict if k in _RECORD_KEYS and k not in ("exc_info", "stack_info")]:
        event_dict[f"{key}_"] = event_dict.pop(key)
    return structlog.stdlib.render_to_log_kwargs(logger, method, event_dict)


#: how structlog loggers hand their events to stdlib (get_logger, and structlog.get_logger()
#: once configure_logging ran)
_TO_STDLIB: Final[list[Processor]] = [
    structlog.stdlib.filter_by_level,
    structlog.contextvars.merge_contextvars,
    _to_log_kwargs,
]


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A structlog logger that logs through ``logging.getLogger(name)``.

    Key-value pairs become the stdlib record's ``extra`` (keys that clash with a
    LogRecord attribute, such as ``name``, get a ``_`` suffix), so this works with
    or without :func:`configure_logging` and whatever the application's structlog
    configuration is.
    """
    return cast(
        structlog.stdlib.BoundLogger,
        structlog.wrap_logger(
            logging.getLogger(name),
            processors=_TO_STDLIB,
            wrapper_class=structlog.stdlib.BoundLogger,
            cache_logger_on_first_use=True,
        ),
    )


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is at the time (test runners and click swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def _json_dumps(event_dict: EventDict, **kwargs: Any) -> str:
    first = {
        key: event_dict.pop(key) for key in ("timestamp", "level", "logger", "event") if key in event_dict
    }
    first.update(event_dict)
    return orjson.dumps(first, default=kwargs.get("default", repr), option=orjson.OPT_NON_STR_KEYS).decode()


def _redacted_tracebacks(inner: Callable[[TextIO, ExcInfo], None]) -> Callable[[TextIO, ExcInfo], None]:
    def render(sio: TextIO, exc_info: ExcInfo) -> None:
        buffer = io.StringIO()
        inner(buffer, exc_info)
        sio.write(redact(buffer.getvalue()))

    return render


def _is_tty(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):  # closed or detached
        return False


def _level_number(level: str | int) -> int:
    if isinstance(level, int):
        return level
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning, error or critical")
    return number


def configure_logging(
    *, level: str | int = "INFO", json: bool | None = None, stream: TextIO | None = None
) -> None:
    """Send every log record to ``stream`` (``sys.stderr`` by default) through structlog.

    ``json``: ``True`` for JSON lines, ``False`` for console key-value lines,
    ``None`` for JSON unless the stream is a terminal. ``synnefo_ganeti.*`` loggers
    log at ``level``; other libraries at ``WARNING`` or ``level`` if higher.
    Calling it again replaces the handler it installed (and nothing else).
    """
    number = _level_number(level)
    target = sys.stderr if stream is None else stream
    as_json = not _is_tty(target) if json is None else json

    shared: list[Processor] = [
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]
    renderer: list[Processor]
    if as_json:
        renderer = [
            structlog.processors.format_exc_info,
            redact_secrets,
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.JSONRenderer(serializer=_json_dumps),
        ]
    else:
        colors = _is_tty(target)
        inner: Callable[[TextIO, ExcInfo], None] = (
            structlog.dev.RichTracebackFormatter(show_locals=False, color_system="auto" if colors else None)
            if colors
            else structlog.dev.plain_traceback
        )
        renderer = [
            redact_secrets,
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.dev.ConsoleRenderer(colors=colors, exception_formatter=_redacted_tracebacks(inner)),
        ]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.ExtraAdder()],
        processors=[*shared, *renderer],
    )
    handler: logging.Handler = _StderrHandler() if stream is None else logging.StreamHandler(stream)
    setattr(handler, _HANDLER_MARK, True)
    handler.setFormatter(formatter)

    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(max(number, logging.WARNING))
    logging.getLogger("synnefo_ganeti").setLevel(number)

    structlog.configure(
        processors=[*_TO_STDLIB],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
