"""What the facade and the reconciler share: a store and one RAPI client per backend.

A store or clients given to the constructor are borrowed (their owner closes them);
what is missing is opened on demand and closed with the object.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Self

from synnefo_ganeti.config import BackendSettings, Settings
from synnefo_ganeti.rapi import RapiClient
from synnefo_ganeti.store import Store

__all__ = ["BackendResources"]


class BackendResources:
    #: how the error of an unopened object names it
    _usage = "use it as 'async with ...'"

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        clients: Mapping[str, RapiClient] | None = None,
    ) -> None:
        self.settings = settings
        self._store = store
        self._own_store = store is None
        self._clients: dict[str, RapiClient] = dict(clients or {})
        self._own_clients: set[str] = set()
        self._client_lock = asyncio.Lock()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def open(self) -> None:
        if self._store is None:
            store = Store(self.settings.database.url)
            await store.open()
            self._store = store

    async def close(self) -> None:
        """Close the RAPI clients and the store this opened, each whether or not closing one
        before it failed (a client whose close raised left the store open, its writer's
        queue unflushed), in the order they were opened; the first failure is raised after."""
        failure: Exception | None = None
        for name in [name for name in self._clients if name in self._own_clients]:  # as opened
            client = self._clients.pop(name)
            self._own_clients.discard(name)
            try:
                await client.close()
            except Exception as exc:  # (the others are closed all the same)
                failure = failure or exc
        if self._own_store and self._store is not None:
            store, self._store = self._store, None
            try:
                await store.close()
            except Exception as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError(f"{type(self).__name__} is not open: {self._usage}")
        return self._store

    def _make_client(self, backend: BackendSettings) -> RapiClient:
        return backend.rapi_client()

    async def client(self, backend: str) -> RapiClient:
        """The pooled RAPI client of ``backend`` (opened on first use)."""
        async with self._client_lock:
            client = self._clients.get(backend)
            if client is None:
                client = self._make_client(self.settings.backend(backend))
                await client.__aenter__()
                self._clients[backend] = client
                self._own_clients.add(backend)
            return client
