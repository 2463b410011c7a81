"""latency-outlier's ``decide_pools`` equals the loop of its ``decide``, bit for bit: the same decisions
(bytes and fields set), diagnostics (bits), and states (nodes and emitted, in the same order; the
memory's arrays byte for byte), tick after tick with each form carrying its own state, on the bench
fleet, on perturbed fleets with hostile values, and on odd fleets (one pool, a pool of one node,
empty pools, pools gone stale, many new ids). The batch form's row cache is checked against the
dicts it stands for."""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from fleetloop.policies.base import FleetSnapshot, NodeView, PolicyContext, PolicyResult
from fleetloop.policies.breaker.emission import KEYFRAME_TICKS, Emitted, Fields, keyframe_residue, phase
from fleetloop.policies.breaker.latency_outlier import (
    LatencyOutlier,
    LatencyOutlierParams,
    State,
    row_cache,
    rows_of,
)
from fleetloop.policies.breaker.latency_outlier.rule import NodeState, PoolRows, pool_tick, quiet_tick
from tests.policies.snapshots import NOW_MS, node
from tests.policies.snapshots import snapshot as view_snapshot
from tests.support.bench_fleet import bench_snapshots
from tests.support.perturbed import perturbed_snapshots
from tests.unit.test_fast_breaker import EAGER, STREAKY

ALGO = LatencyOutlier()


def _bits(a: np.ndarray[Any, Any]) -> tuple[str, tuple[int, ...], bytes]:
    return (a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes())


def assert_same(a: PolicyResult[State], b: PolicyResult[State]) -> None:
    assert [d.model_dump_json() for d in a.decisions] == [d.model_dump_json() for d in b.decisions]
    assert [d.model_fields_set for d in a.decisions] == [d.model_fields_set for d in b.decisions]
    assert [(k, v.hex()) for k, v in a.diagnostics.items()] == [
        (k, v.hex()) for k, v in b.diagnostics.items()
    ]
    sa, sb = a.state, b.state
    assert sa.started == sb.started
    assert list(sa.nodes.items()) == list(sb.nodes.items())
    assert list(sa.emitted.items()) == list(sb.emitted.items())
    assert sa.memory.node_ids == sb.memory.node_ids
    assert _bits(sa.memory.ts) == _bits(sb.memory.ts)
    assert _bits(sa.memory.vals) == _bits(sb.memory.vals)
    assert sa == sb
    assert pickle.dumps(sa) == pickle.dumps(sb)
    rows = rows_of(sb)
    if rows is not None:  # the batch form's cache says what the dicts say
        assert rows == row_cache(sb.memory.node_ids, sb.nodes, sb.emitted)
        assert rows.ids is sb.memory.node_ids


def run_both(
    snaps: Iterable[FleetSnapshot],
    params: LatencyOutlierParams,
    *,
    batch_of: Any = None,
    alternate: bool = False,
    tick_ids: Sequence[int] | None = None,
) -> dict[str, int]:
    """Each tick: the loop of ``decide`` over the batch's pools and ``decide_pools`` on the same
    snapshot. ``batch_of(k, pools)`` picks the batch (default: every pool of the snapshot);
    ``alternate``: every third tick the batch side also goes through ``decide`` (its state then has
    no cache). ``tick_ids``: the ticks' ids (default consecutive). Returns how many decisions of each
    state were compared."""
    loop: dict[str, State] = {}
    batch: dict[str, State] = {}
    seen: dict[str, int] = {}
    for k, snap in enumerate(snaps):
        pools = sorted(snap.pools)
        if batch_of is not None:
            pools = batch_of(k, pools)
        ctxs = [
            PolicyContext(
                now_ms=snap.now_ms,
                tick_id=200 + k if tick_ids is None else tick_ids[k],
                tick_ms=1000,
                pool_id=p,
                seed=(k,),
            )
            for p in pools
        ]
        a = [ALGO.decide(snap, params, loop.get(c.pool_id, ALGO.initial_state()), c) for c in ctxs]
        states = [batch.get(c.pool_id, ALGO.initial_state()) for c in ctxs]
        if alternate and k % 3 == 2:
            b = [ALGO.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]
        else:
            b = ALGO.decide_pools(snap, params, states, ctxs)
        assert len(a) == len(b)
        for c, x, y in zip(ctxs, a, b, strict=True):
            assert_same(x, y)
            loop[c.pool_id] = x.state
            batch[c.pool_id] = y.state
            for d in x.decisions:
                key = f"{d.state}:{d.reason.split(':')[0]}"  # type: ignore[union-attr]
                seen[key] = seen.get(key, 0) + 1
    return seen


