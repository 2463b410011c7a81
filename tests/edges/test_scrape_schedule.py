"""``fleetloop scrape``'s schedule: the targets' rounds spread over the interval, not one burst.

Real HTTP servers on loopback serve a vLLM page; the scrape loop runs against them with a producer
double (what is published is not the point here), and the servers record when each request came."""

from __future__ import annotations

import argparse
import asyncio
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from fleetloop import clock
from fleetloop.edges.scrape.command import Target, TargetStats, _scrape_target, scrape_offset_s
from fleetloop.edges.scrape.convert import Converter, NodeIdentity
from tests.support.http import Handler, nodes

PAGE = (Path(__file__).parent / "fixtures" / "vllm-0.33.0.1.prom").read_bytes()


@pytest.mark.parametrize(
    ("index", "n", "interval", "want"),
    [(0, 4, 1.0, 0.0), (1, 4, 1.0, 0.25), (3, 4, 2.0, 1.5), (0, 1, 1.0, 0.0), (5, 10, 0.5, 0.25)],
)
def test_offsets_spread_evenly_over_the_interval(index: int, n: int, interval: float, want: float) -> None:
    assert scrape_offset_s(index, n, interval) == pytest.approx(want)


def test_every_offset_falls_inside_one_interval() -> None:
    offsets = [scrape_offset_s(i, 1000, 1.0) for i in range(1000)]
    assert offsets == sorted(offsets)
    assert min(offsets) >= 0.0
    assert max(offsets) < 1.0


class _Producer:
    def __init__(self) -> None:
        self.sent = 0

    async def send(self, topic: str, value: bytes, key: bytes) -> None:
        self.sent += 1


def _recording(arrivals: dict[int, list[float]]) -> Callable[[str], Handler]:
    """Each stand-in node serves the vLLM page and records when each request came."""

    def answer(node_id: str) -> Handler:
        i = int(node_id.rsplit("/", 1)[1])

        async def metrics(request: web.Request) -> web.Response:
            arrivals.setdefault(i, []).append(clock.monotonic_s())
            return web.Response(body=PAGE, content_type="text/plain")

        return metrics

    return answer


async def test_targets_are_scraped_spread_over_the_interval_not_in_one_burst() -> None:
    """Four targets, a 0.8 s interval: each target's first request comes about 0.2 s after the one
    before (all four inside a few milliseconds before), and each keeps its own period."""
    n, interval = 4, 0.8
    arrivals: dict[int, list[float]] = {}
    args = argparse.Namespace(interval_s=interval, pool="p", runtime="vllm")
    stop = asyncio.Event()
    producer: Any = _Producer()
    async with nodes(n, _recording(arrivals)) as ports, httpx.AsyncClient(timeout=2.0) as http:
        urls = [f"http://127.0.0.1:{p}/metrics" for p in ports]
        stats = [
            TargetStats(Target(f"p/{i}", url), Converter("vllm", NodeIdentity(node_id=f"p/{i}", pool_id="p")))
            for i, url in enumerate(urls)
        ]
        tasks = [
            asyncio.create_task(
                _scrape_target(
                    s, http, producer, topic="t", args=args, stop=stop, err=_Quiet(),  # type: ignore[arg-type]
                    offset_s=scrape_offset_s(i, n, interval),
                )
            )
            for i, s in enumerate(stats)
        ]  # fmt: skip
        await asyncio.sleep(interval * 2.5)
        stop.set()
        await asyncio.gather(*tasks)
    firsts = [arrivals[i][0] for i in range(n)]
    gaps = [b - a for a, b in itertools.pairwise(firsts)]
    assert all(g > interval / n / 2 for g in gaps), gaps
    for i in range(n):  # each target on its own period after its offset
        times = arrivals[i]
        assert len(times) >= 2, (i, times)
        assert times[1] - times[0] == pytest.approx(interval, abs=0.15)
    assert all(s.scrapes_ok >= 2 for s in stats)


class _Quiet:
    def print(self, *args: object, **kwargs: object) -> None:
        pass
