"""The decide tick's fast paths give what their plain definitions give, bit for bit.

Each hot path (memory pruning, per-node medians, the inlined cache-aware score, decisions assembled
without validation, the lazily seeded generator) is checked here against the straightforward form
it replaced, on random inputs: replay compares decisions byte for byte, so "about the same" is a
failure.
"""

from __future__ import annotations

import statistics
import zlib
from typing import Any

import numpy as np
import orjson
import pytest
from fleetloop.core.checkpoint import CheckpointError, decode, encode
from fleetloop.core.decide.engine import Engine
from fleetloop.policies.base import NodeView
from fleetloop.policies.breaker.latency_outlier import SIGNALS, State, breaker_decision
from fleetloop.policies.columns import fleet_columns
from fleetloop.policies.memory import PoolMemory, kept_slots
from fleetloop.policies.routing import cache_aware
from fleetloop.policies.routing.cache_aware import CacheAwareParams, routing_decision
from fleetloop.schemas.control import Tick
from fleetloop.schemas.decisions import BreakerDecision, Decision, RoutingDecision
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from tests.oracles import cache_aware as ca_oracle
from tests.oracles.cache_aware import combine, components
from tests.oracles.latency_outlier import _remembered, advance, aggregate
from tests.policies.snapshots import NOW_MS, POOL, ctx, node, snapshot
from tests.support.policies import foundation

figure = st.none() | st.floats(min_value=0.0, max_value=1e6, allow_nan=False)


@st.composite
def memories(draw: Any) -> tuple[tuple[tuple[int, Any, Any, Any, Any], ...], int]:
    """An ascending memory (as the breaker keeps it) and a tick time, possibly one decided again."""
    gaps = draw(st.lists(st.integers(min_value=1, max_value=4000), max_size=30))
    ts, obs = NOW_MS - 40_000, []
    for g in gaps:
        ts += g
        obs.append((ts, draw(figure), draw(figure), draw(figure), draw(figure)))
    now = draw(st.sampled_from([NOW_MS, ts, ts + 1, NOW_MS - 5_000]))
    return tuple(obs), now


@settings(max_examples=300, deadline=None)
@given(
    memories(),
    st.integers(min_value=0, max_value=60_000),
    st.fixed_dictionaries(dict.fromkeys(SIGNALS, figure)),
    st.sampled_from(["warm", "cold"]),
    st.booleans(),
)
def test_breaker_memory_slice_is_the_filter_it_replaced(
    mem: Any, memory_ms: int, figures: dict[str, Any], weights_state: str, stale: bool
) -> None:
    obs, now = mem
    n = node("a", weights_state=weights_state, stale=stale, **figures)
    kept = [o for o in obs if now - o[0] < memory_ms and o[0] < now]
    vals = [v if weights_state == "warm" and not stale else None for v in (figures[s] for s in SIGNALS)]
    if any(v is not None for v in vals):
        kept.append((now, *vals))
    assert _remembered(obs, n, now, memory_ms) == tuple(kept)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.integers(min_value=-(2**62), max_value=2**62) | st.integers(min_value=-3, max_value=40),
        max_size=12,
    ),
    st.integers(min_value=-(2**40), max_value=2**40) | st.integers(min_value=-2, max_value=40),
    st.integers(min_value=0, max_value=600_000) | st.integers(min_value=0, max_value=42),
)
def test_kept_slots_is_the_five_operation_mask(ts: list[int], now: int, memory_ms: int) -> None:
    """The memories' forgetting mask, where its two-comparison form is taken and where it is not
    (a negative ``now``, ``now - memory_ms`` below -1), equals the rule as ``advance`` states it."""
    a = np.array(ts, dtype=np.int64).reshape(-1, 1)
    expected = (a >= 0) & (now - a < memory_ms) & (a < now)
    assert np.array_equal(kept_slots(a, now, memory_ms), expected)