def bench_fleet(
    n_nodes: int, ticks: int, degraded_per_1000: float = 30.0, seed: int = 5
) -> Iterator[FleetSnapshot]:
    return bench_snapshots(n_nodes, ticks, seed=seed, degraded_per_1000=degraded_per_1000)


@pytest.mark.parametrize("params", [LatencyOutlierParams(), EAGER], ids=["default", "eager"])
def test_batch_equals_the_loop_on_the_bench_fleet(params: LatencyOutlierParams) -> None:
    seen = run_both(bench_fleet(1200, 45), params)
    assert seen.get("closed:healthy", 0) > 1000
    assert any(k.startswith("open:") for k in seen), seen  # the machines moved, not only healthy


@pytest.mark.parametrize(
    "params", [LatencyOutlierParams(), EAGER, STREAKY], ids=["default", "eager", "streaky"]
)
def test_batch_equals_the_loop_on_perturbed_fleets(params: LatencyOutlierParams) -> None:
    seen = run_both(perturbed_snapshots(320, 45), params)
    if params is EAGER:
        assert {"open:latency-outlier", "half_open:latency-probe", "open:consecutive-failures"} <= set(
            seen
        ), seen


def test_batch_equals_the_loop_across_ticks_not_decided() -> None:
    """Ticks 0-39, then 69 on: a record sent on tick 39 is exactly KEYFRAME_TICKS (30) ticks old on
    the next tick decided, and older ones are older still: both forms re-send them."""
    ids = [*range(40), *range(69, 109)]
    run_both(list(perturbed_snapshots(240, 80, seed=6)), EAGER, tick_ids=[1000 + t for t in ids])
    run_both(list(bench_fleet(600, 80)), LatencyOutlierParams(), tick_ids=[1000 + t for t in ids])

    # A node suspect on ticks 36-38 is healthy again on 39 (a change: sent), then not sent until the
    # next tick decided, 69, where its record is exactly 30 ticks old: sent again (unless keyframed).
    def suspect(k: int) -> list[NodeView]:
        views = _pool("s", 8, k)
        if 36 <= k <= 38:
            views[2] = node("s/2", pool_id="s", tbt_p50_ms=90.0, tbt_p99_ms=200.0, ttft_p99_ms=900.0)
        return views

    seen = run_both(
        _ticks(suspect, 50),
        LatencyOutlierParams(memory_ms=500, min_samples=1),
        tick_ids=[1000 + t for t in ids[:50]],
    )
    assert seen.get("closed:latency-suspect") == 1  # sent once (tick 36), unchanged on 37-38


def test_batch_equals_the_loop_on_batches_that_are_not_the_whole_fleet() -> None:
    """Every other pool, a rotating subset, and ticks decided per pool in between."""

    def every_other(k: int, pools: list[str]) -> list[str]:
        return pools[k % 2 :: 2]

    run_both(perturbed_snapshots(240, 30, seed=4), EAGER, batch_of=every_other)
    run_both(perturbed_snapshots(240, 30, seed=5), EAGER, alternate=True)


def _ticks(views_at: Any, n: int) -> list[FleetSnapshot]:
    return [view_snapshot(views_at(k), now_ms=NOW_MS + 1000 * k) for k in range(n)]


