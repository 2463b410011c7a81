"""slo-predictive for a batch of pools: :func:`decide_pools`, the one implementation of the rule
(``SloPredictive.decide`` is a batch of one).

The node figures every pool's tick reads are segment operations over the snapshot's columns, one
numpy pass each for the whole batch (:func:`fleetloop.policies.autoscale.predictive.signals.read_batch`);
so are the demand trends' fits, after each pool's lead and samples
(:func:`fleetloop.policies.autoscale.predictive.rule.trend_slopes`, each pool's own doubles); the
rest (state, reasons, the decision) is the rule's arithmetic pool by pool
(:mod:`fleetloop.policies.autoscale.predictive.rule`); every figure the decisions and diagnostics
round is rounded in one pass after the loop, and a decision is assembled without validation when
every part is in bounds. ``tests/oracles/predictive.py`` states the same rule over each pool's nodes,
one by one; ``tests/unit/test_batch_sections.py`` and ``tests/unit/test_fast_predictive.py`` hold
this form to it, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from fleetloop.policies.autoscale.predictive.params import SloPredictiveParams
from fleetloop.policies.autoscale.predictive.rule import (
    SloPredictiveState,
    Target,
    cold_starts,
    demand_samples,
    drain_order,
    learned_capacity,
    need_nodes,
    open_workflow_trend,
    smoothed_tbt,
    target,
    trend_slopes,
    with_slope,
)
from fleetloop.policies.autoscale.predictive.signals import (
    BatchFigures,
    Pressure,
    node_figures,
    own_pressure,
    pool_rows,
    read_batch,
    sibling_short,
)
from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult
from fleetloop.policies.pool_figures import is_ident, r6_many
from fleetloop.schemas.base import MAX_COUNT, assemble
from fleetloop.schemas.decisions import AutoscaleDecision

_AUTOSCALE_FIELDS = (
    "entity",
    "reason",
    "inputs",
    "kind",
    "pool_id",
    "current_nodes",
    "desired_nodes",
    "drain",
)
assert (
    tuple(AutoscaleDecision.model_fields) == _AUTOSCALE_FIELDS
)  # ``autoscale_decision`` lists them in order
# The inputs every slo-predictive decision carries first, in order.
INPUT_KEYS = (
    "warm_nodes",
    "arriving_nodes",
    "pressure",
    "pressure_kv",
    "pressure_queue",
    "demand_tok_s",
    "projected_tok_s",
    "backlog_tok_s",
    "lead_s",
    "ttft_slo_ms",
    "tbt_slo_ms",
    "prefill_ms",
    "open_workflows",
    "open_workflows_rise",
    "open_workflows_noise",
    "sibling_pressure",
    "sibling_short_nodes",
)
# Every decision's inputs end with these two (after the optional ones, :func:`_optional_inputs`).
_LAST_KEYS = ("need_nodes", "raw_desired")
_ALL_KEYS = (*INPUT_KEYS, *_LAST_KEYS)  # a decision's input names when it has no optional one
_AUTOSCALE_GIVEN = frozenset(
    ("entity", "pool_id", "current_nodes", "desired_nodes", "drain", "reason", "inputs")
)


def autoscale_decision(  # noqa: PLR0917 - the decision's fields
    pool_id: str,
    current: int,
    desired: int,
    drain: tuple[str, ...],
    reason: str,
    inputs: dict[str, float],
    *,
    figures_in_bounds: bool,
) -> AutoscaleDecision:
    """``AutoscaleDecision(...)`` assembled without validation when every part is valid (the counts
    within ``NonNegInt``, the ids ``Ident``s, every figure a finite float within ``Figure``:
    ``figures_in_bounds``, all floats), else validated (and refused)."""
    if (
        0 <= current <= MAX_COUNT
        and 0 <= desired <= MAX_COUNT
        and type(current) is int
        and type(desired) is int
        and is_ident(pool_id)
        and all(is_ident(i) for i in drain)
        and figures_in_bounds
    ):
        values: dict[str, object] = {
            "entity": f"pool/{pool_id}",
            "reason": reason,
            "inputs": inputs,
            "kind": "autoscale",
            "pool_id": pool_id,
            "current_nodes": current,
            "desired_nodes": desired,
            "drain": drain,
        }
        return assemble(AutoscaleDecision, values, set(_AUTOSCALE_GIVEN))
    return AutoscaleDecision(
        entity=f"pool/{pool_id}",
        pool_id=pool_id,
        current_nodes=current,
        desired_nodes=desired,
        drain=drain,
        reason=reason,
        inputs=inputs,
    )


class _Made(NamedTuple):
    """A pool's tick before its figures are rounded (its figures are in the batch's flat list)."""

    pool_id: str
    current: int
    desired: int
    drain: tuple[str, ...]
    reason: str
    keys: tuple[str, ...]  # the names of its inputs, in order
    state: SloPredictiveState
    has_obs: bool  # a capacity observation follows its inputs


def decide_pools(
    snap: FleetSnapshot,
    params: SloPredictiveParams,
    states: Sequence[SloPredictiveState],
    ctxs: Sequence[PolicyContext],
) -> list[PolicyResult[SloPredictiveState]]:
    """One result per context (distinct pools), in order."""
    fig = read_batch(snap, params, ctxs)
    # Each pool's lead and demand samples first, then every pool's trend fitted at once.
    window_ms = max(1, snap.window_ms)
    heads = [_pool_head(snap, params, fig, state, ctx) for state, ctx in zip(states, ctxs, strict=True)]
    slopes = trend_slopes([h.samples if h.full else None for h in heads], window_ms)
    # Every figure the pools' decisions and diagnostics round, in one list: rounded at once after the
    # loop (``r6_many``, the same doubles as ``r6``), then handed back in order.
    flat: list[float] = []
    made = [
        _pool_tick(snap, params, fig, k, state, ctx, flat, head, slope)
        for k, (state, ctx, head, slope) in enumerate(zip(states, ctxs, heads, slopes, strict=True))
    ]
    rounded, bounded = r6_many(flat)
    results: list[PolicyResult[SloPredictiveState]] = []
    at = 0
    for m in made:
        end = at + len(m.keys)
        inputs = dict(zip(m.keys, rounded[at:end], strict=True))
        diagnostics = {
            "pressure": inputs["pressure"],
            "need_nodes": inputs["need_nodes"],
            "desired_nodes": float(m.desired),
        }
        ok = all(bounded[at:end])
        if m.has_obs:
            diagnostics["capacity_obs_tok_s"] = rounded[end]
            end += 1
        at = end
        decision = autoscale_decision(
            m.pool_id, m.current, m.desired, m.drain, m.reason, inputs, figures_in_bounds=ok
        )
        results.append(PolicyResult(decisions=(decision,), state=m.state, diagnostics=diagnostics))
    return results


class _Head(NamedTuple):
    """A pool's first steps (:func:`_pool_head`): its cold start and lead, and its demand's samples
    over the lead, which the batch fits to trends all at once (:func:`trend_slopes`)."""

    cold_start: float | None
    not_warm_since: tuple[tuple[str, int], ...]
    lead_s: float
    demand: float
    samples: tuple[tuple[int, float], ...]
    horizon_ms: float
    full: bool


def _pool_head(
    snap: FleetSnapshot,
    params: SloPredictiveParams,
    fig: BatchFigures,
    state: SloPredictiveState,
    ctx: PolicyContext,
) -> _Head:
    """The rule's steps up to the demand trend's fit, for one pool."""
    pid, now = ctx.pool_id, ctx.now_ms
    pool = snap.pools.get(pid)
    j = fig.index.get(pid, -1)
    # Cold start: learn from nodes seen going from cold/loading to warm.
    if state.not_warm_since or (j >= 0 and fig.not_warm[j]):
        ids, stale, warm = pool_rows(snap, fig, pid)
        cold_start, not_warm_since = cold_starts(
            state.cold_start_s, state.not_warm_since, now, zip(ids, stale, warm, strict=True)
        )
    else:
        cold_start, not_warm_since = state.cold_start_s, ()
    lead_s = cold_start if cold_start is not None else params.cold_start_s
    # Demand: served tokens/s and its samples over the lead.
    demand = (pool.prompt_tokens_rate_per_s + pool.output_tokens_rate_per_s) if pool else 0.0
    samples, horizon_ms, full = demand_samples(state, now, demand, lead_s, max(1, snap.window_ms))
    return _Head(cold_start, not_warm_since, lead_s, demand, samples, horizon_ms, full)


def _pool_tick(  # noqa: PLR0917 - the batch's figures, then the pool's place, state and context
    snap: FleetSnapshot,
    params: SloPredictiveParams,
    fig: BatchFigures,
    k: int,
    state: SloPredictiveState,
    ctx: PolicyContext,
    flat: list[float],
    head: _Head,
    slope: float,
) -> _Made:
    """Pool ``k`` of the batch: the rule's steps in order after its ``head`` and its demand trend's
    ``slope`` (0.0 unless the head's samples span a whole lead); its figures are appended to
    ``flat``."""
    pid, now = ctx.pool_id, ctx.now_ms
    window_ms = max(1, snap.window_ms)
    tick_s = max(ctx.tick_ms, 1) / 1000.0
    pool = snap.pools.get(pid)
    j = fig.index.get(pid, -1)
    has_nodes = j >= 0
    current, n_warm, n_arriving = (
        (fig.own.active[j], fig.own.warm[j], fig.arriving[j]) if has_nodes else (0, 0, 0)
    )
    cold_start, not_warm_since = head.cold_start, head.not_warm_since
    lead_s, demand = head.lead_s, head.demand

    # Demand: its trend over the lead, and the backlog.
    trend = with_slope(head.samples, head.horizon_ms, head.full, slope, demand, lead_s)
    backlog = (fig.backlog[j] if has_nodes else 0) / max(lead_s, window_ms / 1000.0)

    # Pressure, and the capacity per warm node at the target learned from it.
    median = fig.medians[j] if n_warm else None
    tbt = smoothed_tbt(state, params, pool, now, n_warm, median, tick_s, window_ms)
    slo = ctx.pool_slo(snap)
    prefill, p = own_pressure(snap, fig, params, pool, j, tbt, slo)
    p_now = p.value
    capacity, c_obs = learned_capacity(state, params, pool, n_warm, p_now, demand, tick_s)

    wf = open_workflow_trend(state, pool, now, trend.horizon_ms, trend.full)
    diverted_tok_s = pool.diverted_tokens_rate_per_s if pool is not None else 0.0
    # A pool of the same model short of the nodes its pressure asks for: this pool carries it.
    sib_p, sib_short = sibling_short(snap, fig, ctx, params, pool, n_warm, fig.ejected[k], slo)
    need = need_nodes(
        params, n_warm * p_now, demand, backlog, capacity, trend.projected, diverted_tok_s, sib_short
    )

    # The decision's inputs, in order, before rounding (``float(n)`` is its own rounding).
    flat += (
        float(n_warm), float(n_arriving), p_now, p.kv, p.queue, demand, trend.projected, backlog, lead_s,
        slo.ttft_ms, slo.tbt_ms, prefill, float(wf.samples[-1][1]), wf.rise, wf.noise, sib_p, sib_short,
    )  # fmt: skip
    keys = _optional_inputs(flat, p, capacity, diverted_tok_s)

    t = target(
        state, params, pool, now=now, has_nodes=has_nodes, current=current, n_warm=n_warm,
        capacity=capacity, need=need, slope=trend.slope, sibling_binds=sib_short > 0,
        accumulating=wf.accumulating, lead_s=lead_s, bounds=params.bounds(pid),
    )  # fmt: skip
    flat += (need, float(t.raw))
    drain = _drain(snap, pid, fig.drained[k], current, t)

    new_state = SloPredictiveState(
        demand=trend.samples,
        capacity_tok_s=capacity,
        cold_start_s=cold_start,
        not_warm_since=not_warm_since,
        recs=t.recs,
        last_desired=t.desired,
        last_down_ms=t.last_down_ms,
        tbt_ms=tbt,
        failed_tasks=t.failed_tasks,
        last_failure_ms=t.last_failure_ms,
        open_workflows=wf.samples,
    )
    if c_obs is not None:
        flat.append(c_obs)
    return _Made(pid, current, t.desired, drain, t.reason, keys, new_state, c_obs is not None)


def _optional_inputs(
    flat: list[float], p: Pressure, capacity: float | None, diverted_tok_s: float
) -> tuple[str, ...]:
    """The decision's input names: :data:`INPUT_KEYS`, the inputs a decision carries only when they
    have a value (appended to ``flat`` in the same order), then ``need_nodes`` and ``raw_desired``
    (the caller appends those two); the common case one tuple, not built per pool."""
    more: list[str] = []
    if p.ttft is not None:
        more.append("pressure_ttft")
        flat.append(p.ttft)
    if p.tbt is not None:
        more.append("pressure_tbt")
        flat.append(p.tbt)
    if p.tbt_floor is not None:
        more.append("tbt_floor_ms")
        flat.append(p.tbt_floor)
    if capacity is not None:
        more.append("capacity_tok_s")
        flat.append(capacity)
    if diverted_tok_s > 0:
        more.append("diverted_tok_s")
        flat.append(diverted_tok_s)
    return (*INPUT_KEYS, *more, *_LAST_KEYS) if more else _ALL_KEYS


def _drain(
    snap: FleetSnapshot, pool_id: str, drained: tuple[str, ...], current: int, t: Target
) -> tuple[str, ...]:
    """The nodes to drain for ``t``: not-warm nodes first, then the least loaded warm ones
    (:func:`drain_order`), none on the pool's drain list already (``drained``); only on a tick whose
    target fell (``t.stepped_down``), enough for the active nodes to reach it."""
    if t.desired >= current or not t.stepped_down:
        return ()
    asked = set(drained)
    nodes = [
        n for n in node_figures(snap, pool_id) if not n.draining and not n.stale and n.node_id not in asked
    ]
    return tuple(n.node_id for n in drain_order(nodes)[: current - t.desired])
