"""Large RAPI answers are decoded with the cyclic garbage collector paused, and it is restored after."""

from __future__ import annotations

import gc

import orjson
import pytest

from synnefo_ganeti._gc import gc_paused
from synnefo_ganeti.rapi._transport import LARGE_ANSWER, decode_json


def test_decoding_restores_the_collector_and_gives_the_same_data() -> None:
    large = orjson.dumps([{"name": f"vm{i}", "nic.macs": ["aa:00:00:00:00:00"]} for i in range(5000)])
    assert len(large) > LARGE_ANSWER
    assert gc.isenabled()
    assert decode_json(large) == orjson.loads(large)
    assert decode_json(b'{"small": 1}') == {"small": 1}
    assert gc.isenabled()


def test_paused_inside_restored_after_even_on_error() -> None:
    with pytest.raises(orjson.JSONDecodeError):
        decode_json(b"[" * LARGE_ANSWER)
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_disabled_by_the_application_stays_disabled() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
