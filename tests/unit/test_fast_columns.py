"""The snapshot's fleet-wide columns and what policies compute from them equal the plain per-node
forms, bit for bit, on generated fleets whose nodes join, leave, go cold, drain and go silent."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fleetloop.policies.columns import fleet_columns, segment_medians
from fleetloop.policies.memory import PoolMemory, median_sorted
from fleetloop.policies.routing import cache_aware
from fleetloop.policies.routing.cache_aware import CacheAwareParams
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.perturbed import perturbed_snapshots

FLOAT_FIELDS = (
    "tbt_p50_ms", "tbt_p99_ms", "ttft_p99_ms", "ttft_mean_ms_w", "hbm_free_gib", "kv_cache_used_frac",
    "queue_depth", "running_requests", "queued_prompt_tokens", "max_batch_tokens",
)  # fmt: skip
INT_FIELDS = ("age_ms", "ok_w", "requests_w", "failures_w", "consecutive_failures", "node_timeouts_w")


def bits(x: Any) -> Any:
    if isinstance(x, float):
        return x.hex()
    if isinstance(x, dict):
        return {k: bits(v) for k, v in x.items()}
    return x


@pytest.fixture(scope="module")
def snapshots() -> list[Any]:
    return list(perturbed_snapshots(320, 40))


def test_columns_hold_the_views_values_pool_by_pool(snapshots: list[Any]) -> None:
    joined = left = 0
    before: set[str] = set()
    for snap in snapshots:
        cols = fleet_columns(snap)
        assert fleet_columns(snap) is cols  # once per snapshot
        rows = [n for p in sorted(snap.pools) for n in snap.pool_nodes(p)]
        assert cols.nodes == tuple(rows)
        for pool_id, (a, b) in cols.bounds.items():
            assert cols.nodes[a:b] == snap.pool_nodes(pool_id)
            assert set(cols.pool_of[a:b].tolist()) == {cols.pool_ids.index(pool_id)}
        for name in FLOAT_FIELDS:
            want = [np.nan if (v := getattr(n, name)) is None else float(v) for n in rows]
            assert [x.hex() for x in cols.floats(name).tolist()] == [float(x).hex() for x in want], name
        for name in INT_FIELDS:
            assert cols.ints(name).tolist() == [getattr(n, name) for n in rows], name
        assert cols.warm.tolist() == [n.warm for n in rows]
        assert cols.stale.tolist() == [n.stale for n in rows]
        assert cols.draining.tolist() == [n.draining for n in rows]
        now = {n.node_id for n in rows}
        joined += len(now - before)
        left += len(before - now)
        before = now
    assert left > 0
    assert joined > len(before)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.none() | st.floats(min_value=0.0, max_value=1e6)),
        max_size=60,
    )
)
def test_segment_medians_are_median_sorted_per_pool(rows: list[tuple[int, float | None]]) -> None:
    rows = sorted(rows, key=lambda r: r[0])
    pool_of = np.array([p for p, _ in rows], dtype=np.int64)
    values = np.array([np.nan if v is None else v for _, v in rows], dtype=np.float64)
    med, count = segment_medians(values, pool_of, 6)
    for p in range(6):
        xs = sorted(v for q, v in rows if q == p and v is not None)
        assert count[p] == len(xs)
        assert (med[p].hex() if xs else "nan") == (median_sorted(xs).hex() if xs else "nan")


@pytest.mark.parametrize("params", [CacheAwareParams(), CacheAwareParams(w_hbm=3.0, silent_after_ms=2_000)])
def test_cache_aware_fleet_columns_equal_the_per_pool_forms(snapshots: list[Any], params: Any) -> None:
    memories: dict[str, PoolMemory] = {}
    spilled = 0
    for snap in snapshots:
        fast = cache_aware.fleet_headroom(snap, params)
        plain = cache_aware.fleet_headroom_plain(snap, params)
        assert bits(dict(fast)) == bits(dict(plain))
        spilled += sum(1 for v in fast.values() if v is not None)
        cols = fleet_columns(snap)
        for pool_id in sorted(snap.pools):
            pool = snap.pool_nodes(pool_id)
            rows = slice(*cols.bounds.get(pool_id, (0, 0)))
            state = memories.get(pool_id, PoolMemory.empty(1))
            mem = cache_aware._remember_rows(state, snap.now_ms, params, pool, cols=cols, rows=rows)
            assert mem == cache_aware.remember_pool(state, snap.now_ms, params, pool)
            memories[pool_id] = mem
            got = cache_aware._pool_scores(snap, pool, params, mem, cols=cols, rows=rows)
            want = cache_aware._scored(pool, params, cache_aware.pool_steps(mem))
            assert bits(got[0]) == bits(want[0])
            assert bits(got[1]) == bits(want[1])
    assert spilled > 0
