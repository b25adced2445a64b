"""The daemon's event loop (``[dispatcher] event_loop``, ``synnefo_ganeti/daemon/_loop.py``): uvloop's
where it can be imported, asyncio's when asked or when it cannot be; a clear error when uvloop is
insisted on and missing; and ``synnefo-ganeti dispatcher`` on the loop its settings name."""

from __future__ import annotations

import asyncio
import gc
import sys
import warnings
from pathlib import Path

import pytest
import uvloop  # a dependency of the package on Linux

from synnefo_ganeti.config import Settings
from synnefo_ganeti.daemon import loop_factory, loop_name, run_daemon
from synnefo_ganeti.errors import ConfigError


def _kind(loop: asyncio.AbstractEventLoop) -> str:
    return type(loop).__module__.split(".")[0]


@pytest.fixture
def no_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop cannot be imported (as on a platform it does not build for)."""
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop: ImportError


def test_auto_and_uvloop_take_uvloop_asyncio_takes_asyncio() -> None:
    for choice, kind in (("auto", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")):
        loop = loop_factory(choice)()
        try:
            assert _kind(loop) == kind, choice
            assert loop_name(loop) == (f"uvloop {uvloop.__version__}" if kind == "uvloop" else "asyncio")
        finally:
            loop.close()


def test_run_daemon_runs_the_coroutine_on_the_loop_named() -> None:
    async def main() -> tuple[str, str]:
        await asyncio.sleep(0)
        return _kind(asyncio.get_running_loop()), loop_name()

    assert run_daemon(main(), "auto") == ("uvloop", f"uvloop {uvloop.__version__}")
    assert run_daemon(main(), "asyncio") == ("asyncio", "asyncio")


def test_without_uvloop_auto_falls_back_and_uvloop_is_an_error(no_uvloop: None) -> None:
    loop = loop_factory("auto")()
    try:
        assert _kind(loop) == "asyncio"
    finally:
        loop.close()

    async def main() -> int:
        return 7

    with pytest.raises(ConfigError) as caught:
        loop_factory("uvloop")
    message = str(caught.value)
    assert "[dispatcher] event_loop" in message and "uvloop cannot be imported" in message
    assert "pip install uvloop" in message and "'auto'" in message
    # the coroutine handed over is closed, not left to warn that it was never awaited
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(ConfigError):
            run_daemon(main(), "uvloop")
        gc.collect()
    assert not [w for w in seen if "never awaited" in str(w.message)], [str(w.message) for w in seen]
    assert run_daemon(main(), "auto") == 7


def test_event_loop_setting(tmp_path: Path) -> None:
    assert Settings().dispatcher.event_loop == "auto"
    assert Settings(dispatcher={"event_loop": "asyncio"}).dispatcher.event_loop == "asyncio"
    path = tmp_path / "sg.toml"
    path.write_text('[dispatcher]\nevent_loop = "tokio"\n')
    with pytest.raises(ConfigError) as caught:
        Settings.from_file(path)
    assert str(caught.value) == (
        f"config file {path}: dispatcher.event_loop: Input should be 'auto', 'uvloop' or 'asyncio'"
    )
