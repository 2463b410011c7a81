"""The latency-outlier breaker's columnar decide equals its per-node statement (the oracle,
``tests/oracles/latency_outlier.py``): the same decisions (bytes), states and diagnostics, tick after
tick, on generated fleets whose nodes join, leave, go cold, drain, go silent, slow down and fail,
under the default parameters and under parameters that eject often; and its array verdicts and
references are the oracle's per node."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fleetloop.policies.base import PolicyContext
from fleetloop.policies.breaker.latency_outlier import (
    SIGNALS,
    LatencyOutlier,
    LatencyOutlierParams,
    State,
    Verdict,
)
from fleetloop.policies.breaker.latency_outlier.signals import (
    STATUS,
    Limits,
    Verdicts,
    limits_rows,
    verdict_rows,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.oracles import latency_outlier as oracle
from tests.oracles.latency_outlier import _judge, limits, reference
from tests.policies.snapshots import node
from tests.support.perturbed import perturbed_snapshots

EAGER = LatencyOutlierParams(
    ratio=1.5, k=0.0, tbt_floor_frac=0.0, ttft_floor_frac=0.0, min_samples=1, detect_ticks=1,
    base_ejection_ms=2_000, max_ejection_ms=8_000, probe_min_ms=1_000, probe_max_ms=3_000,
    slow_start_ms=4_000, max_ejected_frac=0.6, panic_threshold=0.3, error_threshold=2,
    forgive_after_ms=6_000, error_forgive_after_ms=5_000,
)  # fmt: skip


def state_bits(state: State) -> Any:
    return (state.started, dict(state.nodes), state.memory.figures(), dict(state.emitted))


STREAKY = LatencyOutlierParams(ratio=1.5, k=0.5, min_samples=1, detect_ticks=3, max_ejected_frac=0.1)


def verdict_columns(
    agg: Any, *, now_figures: Any, serve: Any, timed_out: Any, lims: Any, tbt_floor: float, ttft_floor: float
) -> Verdicts:
    """:func:`verdict_rows` of one pool whose limits are the oracle's per-signal ``lims``."""
    n = len(agg)
    has = np.array([[s in lims for s in SIGNALS]] * n, dtype=np.bool_).reshape(n, len(SIGNALS))

    def part(i: int) -> Any:
        return np.array([[lims[s][i] if s in lims else 0.0 for s in SIGNALS]] * n).reshape(n, len(SIGNALS))

    return verdict_rows(
        agg, now_figures, serve, timed_out, Limits(has, part(0), part(1), part(2)), tbt_floor, ttft_floor
    )


@pytest.mark.parametrize(
    "params", [LatencyOutlierParams(), EAGER, STREAKY], ids=["default", "eager", "streaky"]
)
def test_columnar_breaker_decides_as_the_per_node_form(params: LatencyOutlierParams) -> None:
    algo = LatencyOutlier()
    fast: dict[str, State] = {}
    plain: dict[str, State] = {}
    seen: set[str] = set()
    for k, snap in enumerate(perturbed_snapshots(320, 45)):
        for pool_id in sorted(snap.pools):
            ctx = PolicyContext(now_ms=snap.now_ms, tick_id=k, tick_ms=1000, pool_id=pool_id, seed=(k,))
            a = algo.decide(snap, params, fast.get(pool_id, algo.initial_state()), ctx)
            b = oracle.decide(snap, params, plain.get(pool_id, algo.initial_state()), ctx)
            assert [d.model_dump_json() for d in a.decisions] == [d.model_dump_json() for d in b.decisions]
            assert [d.model_fields_set for d in a.decisions] == [d.model_fields_set for d in b.decisions]
            assert {k: v.hex() for k, v in a.diagnostics.items()} == {
                k: v.hex() for k, v in b.diagnostics.items()
            }
            assert state_bits(a.state) == state_bits(b.state)
            fast[pool_id], plain[pool_id] = a.state, b.state
            seen.update(f"{d.state}:{d.reason.split(':')[0]}" for d in a.decisions)  # type: ignore[union-attr]
    # The run went through the machines' states, not only "closed, healthy".
    wanted = {"closed:healthy", "half_open:slow-start"}
    if params is EAGER:
        wanted |= {
            "open:latency-outlier",
            "open:latency-ejected",
            "half_open:latency-probe",
            "open:consecutive-failures",
        }
    assert wanted <= seen, sorted(seen)


