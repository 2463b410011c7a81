"""latency-outlier: robust latency outliers and consecutive errors eject; backoff, probes, slow start,
the ejected-share cap and the panic threshold."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from fleetloop.policies.base import NodeView
from fleetloop.policies.breaker.latency_outlier import (
    LatencyOutlier,
    LatencyOutlierParams,
    State,
    backoff_ms,
)
from fleetloop.schemas.decisions import BreakerDecision
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from tests.policies.snapshots import NOW_MS, by_node, ctx, node, snapshot

HEALTHY = {"tbt_p50_ms": 20.0, "tbt_p99_ms": 40.0, "ttft_p99_ms": 300.0, "ttft_mean_ms_w": 150.0}
SLOW = {"tbt_p50_ms": 160.0, "tbt_p99_ms": 320.0, "ttft_p99_ms": 2400.0, "ttft_mean_ms_w": 1200.0}


class Run:
    """Drives the breaker tick by tick (one second apart) and keeps its state. ``step`` returns the
    newest record per node, as a router holds it (records are change-only)."""

    def __init__(self, **params: Any) -> None:
        self.algo = LatencyOutlier()
        self.params = LatencyOutlierParams(**params)
        self.state: State = self.algo.initial_state()
        self.tick = 0
        self.held: dict[str, BreakerDecision] = {}

    def step(self, views: list[NodeView], now_ms: int | None = None) -> dict[str, BreakerDecision]:
        self.tick += 1
        now = now_ms if now_ms is not None else NOW_MS + self.tick * 1000
        snap = snapshot(views, now_ms=now)
        result = self.algo.decide(snap, self.params, self.state, ctx(snap, tick_id=self.tick))
        self.state = result.state
        self.held.update(by_node(result))
        return dict(self.held)

    def steps(self, views: list[NodeView], n: int) -> dict[str, BreakerDecision]:
        out: dict[str, BreakerDecision] = {}
        for _ in range(n):
            out = self.step(views)
        return out


def pool(slow: tuple[str, ...] = (), count: int = 6, **extra: Any) -> list[NodeView]:
    return [
        node(f"n{i}", **{**(SLOW if f"n{i}" in slow else HEALTHY), **extra.get(f"n{i}", {})})
        for i in range(count)
    ]


def test_degraded_gpu_ejected_after_detect_ticks_not_before() -> None:
    run = Run(detect_ticks=3)
    views = pool(slow=("n2",))
    first = run.steps(views, 2)  # figures: 2 samples by the 2nd tick, flagged once so far
    assert first["n2"].state == "closed"
    assert first["n2"].reason == "latency-suspect"
    d = run.steps(views, 2)
    assert d["n2"].state == "open"
    assert d["n2"].enforced
    assert d["n2"].until_ms is not None
    assert {n: x.state for n, x in d.items() if n != "n2"} == dict.fromkeys(
        ["n0", "n1", "n3", "n4", "n5"], "closed"
    )


def test_default_persistence_is_ten_ticks() -> None:
    run = Run()
    views = pool(slow=("n2",))
    assert run.steps(views, 10)["n2"].state == "closed"
    assert run.step(views)["n2"].state == "open"


def test_queueing_alone_does_not_eject() -> None:
    # First tokens far slower (a queue), steps as fast as the peers': not a slow GPU.
    queued = {"ttft_p99_ms": 9000.0, "ttft_mean_ms_w": 6000.0}
    run = Run(detect_ticks=1)
    d = run.steps(pool(n3=queued), 5)
    assert all(x.state == "closed" for x in d.values())


def test_a_long_prefill_does_not_eject_within_detect_ticks() -> None:
    run = Run()
    busy = pool(slow=("n1",))
    d = run.steps(busy, 8)
    assert d["n1"].state == "closed"
    d = run.steps(pool(), 30)  # the prefill ended; the suspicion resets
    assert d["n1"].state == "closed"
    assert d["n1"].reason == "healthy"


def test_too_few_hosts_no_latency_verdict() -> None:
    run = Run(detect_ticks=1)
    d = run.steps(pool(slow=("n1",), count=2), 5)
    assert d["n1"].state == "closed"


def test_small_absolute_gaps_are_ignored() -> None:
    # 4x the median but only 6 ms slower: under the TBT floor.
    tiny = {"tbt_p50_ms": 2.0, "tbt_p99_ms": 2.0, "ttft_p99_ms": 30.0, "ttft_mean_ms_w": 30.0}
    odd = {"tbt_p50_ms": 8.0, "tbt_p99_ms": 8.0, "ttft_p99_ms": 30.0, "ttft_mean_ms_w": 30.0}
    views = [node(f"n{i}", **(odd if i == 0 else tiny)) for i in range(5)]
    d = Run(detect_ticks=1).steps(views, 5)
    assert d["n0"].state == "closed"


def test_consecutive_errors_still_eject() -> None:
    run = Run()
    d = run.step(pool(n4={"consecutive_failures": 5}))
    assert d["n4"].state == "open"
    assert d["n4"].reason == "consecutive-failures"
    assert d["n4"].until_ms == NOW_MS + 1000 + 30_000


def _survivors(**n0: Any) -> list[NodeView]:
    """Sixteen survivors of a mass preemption, each serving at its peers' speed with a full batch
    and a queue; n0's queued calls (the lost nodes' calls it took) are the first to time out:
    nine in a row, while its batch went on completing calls in the window. The others' timeouts
    are yet to come, so the pool-wide rule reads n0 as failing alone."""
    busy = {"queue_depth": 40, "running_requests": 250, "kv_cache_used_frac": 0.95}
    busy |= {"requests_w": 40, "ok_w": 40}
    first = {"requests_w": 40, "ok_w": 31, "failures_w": 9, "consecutive_failures": 9, "node_timeouts_w": 9}
    return pool(count=16, **{f"n{i}": busy for i in range(1, 16)}, n0={**busy, **first, **n0})


def _after_serving(views: list[NodeView]) -> dict[str, BreakerDecision]:
    """The breaker's records at the tick of ``views``, after two ticks of the same pool serving
    without a failure (the step times it remembers: ``min_samples``)."""
    run = Run()
    run.steps([replace(v, failures_w=0, consecutive_failures=0, node_timeouts_w=0) for v in views], 2)
    return run.step(views)


def test_a_survivor_whose_queued_calls_time_out_is_not_ejected() -> None:
    d = _after_serving(_survivors())
    assert d["n0"].state == "open"  # the error machine saw the streak
    assert not d["n0"].enforced
    assert d["n0"].reason == "consecutive-failures:queueing"


@pytest.mark.parametrize(
    "n0",
    [
        {"node_timeouts_w": 0},  # its calls were refused (a crashed host, a fast-error black hole)
        {"ok_w": 0, "requests_w": 9},  # no call completes: a black hole that swallows them
        {"node_errors_w": 2},  # it fails calls itself
        {"tbt_p50_ms": 160.0, "tbt_p99_ms": 320.0},  # a degraded GPU: slow steps against its peers
        {"stale": True},  # stopped reporting
    ],
)
def test_a_streak_that_is_the_nodes_own_still_ejects(n0: dict[str, Any]) -> None:
    d = _after_serving(_survivors(**n0))
    assert (d["n0"].state, d["n0"].enforced) == ("open", True), d["n0"].reason
    assert d["n0"].reason == "consecutive-failures"


def test_a_streak_on_a_node_without_a_step_time_still_ejects() -> None:
    """Nothing says its steps run at its peers' speed (a hung engine reports none)."""
    d = Run().step(_survivors(tbt_p50_ms=None, tbt_p99_ms=None))
    assert (d["n0"].state, d["n0"].enforced, d["n0"].reason) == ("open", True, "consecutive-failures")


