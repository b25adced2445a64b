"""Pausing the cyclic garbage collector while many acyclic objects are built at once."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector around building many acyclic objects at once.

    Decoding a bulk answer (1,000 instances are ~1 MB of JSON, ~50,000 containers) makes
    the collector run several times, full collections included, over everything the
    process holds, and none of it can find garbage: the decoder's output has no cycles.
    Measured on a 1 MB answer: 60 ms with the collector, 8 ms without. Nothing here
    awaits, so no other task runs while it is paused.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
