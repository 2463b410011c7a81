"""Scrape a router's Prometheus page every period and publish what its outcome counters counted.

The I/O around :class:`~fleetloop.edges.actuate.worker_list.outcomes.Translator`: ``GET`` the
page, read it (:func:`fleetloop.edges.scrape.convert.parse_exposition`, the reader ``fleetloop
scrape`` uses), translate, hand each record to the :class:`~fleetloop.router.publish.OutcomePublisher`
(never blocking: a full queue drops and counts). A scrape that fails (unreachable, an error status,
a page that is not the router's) publishes nothing: no data is not "all ok", and the daemon reads a
missing outcome as missing. It is logged once when the episode starts and once when it ends, with
the number of scrapes it lasted; the calls counted meanwhile come with the next good scrape when
the gap was short, else they are counted as stale (:mod:`.outcomes`). Every 10 s, when anything
changed, one line says what was published and what was not, and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

import httpx

from fleetloop.edges.actuate.worker_list.outcomes import Samples, Translator
from fleetloop.edges.scrape.convert import ExpositionError, parse_exposition
from fleetloop.edges.scrape.page import MAX_PAGE_BYTES, PageTooLarge, read_page
from fleetloop.router.publish import PublisherStats
from fleetloop.schemas.requests import RequestOutcome

REPORT_S = 10.0


class MetricsError(Exception):
    """The router's metrics page could not be read (one line)."""


async def scrape(client: httpx.AsyncClient, url: str, router: str, prefix: str) -> Samples:
    """The page at ``url`` read; :class:`MetricsError` when it does not answer 200 with ``router``'s
    metrics (Prometheus text holding a sample named ``prefix...``). The page is read as a stream and
    refused as soon as it passes ``MAX_PAGE_BYTES`` (:func:`~fleetloop.edges.scrape.page.read_page`,
    as ``fleetloop scrape`` reads its pages)."""
    try:
        async with client.stream("GET", url) as r:
            text = await read_page(r, MAX_PAGE_BYTES)
    except httpx.HTTPError as exc:
        raise MetricsError(f"{router} metrics at {url}: {exc or type(exc).__name__}") from None
    except PageTooLarge as exc:
        raise MetricsError(f"{router} metrics at {url}: {exc}") from None
    if r.status_code != 200:
        raise MetricsError(f"{router} metrics at {url}: HTTP {r.status_code} {text[:200]!r}")
    try:
        samples = parse_exposition(text).samples
    except ExpositionError as exc:
        raise MetricsError(f"{router} metrics at {url}: {exc}") from None
    if not any(name.startswith(prefix) for name in samples):
        raise MetricsError(f"{router} metrics at {url}: no {prefix}* metric on the page (not {router}'s?)")
    return samples


class Publisher(Protocol):
    """What the reporter uses of :class:`~fleetloop.router.publish.OutcomePublisher`."""

    stats: PublisherStats

    def publish(self, outcome: RequestOutcome) -> bool: ...


class OutcomeReporter:
    """``await start()`` (the baseline scrape; :class:`MetricsError` when it fails), then
    ``await run(stop)``."""

    def __init__(
        self,
        url: str,
        translator: Translator,
        publisher: Publisher,
        *,
        period_s: float,
        now_ms: Callable[[], int],
        log: logging.Logger,
        timeout_s: float = 5.0,
    ) -> None:
        self.url, self.translator, self.publisher = url, translator, publisher
        self.period_s, self.now_ms, self.log = period_s, now_ms, log
        self._client = httpx.AsyncClient(timeout=min(timeout_s, max(period_s, 1.0)))
        self.failed_scrapes = 0  # in the current episode
        self.scrapes = 0
        self._logged_unmapped: set[str] = set()

    async def _scrape(self) -> Samples:
        spec = self.translator.spec
        return await scrape(self._client, self.url, spec.router, spec.prefix)

    async def start(self) -> None:
        """The first scrape: the baseline (nothing published)."""
        self.translator.period(await self._scrape(), self.now_ms())
        self.scrapes += 1

    async def close(self) -> None:
        await self._client.aclose()

    async def once(self) -> None:
        """One scrape, translated and published (or the failure noted)."""
        try:
            samples = await self._scrape()
        except MetricsError as exc:
            if not self.failed_scrapes:
                self.log.error("metrics: %s; publishing no outcomes until it answers", exc)
            self.failed_scrapes += 1
            return
        if self.failed_scrapes:
            self.log.warning(
                "metrics: %s answers again after %d failed scrape(s)", self.url, self.failed_scrapes
            )
            self.failed_scrapes = 0
        self.scrapes += 1
        for o in self.translator.period(samples, self.now_ms()):
            self.publisher.publish(o)
        new = self.translator.stats.unmapped_workers - self._logged_unmapped
        for worker in sorted(new):
            self.log.warning(
                "metrics: worker %s is not in the worker map: its calls are counted, not published", worker
            )
        self._logged_unmapped |= new

    def summary(self) -> tuple[int, ...]:
        st, ps = self.translator.stats, self.publisher.stats
        return (st.outcomes, st.resets, st.unmapped_calls, st.unread_calls, st.hostile, st.capped,
                st.stale_calls, ps.sent, ps.dropped, ps.failed)  # fmt: skip

    def report(self) -> None:
        st, ps = self.translator.stats, self.publisher.stats
        by = ", ".join(f"{k} {v}" for k, v in sorted(st.by_outcome.items())) or "none"
        self.log.info(
            "outcomes: %d translated (%s) from %d scrapes; published %d, dropped %d, failed %d; not "
            "published: %d calls of unmapped workers, %d of unknown outcome labels, %d capped, %d in "
            "gaps; %d counter resets, %d hostile values",
            st.outcomes, by, self.scrapes, ps.sent, ps.dropped, ps.failed, st.unmapped_calls,
            st.unread_calls, st.capped, st.stale_calls, st.resets, st.hostile,
        )  # fmt: skip

    async def run(self, stop: asyncio.Event) -> None:
        """Scrape every ``period_s`` until ``stop``; a summary line every 10 s when anything changed."""
        loop = asyncio.get_running_loop()
        next_report = loop.time() + REPORT_S
        last: tuple[int, ...] | None = None
        try:
            while not stop.is_set():
                await self.once()
                if loop.time() >= next_report:
                    next_report = loop.time() + REPORT_S
                    if (now := self.summary()) != last:
                        self.report()
                        last = now
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.period_s)
        finally:
            self.report()
            await self.close()