# Figures on a coarse grid, so a node's value often sits exactly on a bound (x == ratio * m, x - m ==
# floor): the comparisons' edges are where a fast form drifts first.
grid = st.none() | st.sampled_from([0.0, -0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 9.0, 10.0, 12.0, 30.0])
four = st.lists(grid, min_size=4, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(four, four, st.booleans(), st.integers(0, 2)), min_size=1, max_size=12
    ),
    st.sampled_from([1.5, 2.0, 3.0]),
    st.sampled_from([0.0, 1.0, 3.0]),
    st.sampled_from([0.0, 1.0, 2.0]),
)  # fmt: skip
def test_verdict_columns_are_judge_per_node(rows: list[Any], ratio: float, k: float, floor: float) -> None:
    params = LatencyOutlierParams(ratio=ratio, k=k, min_hosts=2)
    agg = np.array([[np.nan if v is None else v for v in a] for a, _, _, _ in rows])
    now = np.array([[np.nan if v is None else v for v in f] for _, f, _, _ in rows])
    serve = np.array([s for _, _, s, _ in rows])
    timed_out = np.array([t == 2 for *_, t in rows])
    aggs = [{s: v for s, v in zip(SIGNALS, a, strict=True) if v is not None} for a, _, _, _ in rows]
    refs = {
        s: reference([a[s] for a, ok in zip(aggs, serve, strict=True) if ok and s in a], 2) for s in SIGNALS
    }
    lims = limits(refs, params)
    tbt, ttft, sev, _ = verdict_columns(
        agg, now_figures=now, serve=serve, timed_out=timed_out, lims=lims, tbt_floor=floor, ttft_floor=floor
    )
    for i, (_, f, ok, t) in enumerate(rows):
        view = node(
            f"n{i}", tbt_p50_ms=f[0], tbt_p99_ms=f[1], ttft_mean_ms_w=None if t == 2 else 1.0,
            node_timeouts_w=1 if t else 0,
        )  # fmt: skip
        want = _judge(view, aggs[i], lims, floor, floor) if ok else Verdict("nodata", "nodata", 0.0)
        assert (STATUS[tbt[i]], STATUS[ttft[i]], sev[i].hex()) == (want.tbt, want.ttft, want.severity.hex())


@settings(max_examples=300, deadline=None)
@given(st.lists(four, max_size=12), st.integers(2, 4))
def test_limits_are_reference_per_signal(rows: list[list[float | None]], min_hosts: int) -> None:
    """A pool's limits (median, ``ratio * m``, ``m + k * 1.4826 * MAD``, on every row) are the
    oracle's, from its median and MAD of each signal's values."""
    params = LatencyOutlierParams(min_hosts=min_hosts, ratio=2.5, k=1.5)
    agg = np.array([[np.nan if v is None else v for v in r] for r in rows]).reshape(len(rows), 4)
    refs = {s: reference([r[j] for r in rows if r[j] is not None], min_hosts) for j, s in enumerate(SIGNALS)}
    want = limits(refs, params)
    got = limits_rows(agg, np.zeros(len(rows), dtype=np.int64), np.zeros(1, dtype=np.int64), params)
    for i in range(len(rows)):
        for j, s in enumerate(SIGNALS):
            assert bool(got.has[i, j]) == (s in want)
            if s in want:
                seen = (got.m[i, j], got.above_ratio[i, j], got.above_mad[i, j])
                assert tuple(float(x).hex() for x in seen) == tuple(x.hex() for x in want[s])


def test_a_fresh_step_figure_without_a_bound_leaves_the_tbt_family_flagged() -> None:
    """Only ``tbt_p50_ms`` has pool bounds; the node's remembered p50 is far out and its fresh figure
    is a p99 alone: the recheck sees no signal it can judge (nodata), so the family stays flagged."""
    params = LatencyOutlierParams(min_hosts=2)
    lims = limits(
        {"tbt_p50_ms": (1.0, 0.1), "tbt_p99_ms": None, "ttft_mean_ms_w": None, "ttft_p99_ms": None}, params
    )
    agg = np.array([[10.0, np.nan, np.nan, np.nan], [10.0, np.nan, np.nan, np.nan]])
    now = np.array([[np.nan, 1.0, np.nan, np.nan], [1.0, np.nan, np.nan, np.nan]])
    tbt, _, sev, _ = verdict_columns(
        agg,
        now_figures=now,
        serve=np.array([True, True]),
        timed_out=np.array([False, False]),
        lims=lims,
        tbt_floor=0.0,
        ttft_floor=0.0,
    )
    for i, (p50, p99) in enumerate([(None, 1.0), (1.0, None)]):
        view = node(f"n{i}", tbt_p50_ms=p50, tbt_p99_ms=p99, ttft_mean_ms_w=1.0)
        want = _judge(view, {"tbt_p50_ms": 10.0}, lims, 0.0, 0.0)
        assert (STATUS[tbt[i]], sev[i].hex()) == (want.tbt, want.severity.hex())
    assert [STATUS[x] for x in tbt] == ["flagged", "clear"]
