"""A metrics page past the size cap is refused while it is read, never buffered whole: the router
outcome reporter and ``fleetloop scrape`` read through one capped reader
(:func:`fleetloop.edges.scrape.page.read_page`). Loopback servers stream a page far past the cap in
small timed chunks, or declare a length past it and hold the rest back; the cap is patched small.

The two readers part on an error status, which is why each opens its own stream: ``fleetloop
scrape`` refuses the status before reading a byte of the body (a failure, not a parse error), the
reporter reads the body (capped) to quote it in its error."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from fleetloop.edges.actuate.worker_list import report
from fleetloop.edges.actuate.worker_list.report import MetricsError, OutcomeReporter
from fleetloop.edges.scrape import command
from fleetloop.edges.scrape.command import Target, TargetStats, _scrape_once
from fleetloop.edges.scrape.convert import Converter, NodeIdentity
from tests.edges.test_worker_list_outcomes import Sink, serve, translator
from tests.support.http import loopback

CAP = 1000
CHUNK = b"# padding\n" * 50  # 500 bytes: the third chunk passes the cap
CHUNKS = 40  # 20 KB, one chunk every 20 ms: 0.8 s for a reader that reads it all


class Page:
    """A ``/metrics`` that streams ``CHUNKS`` chunks (``sent`` counts those written), or with
    ``declared`` sends that ``Content-Length`` and one chunk, and holds the rest until ``release``;
    answering ``status``."""

    def __init__(self, declared: int | None = None, status: int = 200) -> None:
        self.declared = declared
        self.status = status
        self.sent = 0
        self.release = asyncio.Event()

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=self.status, headers={"Content-Type": "text/plain"})
        if self.declared is not None:
            resp.content_length = self.declared
        await resp.prepare(request)
        try:
            if self.declared is not None:
                await resp.write(CHUNK)
                await asyncio.wait_for(self.release.wait(), 5.0)
                return resp
            for _ in range(CHUNKS):
                await resp.write(CHUNK)
                self.sent += 1
                await asyncio.sleep(0.02)
            await resp.write_eof()
        except (ConnectionError, TimeoutError):  # the reader went away (as it should)
            pass
        return resp

    @contextlib.asynccontextmanager
    async def served(self) -> AsyncIterator[str]:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        async with loopback(app) as port:
            try:
                yield f"http://127.0.0.1:{port}/metrics"
            finally:
                self.release.set()


def reporter(url: str) -> OutcomeReporter:
    return OutcomeReporter(
        url, translator(), Sink(), period_s=1.0, now_ms=lambda: 0, log=logging.getLogger("t")
    )


async def test_the_router_page_streamed_past_the_cap_is_refused_once_the_cap_is_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(report, "MAX_PAGE_BYTES", CAP)
    page = Page()
    async with page.served() as url:
        rep = reporter(url)
        with pytest.raises(MetricsError, match=f"^vllm-router metrics at {url}: a page over {CAP} bytes$"):
            await rep.start()
        sent = page.sent
        await rep.close()
    # three chunks pass the cap; a reader that buffered the body first would have had all of them
    assert sent < CHUNKS // 4, sent


async def test_the_router_page_declaring_a_length_past_the_cap_is_refused_before_its_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused at the header: a reader that waited for the body would time out instead (the server
    holds it back)."""
    monkeypatch.setattr(report, "MAX_PAGE_BYTES", CAP)
    async with Page(declared=CAP + 1).served() as url:
        rep = reporter(url)
        with pytest.raises(MetricsError, match=f"a page over {CAP} bytes \\(Content-Length {CAP + 1}\\)$"):
            await rep.start()
        await rep.close()


async def test_the_scrape_commands_page_past_the_cap_is_a_parse_error_and_read_no_further(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(command, "MAX_PAGE_BYTES", CAP)
    page = Page()
    producer: Any = None  # never reached: nothing is published for a refused page
    async with page.served() as url, httpx.AsyncClient(timeout=2.0) as http:
        s = TargetStats(Target("p/0", url), Converter("vllm", NodeIdentity(node_id="p/0", pool_id="p")))
        error = await _scrape_once(s, http, producer, "t", b"p")
        sent = page.sent
    assert error == f"a page over {CAP} bytes"
    assert (s.parse_errors, s.failures, s.scrapes_ok) == (1, 0, 0)
    assert sent < CHUNKS // 4, sent


async def test_the_scrape_command_refuses_an_error_status_before_reading_its_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 503 whose body would pass the cap: a failure of the target, said by its status, and the
    body not read (read first, it would be a page too large, counted as a parse error)."""
    monkeypatch.setattr(command, "MAX_PAGE_BYTES", CAP)
    page = Page(status=503)
    producer: Any = None  # never reached
    async with page.served() as url, httpx.AsyncClient(timeout=2.0) as http:
        s = TargetStats(Target("p/0", url), Converter("vllm", NodeIdentity(node_id="p/0", pool_id="p")))
        error = await _scrape_once(s, http, producer, "t", b"p")
        sent = page.sent
    assert error == "HTTPStatusError: HTTP 503"
    assert (s.parse_errors, s.failures, s.scrapes_ok) == (0, 1, 0)
    assert sent < CHUNKS // 4, sent


async def test_the_router_reporter_quotes_an_error_pages_body() -> None:
    async with serve({"status": 503}) as url:
        rep = reporter(url)
        with pytest.raises(MetricsError) as refused:
            await rep.start()
        await rep.close()
    assert str(refused.value) == f"vllm-router metrics at {url}: HTTP 503 'down'"