@settings(max_examples=300, deadline=None)
@given(memories(), st.integers(min_value=1, max_value=5))
def test_breaker_medians_are_statistics_median(mem: Any, min_samples: int) -> None:
    obs, _ = mem
    expected = {}
    for i, s in enumerate(SIGNALS):
        xs = [o[i + 1] for o in obs if o[i + 1] is not None]
        if xs and len(xs) >= min_samples:
            expected[s] = statistics.median(xs)
    assert aggregate(obs, min_samples) == expected


pool_tick = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.fixed_dictionaries(dict.fromkeys(SIGNALS, figure)),
        st.sampled_from(["warm", "warm", "warm", "cold"]),
        st.booleans(),
    ),
    max_size=5,
    unique_by=lambda t: t[0],
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(min_value=-3_000, max_value=4_000), pool_tick), max_size=25),
    st.integers(min_value=0, max_value=12_000),
    st.integers(min_value=1, max_value=4),
)
def test_breaker_pool_memory_is_the_per_node_memory_it_replaced(
    ticks: list[tuple[int, list[Any]]], memory_ms: int, min_samples: int
) -> None:
    """Tick after tick (nodes joining and leaving, ticks decided again or going back in time), the
    pool's array memory holds exactly the figures the per-node form keeps, and its medians are
    :func:`aggregate`'s, bit for bit; a checkpoint of it decodes to an equal memory."""
    plain: dict[str, Any] = {}
    mem = PoolMemory.empty(len(SIGNALS))
    now = NOW_MS
    for step, members in ticks:
        now += step
        pool = tuple(
            node(i, weights_state=w, stale=stale, **f)
            for i, f, w, stale in sorted(members, key=lambda m: m[0])
        )
        plain = {n.node_id: _remembered(plain.get(n.node_id, ()), n, now, memory_ms) for n in pool}
        mem = advance(mem, pool, now, memory_ms)
        assert mem.node_ids == tuple(n.node_id for n in pool)
        assert mem.figures() == {k: v for k, v in plain.items() if v}
        meds, oks = mem.medians(min_samples)
        for n, med, ok in zip(pool, meds, oks, strict=True):
            got = {s: m for s, m, y in zip(SIGNALS, med, ok, strict=True) if y}
            want = aggregate(plain[n.node_id], min_samples)
            assert got == want
            assert [v.hex() for v in got.values()] == [float(v).hex() for v in want.values()]
    state = State(started=True, memory=mem)
    assert decode(encode(state)) == state


loads = st.fixed_dictionaries(
    {
        "queue_depth": st.integers(min_value=0, max_value=500),
        "running_requests": st.integers(min_value=0, max_value=256),
        "queued_prompt_tokens": st.integers(min_value=0, max_value=200_000),
        "max_batch_tokens": st.integers(min_value=0, max_value=65_536),
        "kv_cache_used_frac": st.floats(min_value=0.0, max_value=1.0),
        "hbm_free_gib": st.floats(min_value=0.0, max_value=100.0),
        "tbt_p50_ms": st.none() | st.floats(min_value=0.5, max_value=5000.0),
        "weights_state": st.sampled_from(["warm", "warm", "warm", "loading"]),
        "draining": st.booleans(),
        "age_ms": st.sampled_from([0, 1000, 4000]),
    }
)
weights = st.floats(min_value=0.0, max_value=100.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(loads, min_size=1, max_size=12), weights, weights, weights, weights)
def test_cache_aware_score_is_combine_of_components(
    rows: list[dict[str, Any]], wq: float, wk: float, wh: float, ws: float
) -> None:
    params = CacheAwareParams(w_queue=max(wq, 0.1), w_kv=wk, w_hbm=wh, w_speed=ws)
    pool = tuple(node(f"n{i:02d}", **r) for i, r in enumerate(rows))
    snap = snapshot(pool)
    memory = ca_oracle.remember({}, snap, params, pool)
    steps = {n.node_id: ca_oracle.step_ms(memory, n.node_id) for n in pool}
    scores, speeds = ca_oracle.scored(pool, params, steps)
    for n in pool:
        parts = components(n, pool, params, memory)
        assert speeds[n.node_id] == parts["speed"]
        expected = combine(parts, params) if ca_oracle.serving(n, params.silent_after_ms) else 0.0
        assert scores[n.node_id] == expected
    # The product's scorers, array operations over the pool's rows, give the same doubles (hex
    # compares the bits; -0.0 would differ too).
    cols = fleet_columns(snap)
    ids = tuple(n.node_id for n in pool)
    rows = slice(*cols.bounds[POOL])
    mem = cache_aware.remember_rows(PoolMemory.empty(1), snap.now_ms, params, ids, cols=cols, rows=rows)
    col_scores, col_speeds = cache_aware.pool_scores(snap, ids, params, mem, cols=cols, rows=rows)
    assert [v.hex() for v in col_scores.values()] == [v.hex() for v in scores.values()]
    assert [v.hex() for v in col_speeds.values()] == [v.hex() for v in speeds.values()]
    assert list(col_scores) == list(scores)


