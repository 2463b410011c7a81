"""Stand-in serving nodes for the router tests: real HTTP servers on loopback, one per node, that
say which node answered. They are the backends behind a real proxy or router, not a proxy."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A loopback port free right now (TCP, or UDP with ``socket.SOCK_DGRAM``)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


@contextlib.asynccontextmanager
async def nodes(n: int, answer: Callable[[str], Handler]) -> AsyncIterator[list[int]]:
    """``n`` servers, node ``chat/{i}`` on the i-th port: ``GET /health`` says ok, every other
    request is answered by ``answer("chat/{i}")``. Yields the ports; stops every server after."""
    runners: list[web.AppRunner] = []
    ports: list[int] = []
    try:
        for i in range(n):
            app = web.Application()
            app.router.add_get("/health", _ok)
            app.router.add_route("*", "/{tail:.*}", answer(f"chat/{i}"))
            runner = web.AppRunner(app, access_log=None)
            runners.append(runner)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            ports.append(int(site._server.sockets[0].getsockname()[1]))  # type: ignore[union-attr]
        yield ports
    finally:
        for r in runners:
            await r.cleanup()
