"""A router's per-worker outcome counters -> RequestOutcomes: deltas, resets, unknown workers,
hostile values, the cap, gaps, and the scrape loop's handling of a page that fails."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from fleetloop.edges.actuate.worker_list.mapping import WorkerMap
from fleetloop.edges.actuate.worker_list.outcomes import (
    MAX_CALLS_PER_S,
    SGLANG_ROUTER,
    VLLM_ROUTER,
    OutcomeCounter,
    Translator,
)
from fleetloop.edges.actuate.worker_list.report import OutcomeReporter
from fleetloop.router.publish import PublisherStats
from fleetloop.schemas.requests import RequestOutcome
from tests.support.http import loopback

A, B, C = "http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003"
WMAP = WorkerMap({"chat": {"chat/0": A, "chat/1": B + "/"}, "code": {"code/0": C}})
METRIC = VLLM_ROUTER.metric


def page(counts: dict[tuple[str, str], float], metric: str = METRIC) -> dict[str, list[Any]]:
    return {metric: [({"worker": w, "outcome": o}, v) for (w, o), v in counts.items()]}


def translator(spec: OutcomeCounter = VLLM_ROUTER, **kw: Any) -> Translator:
    return Translator(spec, WMAP, model="llama-8b", run_id="r1", **kw)


def tally(out: list[RequestOutcome]) -> dict[tuple[str | None, str], int]:
    got: dict[tuple[str | None, str], int] = {}
    for o in out:
        got[o.node_id, o.outcome] = got.get((o.node_id, o.outcome), 0) + 1
    return got


def test_the_first_scrape_is_a_baseline_and_each_later_one_publishes_the_increase() -> None:
    t = translator()
    assert t.period(page({(A, "success"): 100, (A, "failure"): 7}), 10_000) == []
    out = t.period(page({(A, "success"): 103, (A, "failure"): 9, (B, "failure"): 4}), 11_000)
    # B's series is new since the baseline: the router made it at its first call, so it counts from 0
    assert tally(out) == {("chat/0", "ok"): 3, ("chat/0", "error"): 2, ("chat/1", "error"): 4}
    for o in out:
        assert o.pool_id == "chat"
        assert o.model == "llama-8b"
        assert 10_000 < o.ts_ms <= 11_000
        # unknown fields as a call without fleetloop's headers through HAProxy's log
        assert o.workflow_id == o.request_id
        assert o.step_index == 0
        assert o.attempt == 0
        assert o.tenant_id == "anonymous"
        assert o.priority == 1
        assert o.latency_budget_ms == 0
        assert o.ttft_ms is None
        assert o.e2e_ms == 0.0
        assert o.prompt_tokens == 0
        # a call of no named task is a task of its own: its success ends it, a failure leaves it open
        assert o.task_outcome == ("succeeded" if o.outcome == "ok" else None)
        assert o.cost_usd == 0.0
    assert len({o.request_id for o in out}) == len(out)
    assert t.period(page({(A, "success"): 103, (A, "failure"): 9, (B, "failure"): 4}), 12_000) == []
    assert t.stats.outcomes == 9
    assert t.stats.by_outcome == {"ok": 3, "error": 6}


def test_sglang_router_s_counter_reads_the_same() -> None:
    t = translator(SGLANG_ROUTER)
    t.period(page({}, SGLANG_ROUTER.metric), 0)
    out = t.period(page({(C, "failure"): 5}, SGLANG_ROUTER.metric), 1000)
    assert tally(out) == {("code/0", "error"): 5}
    assert {o.pool_id for o in out} == {"code"}
    assert out[0].request_id.startswith("sglang-router-r1-")


def test_a_worker_failing_every_call_makes_an_unbroken_run_and_a_mixed_one_spreads_its_errors() -> None:
    t = translator()
    t.period(page({}), 0)
    out = t.period(page({(A, "failure"): 12, (B, "success"): 90, (B, "failure"): 10}), 1000)
    a = [o.outcome for o in out if o.node_id == "chat/0"]
    b = [o.outcome for o in out if o.node_id == "chat/1"]
    assert a == ["error"] * 12
    assert b.count("error") == 10
    assert b.count("ok") == 90
    runs = "".join("e" if x == "error" else "." for x in b).split(".")
    assert max(len(r) for r in runs) == 1, "one error in ten is no streak"
    ts = [o.ts_ms for o in out if o.node_id == "chat/1"]
    assert ts == sorted(ts)
    assert ts[-1] == 1000


def test_a_counter_below_its_last_value_is_a_reset_not_negative_calls() -> None:
    t = translator()
    t.period(page({(A, "success"): 500, (A, "failure"): 40}), 0)
    out = t.period(page({(A, "success"): 3, (A, "failure"): 2}), 1000)  # the router restarted
    assert tally(out) == {("chat/0", "ok"): 3, ("chat/0", "error"): 2}
    assert t.stats.resets == 2
    assert tally(t.period(page({(A, "success"): 4, (A, "failure"): 2}), 2000)) == {("chat/0", "ok"): 1}


def test_a_worker_not_in_the_map_is_counted_and_never_published_under_a_node() -> None:
    t = translator()
    stranger = "http://127.0.0.1:9999"
    t.period(page({}), 0)
    out = t.period(page({(stranger, "failure"): 30, (A, "success"): 1}), 1000)
    assert tally(out) == {("chat/0", "ok"): 1}
    assert t.stats.unmapped_calls == 30
    assert t.stats.unmapped_workers == {stranger}
    # a trailing slash on either side is the same worker (the map names chat/1 with one)
    assert tally(t.period(page({(B, "failure"): 2}), 2000)) == {("chat/1", "error"): 2}


def test_an_outcome_label_it_does_not_know_is_counted_not_guessed() -> None:
    t = translator()
    t.period(page({}), 0)
    assert t.period(page({(A, "rejected"): 6}), 1000) == []
    assert t.stats.unread_calls == 6


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -5.0])
def test_a_hostile_value_is_skipped_and_the_last_good_one_kept(bad: float) -> None:
    t = translator()
    t.period(page({(A, "failure"): 10}), 0)
    assert t.period(page({(A, "failure"): bad}), 1000) == []
    assert t.stats.hostile == 1
    assert t.stats.resets == 0
    assert tally(t.period(page({(A, "failure"): 13}), 2000)) == {("chat/0", "error"): 3}


def test_series_past_the_cap_are_counted_as_hostile_not_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetloop.edges.actuate.worker_list import outcomes

    monkeypatch.setattr(outcomes, "MAX_SERIES", 3)
    t = translator()
    t.period(page({(A, "success"): 1, (A, "failure"): 1}), 0)
    many = {(f"http://127.0.0.1:{7000 + i}", "failure"): 5.0 for i in range(5)}
    out = t.period(page({(A, "failure"): 2, **many}), 1000)
    assert tally(out) == {("chat/0", "error"): 1}
    assert t.stats.unmapped_calls == 5  # the first new series fits under the cap, the others do not
    assert t.stats.hostile == 4


def test_a_huge_jump_is_capped_per_second_of_the_period_keeping_the_outcomes_shares() -> None:
    t = translator()
    t.period(page({(A, "success"): 0, (A, "failure"): 0}), 0)
    out = t.period(page({(A, "success"): 3e12, (A, "failure"): 1e12}), 2000)
    cap = int(2 * MAX_CALLS_PER_S)
    assert len(out) == cap
    assert tally(out) == {("chat/0", "ok"): cap * 3 // 4, ("chat/0", "error"): cap // 4}
    assert t.stats.capped == int(4e12) - cap


def test_calls_counted_across_a_gap_are_not_published_as_a_burst() -> None:
    t = translator(max_gap_s=10.0)
    t.period(page({(A, "failure"): 1}), 0)
    assert t.period(page({(A, "failure"): 51}), 30_000) == []  # the scrapes between failed
    assert t.stats.stale_calls == 50
    assert tally(t.period(page({(A, "failure"): 53}), 31_000)) == {("chat/0", "error"): 2}


def test_a_clock_stepped_back_counts_the_period_s_calls_rather_than_losing_them() -> None:
    t = translator()
    t.period(page({(A, "failure"): 1}), 5000)
    assert t.period(page({(A, "failure"): 4}), 4000) == []
    assert t.stats.stale_calls == 3
    assert tally(t.period(page({(A, "failure"): 5}), 5000)) == {("chat/0", "error"): 1}


class Sink:
    """The publisher's ``publish`` and ``stats`` (this is not Kafka's test: what is handed to it)."""

    def __init__(self) -> None:
        self.got: list[RequestOutcome] = []
        self.stats = PublisherStats()

    def publish(self, o: RequestOutcome) -> bool:
        self.got.append(o)
        self.stats.queued += 1
        return True


@contextlib.asynccontextmanager
async def serve(text: dict[str, Any]) -> AsyncIterator[str]:
    """A router's ``/metrics`` on loopback answering ``text["status"]`` with ``text["body"]`` (read
    at each request): its URL."""

    async def metrics(request: web.Request) -> web.Response:
        if text["status"] != 200:
            return web.Response(status=text["status"], text="down")
        return web.Response(text=text["body"])

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with loopback(app) as port:
        yield f"http://127.0.0.1:{port}/metrics"


def exposition(failures: int) -> str:
    return (
        "# TYPE vllm_router_cb_outcomes_total counter\n"
        f'vllm_router_cb_outcomes_total{{worker="{A}",outcome="failure"}} {failures}\n'
    )


async def test_a_failing_scrape_publishes_nothing_and_is_logged_once_per_episode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state: dict[str, Any] = {"status": 200, "body": exposition(5)}
    log = logging.getLogger("test.outcomes")
    now = [0]
    async with serve(state) as url:
        sink = Sink()
        rep = OutcomeReporter(url, translator(), sink, period_s=0.1, now_ms=lambda: now[0], log=log)
        await rep.start()
        with caplog.at_level(logging.INFO, logger="test.outcomes"):
            for status, body in (
                (500, ""),
                (500, ""),
                (200, "# nothing of the router's\nup 1\n"),
                (200, exposition(8)),
            ):
                state["status"], state["body"] = status, body
                now[0] += 1000
                await rep.once()
            state["status"] = 503
            await rep.once()
            await rep.close()
        assert [o.outcome for o in sink.got] == ["error"] * 3
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 2, errors  # one per episode, not one per failed scrape
        assert "HTTP 500" in errors[0]
        assert "HTTP 503" in errors[1]
        back = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
        assert back == [f"metrics: {url} answers again after 3 failed scrape(s)"]


async def test_a_page_past_the_size_cap_is_refused_unparsed(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetloop.edges.actuate.worker_list import report
    from fleetloop.edges.actuate.worker_list.report import MetricsError

    monkeypatch.setattr(report, "MAX_PAGE_BYTES", 1000)
    async with serve({"status": 200, "body": exposition(1) + "# padding\n" * 200}) as url:
        log = logging.getLogger("t")
        rep = OutcomeReporter(url, translator(), Sink(), period_s=1.0, now_ms=lambda: 0, log=log)
        with pytest.raises(MetricsError, match="a page over 1000 bytes"):
            await rep.start()
        await rep.close()


async def test_a_page_that_is_not_the_router_s_is_refused_at_start() -> None:
    from fleetloop.edges.actuate.worker_list.report import MetricsError

    async with serve({"status": 200, "body": "smg_worker_health 1\n"}) as url:
        rep = OutcomeReporter(
            url, translator(), Sink(), period_s=1.0, now_ms=lambda: 0, log=logging.getLogger("t")
        )
        with pytest.raises(MetricsError, match=r"no vllm_router_\* metric on the page"):
            await rep.start()
        await rep.close()


def test_an_unmapped_worker_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        stranger = "http://127.0.0.1:9999"
        state: dict[str, Any] = {"status": 200, "body": exposition(0)}
        async with serve(state) as url:
            rep = OutcomeReporter(
                url, translator(), Sink(), period_s=1.0, now_ms=lambda: 0, log=logging.getLogger("t.u")
            )
            await rep.start()
            for n in (3, 4, 9):
                state["body"] = (
                    exposition(0)
                    + f'vllm_router_cb_outcomes_total{{worker="{stranger}",outcome="failure"}} {n}\n'
                )
                rep.now_ms = lambda n=n: n * 1000  # type: ignore[misc]
                await rep.once()
            await rep.close()

    with caplog.at_level(logging.WARNING, logger="t.u"):
        asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records if "not in the worker map" in r.getMessage()]
    assert lines == [
        "metrics: worker http://127.0.0.1:9999 is not in the worker map: its calls are counted, not published"
    ]
