"""``BackendResources.close()`` (the facade's and the reconciler's): every RAPI client it opened and
its store are closed, each whether or not closing one before it failed; the first failure is
raised after. A client whose close raised used to leave the others and the store open."""

from __future__ import annotations

from pathlib import Path

import pytest

from synnefo_ganeti._backends import BackendResources
from synnefo_ganeti.config import Settings


def _settings(tmp_path: Path) -> Settings:
    backends = [
        {"name": name, "url": f"https://127.0.0.1:{port}", "username": "u", "password": "p"}
        for name, port in (("a", 1), ("b", 2), ("c", 3))
    ]
    return Settings(database={"url": f"sqlite:///{tmp_path / 'r.db'}"}, backends=backends)


async def test_a_client_whose_close_fails_leaves_nothing_else_open(tmp_path: Path) -> None:
    resources = BackendResources(_settings(tmp_path))
    await resources.open()
    clients = {name: await resources.client(name) for name in ("a", "b", "c")}
    store = resources.store
    closed: list[str] = []

    def tracked(name: str, fail: BaseException | None = None):
        original = clients[name].close

        async def close() -> None:
            closed.append(name)
            await original()
            if fail is not None:
                raise fail

        return close

    clients["a"].close = tracked("a", OSError("a: the socket is gone"))  # type: ignore[method-assign]
    clients["b"].close = tracked("b", RuntimeError("b: second failure"))  # type: ignore[method-assign]
    clients["c"].close = tracked("c")  # type: ignore[method-assign]
    store_close = store.close

    async def close_store(**kwargs: float) -> None:
        closed.append("store")
        await store_close(**kwargs)

    store.close = close_store  # type: ignore[method-assign]
    # the first failure, a's: the clients close in the order they were opened
    with pytest.raises(OSError, match="a: the socket is gone"):
        await resources.close()
    assert sorted(closed) == ["a", "b", "c", "store"]
    with pytest.raises(RuntimeError, match="not open"):
        _ = resources.store
    await resources.close()  # a second close has nothing left to do
    assert sorted(closed) == ["a", "b", "c", "store"]


async def test_borrowed_clients_and_store_are_left_open(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    async with BackendResources(settings) as owner:
        borrowed_store = owner.store
        borrowed = await owner.client("a")
        resources = BackendResources(settings, store=borrowed_store, clients={"a": borrowed})
        await resources.open()
        assert await resources.client("a") is borrowed
        await resources.close()
        # still usable: the owner closes them
        assert await borrowed_store.list_changes(after=0) == []
        assert borrowed.in_flight == 0
