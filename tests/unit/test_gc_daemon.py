"""The garbage collector of a running dispatcher daemon (``_gc.gc_for_daemon``): what lives as long
as the process frozen, the youngest generation collected less often; both set back when it stops."""

from __future__ import annotations

import gc

from synnefo_ganeti import ControlPlane
from synnefo_ganeti._gc import DAEMON_YOUNG_THRESHOLD, gc_for_daemon
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.store import RequestStatus, Store
from tests.helpers import spec
from tests.unit.test_dispatcher import backend, fakes, finished, running, settings_for


def test_set_for_a_daemon_then_set_back() -> None:
    """(A library of the test process may have frozen a few objects of its own before: CI's
    Python 3.12 workers had 375. Setting back unfreezes everything, as ``gc.unfreeze`` does.)"""
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    restore = gc_for_daemon()
    try:
        assert gc.get_threshold() == (DAEMON_YOUNG_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > frozen  # the process's objects so far: out of the generations
        assert gc.isenabled()  # collected less often, never not at all
    finally:
        restore()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


async def test_the_daemons_dispatcher_sets_it_while_it_runs(db_url: str) -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    async with fakes(1) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            dispatcher = Dispatcher(settings, store=store, status_server=False, freeze_gc=True)
            async with running(dispatcher):
                assert gc.get_threshold()[0] == DAEMON_YOUNG_THRESHOLD
                assert gc.get_freeze_count() > frozen
                request_id = await cp.request_instance(spec("vm-gc.example"))
                assert (await finished(cp, request_id)).status is RequestStatus.SUCCEEDED
            assert gc.get_threshold() == before
            assert gc.get_freeze_count() == 0


async def test_a_library_dispatcher_leaves_the_collector_alone(db_url: str) -> None:
    """Inside a cloud API's process (``Dispatcher`` without ``freeze_gc``) the collector is the
    application's: nothing frozen, its thresholds kept."""
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    async with fakes(1) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, running(Dispatcher(settings, store=store, status_server=False)):
            assert gc.get_threshold() == before
            assert gc.get_freeze_count() == frozen
