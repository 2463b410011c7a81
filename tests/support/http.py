"""Stand-in serving nodes for the router tests: real HTTP servers on loopback, one per node, that
say which node answered. They are the backends behind a real proxy or router, not a proxy.
:func:`loopback` serves any test's own app the same way (a stand-in router, a metrics page)."""

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
async def loopback(app: web.Application) -> AsyncIterator[int]:
    """``app`` served on a free loopback port (no access log): yields the port; stops it after."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def nodes(n: int, answer: Callable[[str], Handler]) -> AsyncIterator[list[int]]:
    """``n`` servers, node ``chat/{i}`` on the i-th port: ``GET /health`` says ok, every other
    request is answered by ``answer("chat/{i}")``. Yields the ports; stops every server after."""
    async with contextlib.AsyncExitStack() as servers:
        ports: list[int] = []
        for i in range(n):
            app = web.Application()
            app.router.add_get("/health", _ok)
            app.router.add_route("*", "/{tail:.*}", answer(f"chat/{i}"))
            ports.append(await servers.enter_async_context(loopback(app)))
        yield ports
