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
from tests.oracles import cache_aware as ca_oracle
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
    spilled = spill_lists = 0
    for snap in snapshots:
        fast = cache_aware.fleet_headroom(snap, params)
        plain = ca_oracle.fleet_headroom_plain(snap, params)
        assert bits(dict(fast)) == bits(dict(plain))
        spilled += sum(1 for v in fast.values() if v is not None)
        cols = fleet_columns(snap)
        for pool_id in sorted(snap.pools):
            pool = snap.pool_nodes(pool_id)
            rows = slice(*cols.bounds.get(pool_id, (0, 0)))
            state = memories.get(pool_id, PoolMemory.empty(1))
            ids = tuple(n.node_id for n in pool)
            mem = cache_aware.remember_rows(state, snap.now_ms, params, ids, cols=cols, rows=rows)
            assert mem == ca_oracle.remember_pool(state, snap.now_ms, params, pool)
            memories[pool_id] = mem
            got = cache_aware.pool_scores(snap, ids, params, mem, cols=cols, rows=rows)
            want = ca_oracle.scored(pool, params, ca_oracle.pool_steps(mem))
            assert bits(got[0]) == bits(want[0])
            assert bits(got[1]) == bits(want[1])
            targets = cache_aware.spill_targets(snap, params, pool_id)
            assert targets == ca_oracle.spill_targets_plain(snap, params, pool_id)
            spill_lists += bool(targets)
    assert spilled > 0
    assert spill_lists > 0


def test_spill_targets_keep_a_pool_whose_headroom_is_exactly_the_floor(snapshots: list[Any]) -> None:
    """The once-per-model ranking keeps the plain rule's bound (``>=``) and ties (pool id)."""
    checked = 0
    for snap in snapshots[::8]:
        found = [h for h in cache_aware.fleet_headroom(snap, CacheAwareParams()).values() if h is not None]
        if not found:
            continue
        floor = sorted(found)[len(found) // 2]
        params = CacheAwareParams(spill_min_headroom=floor)
        at_floor = {p for p, h in cache_aware.fleet_headroom(snap, params).items() if h == floor}
        for pool_id in sorted(snap.pools):
            targets = cache_aware.spill_targets(snap, params, pool_id)
            assert targets == ca_oracle.spill_targets_plain(snap, params, pool_id)
            checked += bool(at_floor & set(targets))
    assert checked > 0


signed = st.sampled_from([np.nan, -0.0, 0.0, 1.0, 2.5, 7.0])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(st.lists(signed, min_size=2, max_size=2), min_size=1, max_size=7), min_size=1, max_size=6
    )
)
def test_memory_medians_are_median_sorted_of_each_row_even_with_signed_zeros(rows: list[Any]) -> None:
    """The quick sort is taken only when no zero is present; with 0.0 and -0.0 in a row the middle
    value is the one a stable sort (``sorted``) puts there, sign included."""
    slots = max(len(r) for r in rows)
    vals = np.full((len(rows), slots, 2), np.nan)
    for i, r in enumerate(rows):
        vals[i, : len(r)] = r
    mem = PoolMemory(
        tuple(f"n{i}" for i in range(len(rows))), np.zeros((len(rows), slots), dtype=np.int64), vals
    )
    med, ok = mem.median_arrays(1)
    for i in range(len(rows)):
        for j in range(2):
            xs = sorted(float(v) for v in vals[i, :, j].tolist() if not np.isnan(v))
            assert bool(ok[i, j]) == bool(xs)
            if xs:
                assert med[i, j].hex() == median_sorted(xs).hex()


def test_sibling_figures_shared_through_the_snapshot_equal_each_pools_own_reading(
    snapshots: list[Any],
) -> None:
    """slo-predictive reads each sibling pool once per snapshot and SLO; every pool gets what it
    would get reading its siblings itself (pools judged by different SLOs read them differently),
    and a pool whose breakers name a sibling's node reads that sibling itself."""
    from dataclasses import replace

    from fleetloop.policies.autoscale import predictive
    from fleetloop.policies.base import PolicyContext
    from fleetloop.policies.slo import Slo, SloBook
    from fleetloop.schemas.decisions import BreakerDecision

    params = predictive.SloPredictiveParams()
    book = SloBook(default=Slo(2000.0, 100.0), by_priority={0: Slo(500.0, 40.0), 2: Slo(8000.0, 300.0)})

    def ctx(snap: Any, pool_id: str, breakers: Any = None) -> PolicyContext:
        return PolicyContext(
            now_ms=snap.now_ms,
            tick_id=1,
            tick_ms=1000,
            pool_id=pool_id,
            seed=(1,),
            slo=book,
            breakers=breakers or {},
        )

    def excess(snap: Any, pool_id: str, breakers: Any = None) -> tuple[str, str]:
        p, s = predictive.sibling_excess(snap, ctx(snap, pool_id, breakers), params, snap.pools[pool_id], 0)
        return p.hex(), s.hex()

    short = ejections_mattered = 0
    for snap in snapshots[::4]:
        # Half the pools served only the strict class, half only the loose one: two SLOs per model; a
        # first-token time far above both, so TTFT pressure (the SLO-dependent part) decides the sizes.
        pools = {
            p: replace(v, requests_by_priority_w={0 if k % 2 else 2: 5}, ttft_p50_ms_w=1e9)
            for k, (p, v) in enumerate(sorted(snap.pools.items()))
        }
        snap = replace(snap, pools=pools, memo={})
        ids = sorted(pools)
        shared = [excess(snap, p) for p in ids]
        assert shared == [excess(replace(snap, memo={}), p) for p in ids]
        short += sum(1 for _, s in shared if float.fromhex(s) > 0)
        # A breaker naming another pool's node (never the case in the engine) is honoured.
        for victim_pool in ids:
            warm = [n for n in snap.pool_nodes(victim_pool) if n.warm and not n.stale]
            if not warm:
                continue
            victim = warm[0].node_id
            b = BreakerDecision(
                entity=f"node/{victim}", pool_id=victim_pool, node_id=victim, state="open", reason="x"
            )
            for pool_id in ids:
                got = excess(snap, pool_id, {victim: b})
                assert got == excess(replace(snap, memo={}), pool_id, {victim: b})
                ejections_mattered += got != excess(snap, pool_id)
    assert short > 0
    assert ejections_mattered > 0
