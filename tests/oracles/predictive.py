"""slo-predictive stated over each pool's nodes one by one: the test oracle of
:mod:`fleetloop.policies.autoscale.predictive` (whose one implementation decides a batch of pools
from segment figures over the snapshot's columns). The same arithmetic in the same order, so the two
agree bit for bit; it shares the rule's pieces that are not about reading nodes (the trend fit, the
target's stabilization, the siblings' reading, the drain order)."""

from __future__ import annotations

from collections.abc import Sequence

from fleetloop.policies.autoscale.predictive.params import SloPredictiveParams
from fleetloop.policies.autoscale.predictive.rule import (
    ACCUMULATION_Z,
    MAX_NEED_NODES,
    MIN_LEARN_PRESSURE,
    SloPredictiveState,
    accumulation,
    drain_order,
    learn_cold_start,
    target,
    trend_slope,
)
from fleetloop.policies.autoscale.predictive.signals import (
    Node,
    NodesOf,
    idle_tbt_of,
    predicted_prefill_ms,
    pressure,
    sibling_excess,
)
from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult, r6
from fleetloop.schemas.decisions import AutoscaleDecision


def views(snap: FleetSnapshot, pool_id: str) -> Sequence[Node]:
    return snap.pool_nodes(pool_id)


def _median(xs: Sequence[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2.0


def decide(
    snap: FleetSnapshot,
    params: SloPredictiveParams,
    state: SloPredictiveState,
    ctx: PolicyContext,
    nodes_of: NodesOf = views,
) -> PolicyResult[SloPredictiveState]:
    """The rule over the pool's nodes one by one (views by default, or :func:`node_figures`).

    One function of ~180 lines on purpose: it is the statement the product's batch form is held to,
    read top to bottom in the formula's order (README.md beside the policy)."""
    now = ctx.now_ms
    window_ms = max(1, snap.window_ms)
    tick_s = max(ctx.tick_ms, 1) / 1000.0
    lo, hi = params.bounds(ctx.pool_id)
    pool = snap.pools.get(ctx.pool_id)
    nodes = nodes_of(snap, ctx.pool_id)

    asked = set(ctx.draining)  # the pool's drain list as the engine holds it
    active = [n for n in nodes if not n.draining and not n.stale and n.node_id not in asked]
    ejected = {i for i, b in ctx.breakers.items() if b.enforced and b.state == "open"}
    warm = [n for n in active if n.weights_state == "warm" and n.node_id not in ejected]
    arriving = [n for n in active if n.weights_state != "warm"]
    current = len(active)

    # Cold start: learn from nodes seen going from cold/loading to warm.
    since = dict(state.not_warm_since)
    cold_start = state.cold_start_s
    for n in nodes:
        if n.stale:
            continue
        if n.weights_state != "warm":
            since.setdefault(n.node_id, now)
        elif n.node_id in since:
            cold_start = learn_cold_start(cold_start, now, since.pop(n.node_id))
    live = {n.node_id for n in nodes if not n.stale}
    not_warm_since = tuple(sorted((i, t) for i, t in since.items() if i in live))
    lead_s = cold_start if cold_start is not None else params.cold_start_s

    # Demand: served tokens/s, its trend over the lead, and the backlog.
    demand = (pool.prompt_tokens_rate_per_s + pool.output_tokens_rate_per_s) if pool else 0.0
    horizon_ms = max(lead_s * 1000.0, 3.0 * window_ms)
    samples = (*((t, d) for t, d in state.demand if now - t <= horizon_ms), (now, demand))
    # A controller that has not yet seen a whole horizon does not extrapolate (start-up).
    full = bool(state.demand) and now - state.demand[0][0] >= horizon_ms
    slope = trend_slope(samples, window_ms) if full else 0.0
    projected = demand + slope * lead_s
    backlog = sum(n.queued_prompt_tokens for n in active) / max(lead_s, window_ms / 1000.0)

    # Capacity per warm node at the target, learned from the pressure it is seen at.
    out_rate = pool.output_tokens_rate_per_s if pool else 0.0
    # The median node's concurrency, times the node count: one slow node piling up requests
    # (a breaker's case, not a capacity one) does not make the whole pool look stalled.
    running = len(warm) * (_median([float(n.running_requests) for n in warm]) or 0.0)
    started = state.demand[0][0] if state.demand else now
    settled = now - started >= window_ms and pool is not None and pool.requests_w >= params.min_requests
    # Output is counted when a call ends: until a whole window of calls has ended the rate
    # understates the tokens flowing and the ratio would read as a stall.
    tbt_now = 1000.0 * running / out_rate if warm and out_rate > 0 and settled else None
    tbt = state.tbt_ms
    if tbt_now is not None:
        beta = 1.0 - 0.5 ** (tick_s * 1000.0 / window_ms)
        tbt = tbt_now if tbt is None else tbt + beta * (tbt_now - tbt)
    elif not warm:
        tbt = None
    slo = ctx.pool_slo(snap)
    prefill = predicted_prefill_ms(pool, warm, params)
    p = pressure(warm, pool.ttft_p50_ms_w if pool else None, tbt, params, slo, prefill, idle_tbt_of(warm))
    p_now = p.value
    capacity = state.capacity_tok_s
    learnable = (
        pool is not None
        and warm
        and pool.requests_w >= params.min_requests
        and p_now >= MIN_LEARN_PRESSURE
        and demand > 0
    )
    c_obs: float | None = None
    if learnable:
        c_obs = demand / len(warm) / p_now
        alpha = 1.0 - 0.5 ** (tick_s / params.capacity_halflife_s)
        capacity = c_obs if capacity is None else capacity + alpha * (c_obs - capacity)

    # Open workflows: each one will call again (a chain of sequential calls), so while their
    # number grows the demand still ahead is not yet in the served tokens.
    counts = (
        (now, pool.open_workflows, pool.workflows_started, pool.workflows_ended)
        if pool is not None
        else (now, 0, 0, 0)
    )
    open_wf = (*(o for o in state.open_workflows if now - o[0] <= horizon_ms), counts)
    open_rise, open_noise = accumulation(open_wf) if full else (0.0, 0.0)
    accumulating = open_rise > ACCUMULATION_Z * open_noise
    growth = max(1.0, projected / demand) if demand > 0 else 1.0
    level = len(warm) * p_now
    by_capacity = (demand + backlog) / capacity if capacity else 0.0
    # Calls the router moved to another model's pool: demand this pool still has to carry.
    diverted_tok_s = pool.diverted_tokens_rate_per_s if pool is not None else 0.0
    diverted = diverted_tok_s / capacity if capacity else 0.0
    # A pool of the same model short of the nodes its pressure asks for: this pool carries it.
    sib_p, sib_short = sibling_excess(snap, ctx, params, pool, len(warm), nodes_of=nodes_of)
    sibling_binds = sib_short > 0
    need = (max(level, by_capacity) + diverted) * growth + sib_short
    if need > 0:
        need += params.spare_nodes  # N+k: survive losing k nodes while replacements warm up
    # A hostile figure the schema accepts (a node reporting 10**12 queued prompt tokens) reads
    # as ~1e15 nodes, past a decision's figure bound, and would fail the pool's whole tick
    # (breaker and routing with it). Past MAX_NEED_NODES the figure only says "as many as
    # allowed": max_nodes and the step limit apply after.
    need = min(need, MAX_NEED_NODES)

    inputs: dict[str, float] = {
        "warm_nodes": float(len(warm)),
        "arriving_nodes": float(len(arriving)),
        "pressure": r6(p_now),
        "pressure_kv": r6(p.kv),
        "pressure_queue": r6(p.queue),
        "demand_tok_s": r6(demand),
        "projected_tok_s": r6(projected),
        "backlog_tok_s": r6(backlog),
        "lead_s": r6(lead_s),
        "ttft_slo_ms": r6(slo.ttft_ms),
        "tbt_slo_ms": r6(slo.tbt_ms),
        "prefill_ms": r6(prefill),
        "open_workflows": float(counts[1]),
        "open_workflows_rise": r6(open_rise),
        "open_workflows_noise": r6(open_noise),
        "sibling_pressure": r6(sib_p),
        "sibling_short_nodes": r6(sib_short),
    }
    if p.ttft is not None:
        inputs["pressure_ttft"] = r6(p.ttft)
    if p.tbt is not None:
        inputs["pressure_tbt"] = r6(p.tbt)
    if p.tbt_floor is not None:
        inputs["tbt_floor_ms"] = r6(p.tbt_floor)
    if capacity is not None:
        inputs["capacity_tok_s"] = r6(capacity)
    if diverted_tok_s > 0:
        inputs["diverted_tok_s"] = r6(diverted_tok_s)

    t = target(
        state, params, pool, now=now, has_nodes=bool(nodes), current=current, n_warm=len(warm),
        capacity=capacity, need=need, slope=slope, sibling_binds=sibling_binds,
        accumulating=accumulating, lead_s=lead_s, bounds=(lo, hi),
    )  # fmt: skip
    raw, desired, reason, recs = t.raw, t.desired, t.reason, t.recs
    last_down, last_failure, failed_tasks = t.last_down_ms, t.last_failure_ms, t.failed_tasks
    inputs["need_nodes"] = r6(need)
    inputs["raw_desired"] = float(raw)

    drain: tuple[str, ...] = ()
    if desired < current and t.stepped_down:
        drain = tuple(n.node_id for n in drain_order(active)[: current - desired])

    new_state = SloPredictiveState(
        demand=samples,
        capacity_tok_s=capacity,
        cold_start_s=cold_start,
        not_warm_since=not_warm_since,
        recs=recs,
        last_desired=desired,
        last_down_ms=last_down,
        tbt_ms=tbt,
        failed_tasks=failed_tasks,
        last_failure_ms=last_failure,
        open_workflows=open_wf,
    )
    decision = AutoscaleDecision(
        entity=f"pool/{ctx.pool_id}",
        pool_id=ctx.pool_id,
        current_nodes=current,
        desired_nodes=desired,
        drain=drain,
        reason=reason,
        inputs=inputs,
    )
    diagnostics = {
        "pressure": r6(p_now),
        "need_nodes": r6(need),
        "desired_nodes": float(desired),
    }
    if c_obs is not None:
        diagnostics["capacity_obs_tok_s"] = r6(c_obs)
    return PolicyResult(decisions=(decision,), state=new_state, diagnostics=diagnostics)