def test_backoff_probe_relapse_and_recovery_with_slow_start() -> None:
    run = Run(detect_ticks=1, slow_start_ms=20_000, slow_start_min_frac=0.25)
    views = pool(slow=("n2",))
    run.steps(views, 2)
    opened_at = NOW_MS + 2000
    assert run.step(views)["n2"].state == "open"
    # The ejected node gets no traffic, reports no figures; 30 s later it is probed.
    quiet = pool(n2=dict.fromkeys(SLOW))
    d = {}
    while run.tick * 1000 + NOW_MS < opened_at + 30_000:
        d = run.step(quiet)
    assert d["n2"].state == "half_open"
    assert d["n2"].probe_frac == 0.05
    # Still slow under probe traffic: open again, backoff doubled.
    run.step(views)
    d = run.step(views)
    assert d["n2"].state == "open"
    assert d["n2"].reason in {"latency-probe-failed", "latency-ejected"}
    assert d["n2"].inputs["latency_ejections"] == 2.0
    assert backoff_ms(run.params, 2) == 60_000
    reopened = run.tick * 1000 + NOW_MS
    while run.tick * 1000 + NOW_MS < reopened + 61_000:
        d = run.step(quiet)
    assert d["n2"].state == "half_open"
    # Healthy under probe: after probe_min_ms it comes back on a ramp to its fair share (1/6).
    for _ in range(10):
        d = run.step(pool())
    assert d["n2"].state == "half_open"
    assert d["n2"].reason == "slow-start"
    start = d["n2"].probe_frac
    assert 0.25 / 6 <= start <= 0.35 / 6
    d = run.steps(pool(), 10)
    assert start < d["n2"].probe_frac < 1 / 6
    d = run.steps(pool(), 11)
    assert d["n2"].state == "closed"