step_tick = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d"]),
        st.none() | st.floats(min_value=0.0, max_value=5000.0),
        st.sampled_from(["warm", "warm", "cold"]),
        st.booleans(),
    ),
    max_size=4,
    unique_by=lambda t: t[0],
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(min_value=-3_000, max_value=4_000), step_tick), max_size=25),
    st.integers(min_value=0, max_value=12_000),
)
def test_cache_aware_pool_memory_is_the_per_node_memory_it_replaced(
    ticks: list[tuple[int, list[Any]]], memory_ms: int
) -> None:
    """Tick after tick, the pool's step-time array holds what the oracle's ``remember`` keeps and
    gives its ``step_ms``'s medians, bit for bit; the per-node form of an older
    checkpoint converts to the same memory."""
    params = CacheAwareParams(speed_memory_ms=memory_ms)
    plain: Any = {}
    mem: Any = {}
    now = NOW_MS
    for step, members in ticks:
        now += step
        pool = tuple(
            node(i, tbt_p50_ms=t, weights_state=w, stale=stale) for i, t, w, stale in sorted(members)
        )
        plain = ca_oracle.remember(plain, snapshot(pool, now_ms=now), params, pool)
        mem = ca_oracle.remember_pool(mem, now, params, pool)
        assert mem.figures() == plain
        assert cache_aware.as_memory(plain).figures() == plain
        steps = ca_oracle.pool_steps(mem)
        for n in pool:
            want = ca_oracle.step_ms(plain, n.node_id)
            got = steps[n.node_id]
            assert got == want
            assert got is None or got.hex() == float(want or 0).hex()


def _same(a: Any, b: Any) -> None:
    assert a.model_dump_json() == b.model_dump_json()
    assert a.model_fields_set == b.model_fields_set
    assert a == b


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"enforced": False},
        {"enforced": True, "until_ms": NOW_MS + 30_000},
        {"probe_frac": 0.05},
    ],
)
def test_breaker_decision_assembled_equals_validated(extra: dict[str, Any]) -> None:
    inputs = {"consecutive_failures": 2.0, "severity": 1.5, "latency_ejections": 1.0}
    fast = breaker_decision("p", "p/n1", "open", "latency-outlier", inputs=inputs, ejections=3, **extra)
    slow = BreakerDecision(
        entity="node/p/n1",
        reason="latency-outlier",
        inputs=inputs,
        pool_id="p",
        node_id="p/n1",
        state="open",
        ejections=3,
        **extra,
    )
    _same(fast, slow)
    _same(fast.model_copy(update={"enforced": False}), slow.model_copy(update={"enforced": False}))


@pytest.mark.parametrize("severity", [float("inf"), float("nan"), 2e15])
def test_breaker_decision_out_of_bounds_is_still_refused(severity: float) -> None:
    with pytest.raises(ValidationError):
        breaker_decision("p", "p/n1", "closed", "healthy", inputs={"severity": severity}, ejections=0)


