"""tbt-feedback: the batch-token cap halves when TBT nears its SLO and climbs back with headroom."""

from __future__ import annotations

import pytest
from fleetloop.policies.batching.tbt_feedback import (
    TbtFeedback,
    TbtFeedbackParams,
    next_cap,
    pool_tbt_ms,
)
from fleetloop.policies.slo import Slo, SloBook
from fleetloop.schemas.decisions import BatchingDecision, BreakerDecision
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from tests.policies.snapshots import ctx, node, snapshot

P = TbtFeedbackParams()  # tighten at >= 0.8 x SLO, relax at <= 0.5 x SLO
# The TBT SLO comes from the policy's classes (spec.slo) through the context, no longer from params:
# 80 ms here, so tighten at >= 64 ms and relax at <= 40 ms.
TBT_SLO = 80.0
BOOK = SloBook(default=Slo(1500.0, TBT_SLO))


@pytest.mark.parametrize(
    ("cap", "tbt", "expected"),
    [
        (8192, 100.0, (4096, "tbt-near-slo")),
        (8192, 64.0, (4096, "tbt-near-slo")),  # exactly at tighten_at
        (1024, 500.0, (512, "tbt-near-slo")),
        (512, 500.0, (512, "tbt-near-slo")),  # floor
        (700, 500.0, (512, "tbt-near-slo")),  # floor(350) clamps up
        (2048, 50.0, (2048, "hold")),
        (2048, 40.0, (2560, "tbt-headroom")),  # exactly at relax_below
        (8000, 10.0, (8192, "tbt-headroom")),  # ceiling
        (8192, 10.0, (8192, "tbt-headroom")),
        (2048, None, (2048, "no-data")),
        (100_000, None, (8192, "no-data")),  # an out-of-bounds state is clamped
    ],
)
def test_next_cap_table(cap: int, tbt: float | None, expected: tuple[int, str]) -> None:
    assert next_cap(P, cap, tbt, TBT_SLO) == expected


def test_pool_tbt_is_upper_median_of_warm_fresh_unejected_nodes() -> None:
    snap = snapshot(
        [
            node("a", tbt_p99_ms=10.0),
            node("b", tbt_p99_ms=30.0),
            node("c", tbt_p99_ms=20.0),
            node("d", tbt_p99_ms=900.0),  # degraded, but one of five: the median ignores it
            node("e", tbt_p99_ms=25.0),
            node("f", tbt_p99_ms=5000.0, stale=True),
            node("g", tbt_p99_ms=5000.0, weights_state="loading"),
            node("h", tbt_p99_ms=5000.0),  # ejected below
            node("i", tbt_p99_ms=None),
            node("x", pool_id="q", tbt_p99_ms=5000.0),
        ]
    )
    ejected = {"h": BreakerDecision(entity="node/h", reason="r", pool_id="p", node_id="h", state="open")}
    assert pool_tbt_ms(snap, ctx(snap, breakers=ejected)) == 25.0
    even = snapshot([node("a", tbt_p99_ms=10.0), node("b", tbt_p99_ms=30.0)])
    assert pool_tbt_ms(even, ctx(even)) == 30.0  # upper median: conservative
    assert pool_tbt_ms(snapshot([node("a")]), ctx(snapshot([node("a")]))) is None


def test_decide_walks_the_cap_down_then_up() -> None:
    algo = TbtFeedback()
    hot = snapshot([node("a", tbt_p99_ms=300.0), node("b", tbt_p99_ms=300.0)])
    cool = snapshot([node("a", tbt_p99_ms=20.0), node("b", tbt_p99_ms=20.0)])
    state = algo.initial_state()
    caps = []
    for snap in [hot, hot, hot, cool, cool]:
        res = algo.decide(snap, P, state, ctx(snap, slo=BOOK))
        (d,) = res.decisions
        assert isinstance(d, BatchingDecision)
        assert d.pool_id == "p"
        assert d.entity == "pool/p"
        state = res.state
        caps.append((d.max_batch_tokens, d.reason))
    assert caps == [
        (1024, "tbt-near-slo"),
        (512, "tbt-near-slo"),
        (512, "tbt-near-slo"),
        (1024, "tbt-headroom"),
        (1536, "tbt-headroom"),
    ]


def test_decision_inputs_explain() -> None:
    snap = snapshot([node("a", tbt_p99_ms=72.0)])
    (d,) = TbtFeedback().decide(snap, P, 4096, ctx(snap, slo=BOOK)).decisions
    assert d.inputs == {
        "previous_max_batch_tokens": 4096.0,
        "tbt_slo_ms": 80.0,
        "tbt_p99_ms": 72.0,
        "tbt_pressure": 0.9,
    }


def test_param_bounds() -> None:
    with pytest.raises(ValidationError):
        TbtFeedbackParams(relax_below=0.9, tighten_at=0.8)
    with pytest.raises(ValidationError):
        TbtFeedbackParams(initial_tokens=16384)  # above max_tokens
    with pytest.raises(ValidationError):
        TbtFeedbackParams(min_tokens=128)


caps = st.integers(min_value=0, max_value=2_000_000)
tbts = st.none() | st.floats(min_value=0.0, max_value=100_000.0, allow_nan=False)


@given(caps, tbts)
def test_cap_always_within_bounds(cap: int, tbt: float | None) -> None:
    new, _ = next_cap(P, cap, tbt, TBT_SLO)
    assert P.min_tokens <= new <= P.max_tokens


@given(caps, st.floats(0.0, 10_000.0), st.floats(0.0, 10_000.0))
def test_cap_monotone_non_increasing_in_tbt(cap: int, t1: float, t2: float) -> None:
    lo, hi = sorted((t1, t2))
    assert next_cap(P, cap, hi, TBT_SLO)[0] <= next_cap(P, cap, lo, TBT_SLO)[0]


@given(st.integers(512, 8192), st.floats(0.0, 1000.0))
def test_idempotent_for_the_same_tick(cap: int, tbt: float) -> None:
    snap = snapshot([node("a", tbt_p99_ms=tbt)])
    a = TbtFeedback().decide(snap, P, cap, ctx(snap))
    b = TbtFeedback().decide(snap, P, cap, ctx(snap))
    assert a.decisions == b.decisions
    assert a.state == b.state
