"""The daemon's HTTP face on one port: ``/healthz``, ``/readyz``, ``/metrics``.

Binds to loopback unless told otherwise (``--http-host``). Answers are small JSON objects
(``/healthz``, ``/readyz``: 200 when true, 503 with the failing checks otherwise) and Prometheus
text (``/metrics``, rendered by ``prometheus_client`` from the OpenTelemetry Prometheus reader).
Handlers only read state; nothing here can stall the control loop for longer than one render.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from fleetloop.daemon import observability
from fleetloop.daemon.service.health import Health

DEFAULT_HOST = "127.0.0.1"


def _json(ok: bool, body: dict[str, Any]) -> web.Response:
    body = {"ok": ok, **body}
    return web.Response(
        body=orjson.dumps(body, option=orjson.OPT_SORT_KEYS),
        status=200 if ok else 503,
        content_type="application/json",
    )


def make_app(
    health: Callable[[], Health | None], extra: Callable[[web.Application], None] | None = None
) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        h = health()
        if h is None:  # alive, still starting (topics, broker probe): not ready, but no restart either
            return _json(True, {"state": "starting"})
        return _json(*h.live())

    async def readyz(_: web.Request) -> web.Response:
        h = health()
        if h is None:
            return _json(False, {"reason": "daemon not started"})
        return _json(*h.ready())

    async def metrics(_: web.Request) -> web.Response:
        text = generate_latest(observability.registry)
        resp = web.Response(body=text)
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    if extra is not None:
        extra(app)
    return app


class HttpServer:
    """``async with HttpServer(...)``: serving while inside; ``port`` is the bound port."""

    def __init__(self, app: web.Application, host: str = DEFAULT_HOST, port: int = 0) -> None:
        self._app = app
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        server = site._server
        if server is not None and self.port == 0:
            sockets = getattr(server, "sockets", None) or []
            if sockets:
                self.port = int(sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> HttpServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