def test_routing_decision_assembled_equals_validated_and_refuses_what_validation_refuses() -> None:
    args: tuple[Any, ...] = (
        "p",
        {"a": 0.25, "b": 0.75},
        "cache-aware",
        {"nodes": 2.0, "best_score": 0.9},
        {"0": {"a": 0.0, "b": 1.0}},
        {"d1": ("b", "a")},
        ("q", "r"),
    )
    slow = RoutingDecision(
        entity="pool/p",
        pool_id="p",
        weights=args[1],
        reason=args[2],
        inputs=args[3],
        by_priority=args[4],
        prefix_affinity=args[5],
        spill_to=args[6],
    )
    _same(routing_decision(*args), slow)
    for bad in ({"a": float("nan")}, {"a": -0.5}):
        with pytest.raises(ValidationError):
            routing_decision("p", bad, *args[2:])


def test_engine_decisions_equal_validated_wrappers_and_the_lazy_generator_is_the_seeded_one() -> None:
    views = [node(f"n{i}", tbt_p50_ms=20.0 + i, ok_w=3) for i in range(4)]
    snap = snapshot(views)
    result = Engine(foundation()).tick(
        snap, Tick(ts_ms=NOW_MS, tick_id=7, pool_id="p"), {"fleet.telemetry#0": 12}
    )
    assert result.decisions
    for d in result.decisions:
        _same(d, Decision.model_validate(d.model_dump()))
    c = ctx(snap, tick_id=7, seed=3)
    assert c.rng is c.rng  # one generator per context, built on first use
    assert c.rng.random() == np.random.default_rng([3, 7]).random()


def test_node_view_fixture_is_a_serving_node() -> None:
    n: NodeView = node("a")
    assert ca_oracle.serving(n, 3000)


def test_breaker_state_from_before_the_pool_memory_is_refused_with_its_reason() -> None:
    """A checkpoint whose latency-outlier nodes still carry their own memory list (the layout before
    :class:`PoolMemory`) is refused with a one-line reason naming the class; the shard starts fresh."""
    old_node = {
        "$o": "fleetloop.policies.breaker.latency_outlier:NodeState",
        "f": {
            "err": None, "lat": "closed", "lat_since_ms": 0, "lat_ejections": 0, "flagged_ticks": 0,
            "ramp_from_ms": None, "was_warm": True, "obs": {"$t": []},
        },
    }  # fmt: skip
    old = zlib.compress(orjson.dumps({"format": 1, "v": old_node}))  # as an older fleetloop wrote it
    with pytest.raises(CheckpointError, match=r"latency_outlier:NodeState fields changed: \['obs'\]"):
        decode(old)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            loads,
            st.lists(st.sampled_from(["p1", "p2", "p3", "p4"]), max_size=4),
            st.integers(min_value=0, max_value=2),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_cache_aware_prefix_map_is_the_per_digest_sort_it_replaced(rows: list[Any]) -> None:
    """Holders visited best first give each digest's holders in the order a per-digest sort by
    (score descending, node id) gives (duplicate digests on a node included)."""
    params = CacheAwareParams()
    pool = tuple(
        node(f"n{i:02d}", hot_prefixes=tuple(h), consecutive_failures=f, **r)
        for i, (r, h, f) in enumerate(rows)
    )
    snap = snapshot(pool)
    result = cache_aware.CacheAware().decide(snap, params, PoolMemory.empty(1), ctx(snap))
    (d,) = result.decisions
    assert isinstance(d, RoutingDecision)
    steps = ca_oracle.pool_steps(result.state)
    scores, speeds = ca_oracle.scored(pool, params, steps)
    best = max(scores.values(), default=0.0)
    holders: dict[str, list[str]] = {}
    for n in pool:
        s = scores[n.node_id]
        if n.consecutive_failures > 0 or s <= 0 or s < params.affinity_keep_frac * best:
            continue
        if speeds[n.node_id] < params.affinity_min_speed:
            continue
        for digest in n.hot_prefixes:
            holders.setdefault(digest, []).append(n.node_id)
    want = {k: tuple(sorted(v, key=lambda i: (-scores[i], i))) for k, v in sorted(holders.items())}
    assert d.prefix_affinity == want
