"""What benchmarks/reconcile.py counts during a cycle: garbage collection, RAPI bytes, SQL statements."""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["ByteCounter", "GcTimer", "QueryCounter"]


class GcTimer:
    """Seconds spent in garbage collection while ``timing`` is set (``gc_s``: part of ``cycle_s``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.timing = False
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self.timing:
            self.seconds += time.perf_counter() - self._started

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)


class ByteCounter:
    """Bytes of RAPI answers read while ``counting`` is set (every answer goes through
    ``_transport.decode_json``: wrapped here, for the benchmark only)."""

    def __init__(self) -> None:
        from synnefo_ganeti.rapi import _transport

        self.count = 0
        self.counting = False
        self._module = _transport
        self._decode = _transport.decode_json

        def counted(payload: bytes) -> Any:
            if self.counting:
                self.count += len(payload)
            return self._decode(payload)

        _transport.decode_json = counted

    def close(self) -> None:
        self._module.decode_json = self._decode


class QueryCounter:
    """SQL statements run while ``counting`` is set, on every engine of this process: the
    store's, and those a pass makes for its pinned read of a SQLite file (one a pass, made
    after this counter: a listener on the ``Engine`` class sees them too)."""

    def __init__(self) -> None:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        self.count = 0
        self.counting = False
        event.listen(Engine, "before_cursor_execute", self._on_execute)

    def _on_execute(self, *_args: Any) -> None:
        if self.counting:
            self.count += 1

    def close(self) -> None:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        event.remove(Engine, "before_cursor_execute", self._on_execute)
