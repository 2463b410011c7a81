"""What cache-aware reads of the snapshot besides the scorers' inputs: the pool's remembered step
times, the nodes' hot prefixes, and the prompt limits of a pool's model and GPU (README.md beside
this file: "Formula")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import attrgetter

import numpy as np

from fleetloop.policies.base import FleetSnapshot, PoolView
from fleetloop.policies.columns import FleetColumns
from fleetloop.policies.memory import PoolMemory
from fleetloop.policies.pool_figures import records
from fleetloop.policies.prefill import max_prompt_tokens, prompt_tokens_within
from fleetloop.policies.routing.cache_aware.params import CacheAwareParams
from fleetloop.policies.slo import SloBook

# node id -> the (ts_ms, tbt_p50_ms) figures seen within ``speed_memory_ms``, oldest first: the state
# of checkpoints written before the algorithm kept the same figures as one :class:`PoolMemory` per
# pool; still read (:func:`as_memory`).
State = Mapping[str, tuple[tuple[int, float], ...]]


def as_memory(state: PoolMemory | State) -> PoolMemory:
    """The state as a :class:`PoolMemory` (converting the per-node form of older checkpoints)."""
    if isinstance(state, PoolMemory):
        return state
    ids = tuple(sorted(state))
    slots = max((len(v) for v in state.values()), default=0)
    ts = np.full((len(ids), slots), -1, dtype=np.int64)
    vals = np.full((len(ids), slots, 1), np.nan)
    for r, node_id in enumerate(ids):
        for k, (t, v) in enumerate(state[node_id]):
            ts[r, k] = t
            vals[r, k, 0] = v
    return PoolMemory(ids, ts, vals)


def remember_rows(
    state: PoolMemory | State,
    now: int,
    params: CacheAwareParams,
    ids: tuple[str, ...],
    *,
    cols: FleetColumns,
    rows: slice,
) -> PoolMemory:
    """The pool's memory after this tick, from its rows ``rows`` of the snapshot's columns (the same
    figures: a step time > 0 of a warm node, not draining, not stale)."""
    tbt = cols.floats("tbt_p50_ms")[rows]
    with np.errstate(invalid="ignore"):
        keep = (tbt > 0) & cols.warm[rows] & ~cols.stale[rows]
    return as_memory(state).advance(
        ids, now, params.speed_memory_ms, np.flatnonzero(keep), tbt[keep][:, None]
    )


def pool_max_prompt(pool: PoolView | None, gpu_counts: Iterable[int]) -> int | None:
    """The longest prompt every node of the pool holds in its KV cache
    (:func:`fleetloop.policies.prefill.max_prompt_tokens` of the pool's model and GPU at each
    tensor-parallel degree its nodes report); None without nodes or for an unknown model or GPU."""
    degrees = set(gpu_counts)
    if pool is None or not degrees:
        return None
    fits = [max_prompt_tokens(pool.model, pool.gpu_type, c) for c in sorted(degrees)]
    return None if any(f is None for f in fits) else min(f for f in fits if f is not None)


PRIORITIES = tuple(range(10))  # the schema's priority classes (``priority`` 0-9)


def pool_slo_prompt(
    pool: PoolView | None, pool_id: str, gpu_counts: Iterable[int], slo: SloBook
) -> dict[str, int]:
    """Per priority class, the longest prompt every node of the pool prefills on its own within that
    class's TTFT SLO (:func:`fleetloop.policies.prefill.prompt_tokens_within` of the pool's model and
    GPU at each tensor-parallel degree its nodes report, the smallest); empty without nodes or for an
    unknown model or GPU."""
    degrees = sorted(set(gpu_counts))
    if pool is None or not degrees:
        return {}
    out: dict[str, int] = {}
    for p in PRIORITIES:
        ms = slo.target(p, model=pool.model, pool=pool_id).ttft_ms
        fits = [prompt_tokens_within(pool.model, pool.gpu_type, c, ms) for c in degrees]
        if any(f is None for f in fits):
            return {}
        out[str(p)] = min(f for f in fits if f is not None)
    return out


def slo_fit(
    memo: dict[tuple[str, str, int, str], dict[str, int]],
    view: PoolView | None,
    pool_id: str,
    g_lo: int,
    slo: SloBook,
) -> dict[str, int]:
    """:func:`pool_slo_prompt` of a pool whose fewest GPUs per node are ``g_lo`` (the figure only
    grows with the degree, so the smallest degree sets the pool's), remembered per model, GPU and
    degree, and per pool only when the book names pools; a copy each."""
    if view is None:
        return {}
    key = (view.model, view.gpu_type, g_lo, pool_id if slo.by_pool else "")
    found = memo.get(key)
    if found is None:
        found = memo[key] = pool_slo_prompt(view, pool_id, (g_lo,), slo)
    return dict(found)


def pool_index(snap: FleetSnapshot, cols: FleetColumns) -> dict[str, int]:
    """Pool id -> its index in ``cols.pool_ids`` (once per snapshot)."""
    key = ("cache-aware.pool_index",)
    found: dict[str, int] | None = snap.memo.get(key)
    if found is None:
        found = snap.memo[key] = {p: k for k, p in enumerate(cols.pool_ids)}
    return found


def hot_prefixes(snap: FleetSnapshot, cols: FleetColumns) -> list[tuple[str, ...]]:
    """Every row's ``hot_prefixes`` (once per snapshot)."""
    key = ("cache-aware.hot_prefixes",)
    found: list[tuple[str, ...]] | None = snap.memo.get(key)
    if found is None:
        found = snap.memo[key] = list(map(attrgetter("hot_prefixes"), records(cols)))
    return found