def test_newly_warm_node_ramps_but_nodes_warm_at_start_do_not() -> None:
    run = Run()
    views = pool(n5={"weights_state": "loading"})
    d = run.step(views)
    assert all(x.state == "closed" for x in d.values())
    d = run.step(pool())
    assert d["n5"].state == "half_open"
    assert d["n5"].reason == "slow-start"
    assert d["n0"].state == "closed"


def test_ejected_share_is_capped_most_severe_first() -> None:
    run = Run(detect_ticks=1, max_ejected_frac=0.34)
    worse = {**SLOW, "tbt_p50_ms": 400.0}
    d = run.steps(pool(slow=("n1", "n2"), count=7, n2=worse), 2)
    # cap = floor(0.34 * 7) = 2: both fit
    assert (d["n1"].state, d["n2"].state) == ("open", "open")
    run = Run(detect_ticks=1, max_ejected_frac=0.2)
    d = run.steps(pool(slow=("n1", "n2"), count=7, n2=worse), 2)
    # cap = 1: n2 (the more severe) is ejected, n1 detected only
    assert (d["n2"].state, d["n2"].enforced) == ("open", True)
    assert (d["n1"].state, d["n1"].enforced) == ("open", False)
    assert d["n1"].reason.endswith(":max-ejected")


def test_panic_threshold_turns_latency_ejections_into_detections() -> None:
    run = Run(detect_ticks=1, max_ejected_frac=1.0)
    failing = {"consecutive_failures": 9}
    views = pool(slow=("n4",), count=5, n0=failing, n1=failing)
    d = run.steps(views, 3)
    # 2 error-ejected + 1 outlier of 5: healthy 2/5 < 0.5, so the latency ejection is not enforced
    assert d["n0"].state == "open"
    assert d["n0"].enforced
    assert d["n4"].state == "open"
    assert not d["n4"].enforced
    assert d["n4"].reason.endswith(":panic")


def test_param_validation() -> None:
    with pytest.raises(ValidationError):
        LatencyOutlierParams(base_ejection_ms=60_000, max_ejection_ms=30_000)
    with pytest.raises(ValidationError):
        LatencyOutlierParams(probe_min_ms=70_000, probe_max_ms=60_000)
    with pytest.raises(ValidationError):
        LatencyOutlierParams(ratio=1.0)


figures = st.fixed_dictionaries(
    {
        "tbt_p50_ms": st.none() | st.floats(min_value=1.0, max_value=5000.0),
        "tbt_p99_ms": st.none() | st.floats(min_value=1.0, max_value=5000.0),
        "ttft_p99_ms": st.none() | st.floats(min_value=1.0, max_value=60_000.0),
        "ttft_mean_ms_w": st.none() | st.floats(min_value=1.0, max_value=60_000.0),
        "consecutive_failures": st.integers(min_value=0, max_value=8),
        "weights_state": st.sampled_from(["warm", "warm", "warm", "loading"]),
    }
)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(figures, min_size=3, max_size=10), min_size=1, max_size=6))
def test_property_cap_probe_bounds_and_idempotence(ticks: list[list[dict[str, Any]]]) -> None:
    run = Run(detect_ticks=1)
    width = min(len(t) for t in ticks)
    for specs in ticks:
        views = [node(f"n{i}", **s) for i, s in enumerate(specs[:width])]
        snap = snapshot(views, now_ms=NOW_MS + (run.tick + 1) * 1000)
        c = ctx(snap, tick_id=run.tick + 1)
        before = run.state
        again = run.algo.decide(snap, run.params, before, c)
        emitted = run.algo.decide(snap, run.params, before, c)
        d = run.step(views, now_ms=snap.now_ms)
        assert again == emitted  # same tick, same answer
        assert {n: d[n] for n in by_node(again)} == by_node(again)
        for x in d.values():
            assert 0.0 <= x.probe_frac <= 0.5
            if x.state != "half_open":
                assert x.probe_frac == 0.0
        latency_open = [
            n for n, x in d.items() if x.state == "open" and x.enforced and x.reason.startswith("latency")
        ]
        assert len(latency_open) <= int(0.34 * width + 1e-9) or any(
            x.reason == "consecutive-failures" for x in d.values()
        )
