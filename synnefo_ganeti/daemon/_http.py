"""The daemon's embedded HTTP server: ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz``.

``/healthz`` answers 200 while the process's event loop runs (a liveness probe);
``/readyz`` answers 200 when every readiness check passes and 503 with the failing
ones otherwise (e.g. "database reachable", "at least one backend up"); ``/metrics``
serves :data:`synnefo_ganeti.metrics.REGISTRY` (and any other registry given).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Self

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from synnefo_ganeti.metrics import REGISTRY

__all__ = ["ReadinessCheck", "StatusServer"]

log = logging.getLogger("synnefo_ganeti.daemon")

#: a named check: returns None when fine, else what is wrong (a short sentence)
ReadinessCheck = Callable[[], Awaitable[str | None]]


class StatusServer:
    """``async with StatusServer(port=9110, checks={...}) as server:`` serves until the block ends."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 9110,
        checks: dict[str, ReadinessCheck] | None = None,
        registries: Sequence[CollectorRegistry] = (REGISTRY,),
        check_timeout: float = 5.0,
        setup: Sequence[Callable[[web.Application], None]] = (),
    ) -> None:
        self.host = host
        self.port = port
        self.checks = dict(checks or {})
        self.registries = list(registries)
        self.check_timeout = check_timeout
        #: called with the application before it starts: more routes on the same port (the console)
        self.setup = list(setup)
        self._runner: web.AppRunner | None = None

    def __repr__(self) -> str:
        return f"<StatusServer http://{self.host}:{self.port}>"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        for hook in self.setup:
            hook(app)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(
                exc.errno, f"cannot serve /metrics on {self.host}:{self.port}: {exc.strerror}"
            ) from None
        if self.port == 0 and runner.addresses:
            self.port = int(runner.addresses[0][1])
        self._runner = runner
        log.info("serving /metrics, /healthz and /readyz on %s", self.url)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        body = b"".join(generate_latest(registry) for registry in self.registries)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        async def run(name: str, check: ReadinessCheck) -> tuple[str, str | None]:
            try:
                async with asyncio.timeout(self.check_timeout):
                    return name, await check()
            except TimeoutError:
                return name, f"no answer within {self.check_timeout:g} s"
            except Exception as exc:
                return name, f"{type(exc).__name__}: {exc}"

        results = await asyncio.gather(*(run(name, check) for name, check in self.checks.items()))
        failing = {name: problem for name, problem in results if problem is not None}
        status = 503 if failing else 200
        return web.json_response(
            {
                "status": "not ready" if failing else "ready",
                "failing": failing,
                "checks": sorted(self.checks),
            },
            status=status,
        )