def _pool(pool_id: str, count: int, k: int, **over: Any) -> list[NodeView]:
    return [
        node(
            f"{pool_id}/{i}",
            pool_id=pool_id,
            tbt_p50_ms=10.0 + i % 3,
            tbt_p99_ms=20.0,
            ttft_p99_ms=300.0,
            **over,
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("params", [LatencyOutlierParams(), EAGER], ids=["default", "eager"])
def test_batch_equals_the_loop_on_odd_fleets(params: LatencyOutlierParams) -> None:
    # One pool; a pool of one node; a pool whose nodes all go stale, then come back.
    def odd(k: int) -> list[NodeView]:
        views = _pool("a", 5, k)
        views[2] = node(
            "a/2", pool_id="a", tbt_p50_ms=90.0 if k % 7 < 5 else 10.0, tbt_p99_ms=200.0, ttft_p99_ms=900.0
        )
        views += _pool("one", 1, k)
        views += _pool("gone", 4, k, stale=4 <= k < 9, consecutive_failures=6 if k % 5 == 0 else 0)
        return views

    run_both(_ticks(lambda k: _pool("solo", 6, k), 20), params)
    run_both(_ticks(odd, 30), params)


def test_batch_equals_the_loop_with_empty_pools_and_many_new_ids() -> None:
    from dataclasses import replace

    def churn(k: int) -> list[NodeView]:
        return [*_pool("steady", 8, k), *(node(f"new{k}/{i}", pool_id="churn") for i in range(3000))]

    snaps = []
    for k in range(4):
        s = view_snapshot(churn(k), now_ms=NOW_MS + 1000 * k)
        empty = replace(s.pools["steady"], pool_id="empty", node_ids=())
        snaps.append(
            FleetSnapshot(
                now_ms=s.now_ms, window_ms=s.window_ms, nodes=s.nodes, pools={**s.pools, "empty": empty},
                tenants=s.tenants, ledger=s.ledger,
            )
        )  # fmt: skip
    run_both(snaps, EAGER)


HOSTILE: Sequence[dict[str, Any]] = (
    {"tbt_p50_ms": 1e308, "tbt_p99_ms": 1e308, "ttft_p99_ms": 1e308},
    {"tbt_p50_ms": -0.0, "tbt_p99_ms": 0.0, "ttft_p99_ms": -0.0},
    {"tbt_p50_ms": 0.0, "tbt_p99_ms": None, "ttft_p99_ms": None},
    {"tbt_p50_ms": 5e-324, "tbt_p99_ms": 5e-324, "ttft_p99_ms": 1.0},
    {"consecutive_failures": 10**9, "failures_w": 10**9, "ok_w": 1},
)


def test_batch_equals_the_loop_on_hostile_values() -> None:
    """Values the schema accepts at their extremes, in pools whose other nodes are ordinary; a pool
    whose severity leaves the schema's bounds fails alone in both forms (the same error)."""

    def hostile(k: int) -> list[NodeView]:
        views: list[NodeView] = []
        for p, spec in enumerate(HOSTILE):
            pool = _pool(f"h{p}", 5, k)
            if k % 4 != 3:
                pool[k % 5] = node(f"h{p}/{k % 5}", pool_id=f"h{p}", **spec)
            views += pool
        return views

    far = NOW_MS + 10**12  # far-future event time
    snaps = [
        *_ticks(hostile, 24),
        view_snapshot(hostile(0), now_ms=far),
        view_snapshot(hostile(1), now_ms=far + 1),
    ]
    loop: dict[str, State] = {}
    batch: dict[str, State] = {}
    errors = 0
    for k, snap in enumerate(snaps):
        for p in sorted(snap.pools):  # pool by pool, so one pool's failure is seen alone
            c = PolicyContext(now_ms=snap.now_ms, tick_id=300 + k, tick_ms=1000, pool_id=p, seed=(k,))
            try:
                x = ALGO.decide(snap, EAGER, loop.get(p, ALGO.initial_state()), c)
            except ValueError as exc:
                with pytest.raises(type(exc)):
                    ALGO.decide_pools(snap, EAGER, [batch.get(p, ALGO.initial_state())], [c])
                errors += 1
                continue
            (y,) = ALGO.decide_pools(snap, EAGER, [batch.get(p, ALGO.initial_state())], [c])
            assert_same(x, y)
            loop[p], batch[p] = x.state, y.state
    # And the whole fleet in one batch where no pool fails.
    run_both(_ticks(lambda k: [v for v in hostile(k) if not v.pool_id.startswith(("h0", "h3"))], 24), EAGER)
    # The 1e308 and subnormal pools: their severity is capped at the schema's bound, so no pool's
    # tick is refused (both forms refused the 1e308 one before the cap).
    assert errors == 0


@pytest.mark.parametrize(("live", "healthy"), [(8, 8), (8, 3), (0, 0)], ids=["calm", "panic", "none-serving"])
def test_quiet_tick_is_pool_tick_on_trivial_rows_due_a_record(live: int, healthy: int) -> None:
    """The batch's shortcut for a quiet pool gives what the rule gives the same rows: trivial rows,
    each due a record (none before, another record before, its keyframe, a record too old)."""
    tick = 400
    ids = tuple(f"q-{i}" for i in range(8))
    residue = keyframe_residue(tick)
    key = next(i for i in (f"k-{j}" for j in range(1000)) if phase(i) == residue)
    not_key = next(i for i in (f"k-{j}" for j in range(1000)) if phase(i) != residue)
    ids = (*ids[:4], key, not_key)
    suspect: Fields = ("closed", True, 0.0, None, "latency-suspect", 0)
    before: dict[str, Emitted] = {
        ids[1]: (suspect, tick - 1),  # another record
        ids[2]: (("closed", True, 0.0, None, "healthy", 0), tick - KEYFRAME_TICKS),  # too old
        ids[3]: (("closed", True, 0.0, None, "healthy", 0), tick + 3),  # from a later tick
        key: (("closed", True, 0.0, None, "healthy", 0), tick - 1),  # its keyframe
        not_key: (suspect, tick - 2),
    }
    known = {i: NodeState(was_warm=True) for i in ids}
    rows = list(range(len(ids)))
    streak_f = [0.0, 1.0, 2.0, 0.0, 4.0, 3.0]
    severity_r = [0.0, 1.5, 0.25, 2.999999, 0.0, 1.0]
    pr = PoolRows(
        "pool-q", ids, rows, [0] * len(rows), [True] * len(rows), [True] * len(rows), [True] * len(rows),
        [int(x) for x in streak_f], streak_f, [0] * len(rows), [0] * len(rows), severity_r, severity_r,
        [False] * len(rows), [phase(i) for i in ids], live, healthy, 0.0, True,
    )  # fmt: skip
    params = LatencyOutlierParams()
    a = pool_tick(pr, known, before, [], started=True, now=NOW_MS, tick_id=tick, params=params)
    b = quiet_tick("pool-q", ids, rows, streak_f, severity_r, live, healthy, tick, params)
    assert len(a.decisions) == len(ids)  # every row was due one
    assert [d.model_dump_json() for d in a.decisions] == [d.model_dump_json() for d in b.decisions]
    assert [d.model_fields_set for d in a.decisions] == [d.model_fields_set for d in b.decisions]
    assert (a.nodes, a.latency_open, a.error_open, a.panic) == (
        b.nodes,
        b.latency_open,
        b.error_open,
        b.panic,
    )
    assert a.panic == (healthy < live / 2)
    assert list(a.emitted.items()) == list(b.emitted.items())
    assert pickle.dumps(a.emitted) == pickle.dumps(b.emitted)  # one tuple per record, as the rule makes
