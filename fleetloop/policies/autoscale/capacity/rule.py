"""capacity: size each pool to the fewest warm nodes that carry its forecast demand within its SLO,
by the serving physics. README.md beside this file states the rule in full, with what each
parameter rests on.

Formula, per pool and tick::

    node_calls_per_s = max_rate(shape, mix, SLO, speed)   one node's calls/s with its population at
                                                          the 99th percentile (fleetloop.perf.serving)
    arrivals = new calls ended + diverted calls + growth of calls inside the nodes
    forecast = arrivals + trend x lead (x open-workflow growth while tasks accumulate)
    bound    = forecast + z(coverage) x max(lead-lagged spread, counting spread)
               raised to base x ratio of a remembered burst while one is under way, and to the
               peak (base x ratio) of a remembered burst that rose faster than a cold start and cost tasks
    need     = (bound + queued / lead) / node_calls_per_s
    desired  = ceil(need) up at once; down to the highest need of one lead, held while tasks fail
               or accumulate or a remembered burst is under way

Inputs: node telemetry (weights state, draining, stale, running, queued, KV use, prefix hit rate,
TBT p50, step budget, model, GPU type and count, serving engine), open breakers, the pool's window
(new calls, retries, token rates, diverted tokens) and ledger share (open, started, ended, failed
tasks), the SLO book. Parameters: ``coverage`` 0.95, ``cold_start_s`` (catalog), ``down_window_s`` (the lead),
``halflife_s`` 60, ``memory_s`` 86400, ``max_bursts`` 8, ``spare_nodes`` 0, bounds and per-pool
engine, release and precision (``pools``; the engine the nodes report, when it has a runtime
profile, comes before the stated one: :func:`pool_engine`). Failure mode: no physics for an
unknown model or GPU (engine signals, no scale-down); a first burst faster than a cold start is
lost in part (the operator's floor answers it, the memory the next); an engine neither reported
nor stated rightly is caught only past the speed deadband (1.2x); a pool whose nodes report
nothing fresh is unknown, not empty: its target holds (fail static), nothing drains.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from fleetloop.perf.engines import FAMILIES
from fleetloop.perf.serving import Mix, NodeShape, Targets, steady
from fleetloop.policies.autoscale.capacity.forecast import (
    Sample,
    counting_spread,
    follow_episode,
    lagged_spread,
    plan_then,
)
from fleetloop.policies.autoscale.capacity.params import CapacityParams, PoolSpec
from fleetloop.policies.autoscale.capacity.state import Burst, CapacityState, Episode
from fleetloop.policies.autoscale.predictive import (
    accumulation,
    cold_starts,
    drain_order,
    trend_slope,
)
from fleetloop.policies.base import FleetSnapshot, NodeView, PolicyContext, PolicyResult, PoolView, r6
from fleetloop.policies.physics import ShapeKey, median_step, node_rate, shape_of
from fleetloop.policies.slo import Slo
from fleetloop.schemas.decisions import AutoscaleDecision

MAX_NEED_NODES = 1_000_000.0  # a hostile figure's need is capped here (a decision's figure bound)
MIN_RUNNING = 8  # running calls over the pool's warm nodes before their KV per call is read
SLOW_BOUNDS = (0.5, 8.0)  # the speed figure is clamped here (a ratio outside is a broken reading)
SLOW_DEADBAND = 1.2  # a pool's speed is applied only past this factor either way
MIN_SPEED_NODES = 2  # serving nodes needed to read the pool's speed (a median of one is one node)
ACCUMULATION_Z = 2.0  # standard deviations of churn the open-workflow count must rise by
IDLE_KNEE = 2.0  # an SLO below the idle node's own figure: held to this multiple of it instead


@dataclass(frozen=True, slots=True)
class _Pool:
    """The pool's nodes as the rule reads them this tick."""

    active: list[NodeView]  # counted: not draining, not stale, not on the pool's drain list
    warm: list[NodeView]  # counted and serving: warm, not behind an open breaker
    arriving: list[NodeView]  # counted, not yet warm
    serving: list[NodeView]  # read: warm, not draining, not stale (asked to drain or not)


def _nodes(snap: FleetSnapshot, ctx: PolicyContext) -> _Pool:
    # Asked to drain: the pool's drain list as the engine holds it (every node asked on an earlier
    # tick that is not gone, less those a rising target took back). Not this rule's own memory of
    # its asks: the engine may have let out fewer (its step limit) or taken some back, and a memory
    # of one window counted a node still leaving as the pool's size again a window later.
    asked = set(ctx.draining)
    ejected = {i for i, b in ctx.breakers.items() if b.enforced and b.state == "open"}
    active = [
        n for n in snap.pool_nodes(ctx.pool_id) if not n.draining and not n.stale and n.node_id not in asked
    ]
    warm = [n for n in active if n.weights_state == "warm" and n.node_id not in ejected]
    arriving = [n for n in active if n.weights_state != "warm"]
    serving = [
        n
        for n in snap.pool_nodes(ctx.pool_id)
        if n.weights_state == "warm" and not n.draining and not n.stale and n.node_id not in ejected
    ]
    return _Pool(active, warm, arriving, serving)


def _median(xs: Sequence[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2.0


def _ewma(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else old + alpha * (new - old)


def pool_engine(ref: NodeView, warm: Sequence[NodeView], spec: PoolSpec) -> tuple[str, str | None]:
    """The engine and release the pool's physics is planned with: the engine its nodes report
    (``NodeTelemetry.engine``; the commonest among the warm nodes, ties to the first name, else the
    reference node's), when fleetloop has a runtime profile for it; otherwise (not reported, or a
    name without a profile: engine unknown) the engine the operator states for the pool, which is
    vLLM unless stated. The stated release (``engine_version``) applies only to the stated engine:
    a pool that reports another engine runs that engine's current release profile."""
    counts = Counter(n.engine for n in (warm or (ref,)) if n.engine in FAMILIES)
    if counts:
        top = max(counts.values())
        reported = min(e for e, c in counts.items() if c == top)
        if reported != spec.engine:
            return reported, None
    return spec.engine, spec.engine_version


def _shape_key(
    ref: NodeView | None, warm: Sequence[NodeView], params: CapacityParams, pool_id: str
) -> ShapeKey | None:
    if ref is None:
        return None
    spec = params.pool(pool_id)
    budgets = [float(n.max_batch_tokens) for n in warm if n.max_batch_tokens > 0]
    budget = int(_median(budgets) or ref.max_batch_tokens)
    engine, family = pool_engine(ref, warm, spec)
    return (ref.model, ref.gpu_type, ref.gpu_count, engine, family, spec.precision, budget)


class Capacity:
    name = "capacity"
    section = "autoscale"
    Params = CapacityParams

    def initial_state(self) -> CapacityState:
        return CapacityState()

    def decide(
        self, snap: FleetSnapshot, params: CapacityParams, state: CapacityState, ctx: PolicyContext
    ) -> PolicyResult[CapacityState]:
        now = ctx.now_ms
        pid = ctx.pool_id
        window_ms = max(1, snap.window_ms)
        tick_s = max(ctx.tick_ms, 1) / 1000.0
        alpha = 1.0 - 0.5 ** (tick_s / params.halflife_s)
        lo, hi = params.bounds(pid)
        pool = snap.pools.get(pid)
        nodes = snap.pool_nodes(pid)
        if (nodes and all(n.stale for n in nodes)) or (not nodes and state.last_desired):
            return _hold(pid, nodes, state, lo, hi)
        p = _nodes(snap, ctx)
        t = _Tick(pool, p, state, params, now, window_ms, alpha)
        lead = _lead(t, nodes, pid)
        demand = _demand(t)
        mix, kv_per_call = _mix(t, lead.shape, demand.rates)
        speed = _speed(t, lead.key, mix, demand)
        slo = ctx.pool_slo(snap)
        per_node, rate_reasons = _node_calls(lead, mix, slo, speed.speed)
        fc = _forecast(t, lead, demand.arrivals)
        bursts = _bursts(t, lead, fc, demand.arrivals)
        need = _need(t, lead, per_node, bursts.bound, demand.arrivals)
        reasons = (*rate_reasons, *fc.reasons, *bursts.reasons, *need.reasons)
        target = _target(t, (lo, hi), lead, need.need, per_node, fc=fc, bursts=bursts, reasons=reasons)
        current = len(p.active)
        drain = _drain(p, current, target.desired)

        new_state = _next_state(t, lead, demand, kv_per_call, speed, fc=fc, bursts=bursts, target=target)
        decision = AutoscaleDecision(
            entity=f"pool/{pid}",
            pool_id=pid,
            current_nodes=current,
            desired_nodes=target.desired,
            drain=drain,
            reason=target.reason,
            inputs=_inputs(
                p,
                lead,
                demand,
                mix,
                kv_per_call,
                speed=speed,
                slo=slo,
                per_node=per_node,
                fc=fc,
                bursts=bursts,
                need=need,
                target=target,
            ),
        )
        diagnostics = {
            "need_nodes": r6(need.need),
            "desired_nodes": float(target.desired),
            "node_calls_per_s": r6(per_node),
        }
        return PolicyResult(decisions=(decision,), state=new_state, diagnostics=diagnostics)


# The steps of Capacity.decide, in its order: each reads what the steps before it found.


@dataclass(frozen=True, slots=True)
class _Tick:
    """What every step reads: the pool's window and nodes, the state, the parameters, the clock."""

    pool: PoolView | None
    p: _Pool
    state: CapacityState
    params: CapacityParams
    now: int
    window_ms: int
    alpha: float  # the EWMA weight of one tick over ``halflife_s``


@dataclass(frozen=True, slots=True)
class _Lead:
    """The lead (one cold start) and the pool's shape."""

    cold_start: float | None  # learned cold -> warm time
    not_warm_since: tuple[tuple[str, int], ...]
    key: ShapeKey | None
    shape: NodeShape | None
    lead_s: float
    lead_ms: float


def _lead(t: _Tick, nodes: Sequence[NodeView], pid: str) -> _Lead:
    p, state, params, now = t.p, t.state, t.params, t.now
    # The lead: cold starts seen, else the operator's figure, else the catalog's.
    cold_start, not_warm_since = cold_starts(
        state.cold_start_s,
        state.not_warm_since,
        now,
        ((n.node_id, n.stale, n.weights_state == "warm") for n in nodes),
    )
    ref = p.warm[0] if p.warm else (p.active[0] if p.active else None)
    key = _shape_key(ref, p.warm, params, pid)
    shape = shape_of(key) if key is not None else None
    if cold_start is not None:
        lead_s = cold_start
    elif params.cold_start_s is not None:
        lead_s = params.cold_start_s
    elif shape is not None:
        lead_s = sum(shape.spec.cold_start_medians(cached=False).values())  # the longer profile
    else:
        lead_s = 120.0
    lead_ms = lead_s * 1000.0
    return _Lead(cold_start, not_warm_since, key, shape, lead_s, lead_ms)


@dataclass(frozen=True, slots=True)
class _Demand:
    """The calls arriving at the pool, by flow balance."""

    calls: float  # new calls ended per second
    rates: tuple[float, float, float] | None  # smoothed (calls/s, prompt tokens/s, output tokens/s)
    in_system: tuple[tuple[int, int], ...]
    arrivals: float


def _demand(t: _Tick) -> _Demand:
    pool, p, state, now, window_ms, alpha = t.pool, t.p, t.state, t.now, t.window_ms, t.alpha
    # Demand: new calls ended in the window (a retry is the same call again), calls moved to
    # another model's pool, and the growth of the calls in the pool's nodes (arrived, not ended).
    calls = (pool.requests_w - pool.retries_w) / (window_ms / 1000.0) if pool is not None else 0.0
    calls = max(calls, 0.0)
    prompt_rate = pool.prompt_tokens_rate_per_s if pool is not None else 0.0
    output_rate = pool.output_tokens_rate_per_s if pool is not None else 0.0
    attempts = pool.request_rate_per_s if pool is not None else 0.0
    rates = state.rates
    if attempts > 0 or rates is not None:
        now_rates = (attempts, prompt_rate, output_rate)
        rates = (
            now_rates
            if rates is None
            else (
                _ewma(rates[0], attempts, alpha),
                _ewma(rates[1], prompt_rate, alpha),
                _ewma(rates[2], output_rate, alpha),
            )
        )
    per_call = (rates[1] + rates[2]) / rates[0] if rates is not None and rates[0] > 0 else 0.0
    diverted = (pool.diverted_tokens_rate_per_s / per_call) if pool is not None and per_call > 0 else 0.0
    # Flow balance: what arrived = what left + the change in what is inside. Calls lost with a
    # crashed node leave both at once (ended as errors, gone from inside), so they add nothing.
    in_now = sum(n.running_requests + n.queue_depth for n in p.serving)
    in_system = (*((t, x) for t, x in state.in_system if now - t <= window_ms), (now, in_now))
    span_s = (now - in_system[0][0]) / 1000.0
    growth = (in_now - in_system[0][1]) / span_s if span_s * 2000.0 >= window_ms else 0.0
    arrivals = max(0.0, calls + diverted + growth)
    return _Demand(calls, rates, in_system, arrivals)


def _mix(
    t: _Tick, shape: NodeShape | None, rates: tuple[float, float, float] | None
) -> tuple[Mix, float | None]:
    """The mix, and the KV tokens per running call learned so far."""
    p, state, alpha = t.p, t.state, t.alpha
    # The mix (smoothed over ``halflife_s``: a window holds few calls of a heavy-tailed size):
    # the mean attempt's prompt and output, and what of the prompt is prefilled.
    kv_per_call = state.kv_per_call
    running = sum(n.running_requests for n in p.serving)
    if shape is not None and running >= MIN_RUNNING:
        used = sum(n.kv_cache_used_frac for n in p.serving) * shape.kv_tokens
        kv_per_call = _ewma(kv_per_call, used / running, alpha)
    prompt = rates[1] / rates[0] if rates is not None and rates[0] > 0 else 0.0
    output = rates[2] / rates[0] if rates is not None and rates[0] > 0 else 0.0
    hit = sum(n.prefix_cache_hit_frac for n in p.serving) / len(p.serving) if p.serving else 0.0
    if kv_per_call is not None:
        uncached = min(prompt, max(1.0, kv_per_call - output / 2.0))
    else:
        uncached = prompt * (1.0 - min(max(hit, 0.0), 1.0))
    prompt = max(prompt, 1.0)
    uncached = min(prompt, max(uncached, 1.0))
    return Mix(prompt, prompt - uncached, max(output, 1.0), kv_per_call), kv_per_call


@dataclass(frozen=True, slots=True)
class _Speed:
    """The pool's speed against its physics."""

    slow: float | None  # learned iteration time over the physics'
    speed: float  # the factor applied (1 within the deadband)
    seen: float | None  # the nodes' median TBT, ms
    predicted: float | None  # the physics' median iteration, s


def _speed(t: _Tick, key: ShapeKey | None, mix: Mix, demand: _Demand) -> _Speed:
    p, state, alpha = t.p, t.state, t.alpha
    calls, arrivals = demand.calls, demand.arrivals
    # The pool's speed against its physics: the nodes' median TBT over the physics' median.
    slow = state.slow
    seen = predicted = None
    # Read only while no serving node holds a queue: the physics' steady state holds none, and a
    # node past its knee stretches its iterations with the batch it is capped at, which would read
    # as a slow pool, shrink its rate and ask for more nodes the more it is overloaded.
    queued_now = any(n.queue_depth > 0 for n in p.serving)
    if key is not None and len(p.serving) >= MIN_SPEED_NODES and calls > 0 and not queued_now:
        tbts = [n.tbt_p50_ms for n in p.serving if n.tbt_p50_ms is not None and n.running_requests > 0]
        seen = _median(tbts)
        predicted = median_step(key, mix, arrivals / len(p.serving))
        if seen is not None and predicted:
            ratio = min(max(seen / 1000.0 / predicted, SLOW_BOUNDS[0]), SLOW_BOUNDS[1])
            slow = math.exp(_ewma(math.log(slow) if slow is not None else None, math.log(ratio), alpha))
    # Within the deadband the physics stands (the readings' noise and the model's own error are
    # that large); past it the pool is slower (or faster) than its physics and sized so.
    speed = slow if slow is not None and not 1.0 / SLOW_DEADBAND < slow < SLOW_DEADBAND else 1.0
    return _Speed(slow, speed, seen, predicted)


def _node_calls(lead: _Lead, mix: Mix, slo: Slo, speed: float) -> tuple[float, tuple[str, ...]]:
    """One node's calls/s, and the reason when the SLO had to be held to the idle node's knee."""
    # One node's calls/s within the SLO of the calls the pool serves.
    key, shape = lead.key, lead.shape
    targets = Targets(slo.tbt_ms / 1000.0, slo.ttft_ms / 1000.0)
    per_node = node_rate(key, mix, targets, speed) if key is not None else 0.0
    if key is not None and shape is not None and per_node <= 0.0:
        idle = steady(shape, mix, 0.0, slow=speed)
        if idle is not None:
            targets = Targets(
                max(targets.tbt_s, IDLE_KNEE * idle.step_s), max(targets.ttft_s, IDLE_KNEE * idle.ttft_s)
            )
            per_node = node_rate(key, mix, targets, speed)
            return per_node, ("slo-below-idle",)
    return per_node, ()


@dataclass(frozen=True, slots=True)
class _Forecast:
    """The forecast over one lead, its spread, and the upper bound before bursts."""

    history: tuple[Sample, ...]  # the demand samples within the horizon
    forecast: float
    open_wf: tuple[tuple[int, int, int, int], ...]
    accumulating: bool
    sigma: float
    z: float
    bound: float
    reasons: tuple[str, ...]


def _forecast(t: _Tick, lead: _Lead, arrivals: float) -> _Forecast:
    pool, state, params, now, window_ms = t.pool, t.state, t.params, t.now, t.window_ms
    # The forecast over one lead, its spread, and the upper bound the pool is sized for.
    lead_s, lead_ms = lead.lead_s, lead.lead_ms
    reasons: tuple[str, ...] = ()
    horizon_ms = max(2.0 * lead_ms, 3.0 * window_ms)
    history = tuple(s for s in state.demand if now - s[0] <= horizon_ms)
    series = [(s[0], s[1]) for s in history] + [(now, arrivals)]
    full = bool(state.demand) and now - state.demand[0][0] >= lead_ms
    recent = [s for s in series if now - s[0] <= max(lead_ms, 3.0 * window_ms)]
    slope = trend_slope(recent, window_ms) if full else 0.0
    forecast = arrivals + slope * lead_s
    counts = (
        (now, pool.open_workflows, pool.workflows_started, pool.workflows_ended)
        if pool is not None
        else (now, 0, 0, 0)
    )
    open_wf = (*(o for o in state.open_workflows if now - o[0] <= lead_ms), counts)
    rise, churn = accumulation(open_wf) if full else (0.0, 0.0)
    accumulating = rise > ACCUMULATION_Z * churn
    if accumulating and counts[1] > 0:
        forecast *= (counts[1] + rise) / counts[1]  # open tasks keep calling: as many again a lead on
        reasons = ("workflows-accumulating",)
    spread = lagged_spread(series, lead_ms, window_ms, slope)
    sigma = max(spread or 0.0, counting_spread(arrivals, window_ms))
    z = NormalDist().inv_cdf(params.coverage)
    bound = forecast + z * sigma
    return _Forecast(history, forecast, open_wf, accumulating, sigma, z, bound, reasons)


@dataclass(frozen=True, slots=True)
class _Bursts:
    """The burst under way, the bursts remembered, and the bound they raise."""

    failed_tasks: int  # the pool's failed-task count now
    episode: Episode | None
    bursts: tuple[Burst, ...]
    remembered: list[Burst]
    bound: float
    reasons: tuple[str, ...]


def _bursts(t: _Tick, lead: _Lead, fc: _Forecast, arrivals: float) -> _Bursts:
    pool, state, params, now = t.pool, t.state, t.params, t.now
    # Bursts: an episode opens when demand breaks the bound planned a lead ago; a big one is
    # remembered. A remembered burst sizes the pool for its peak when the next one starts, and a
    # burst that rose faster than a cold start and cost tasks is held in reserve.
    bound = fc.bound
    reasons: list[str] = []
    failed_tasks = pool.tasks_failed if pool is not None else state.failed_tasks
    episode, ended = follow_episode(
        state.episode,
        now=now,
        arrivals=arrivals,
        then=plan_then(fc.history, now, lead.lead_ms),
        z=fc.z,
        failed_tasks=failed_tasks,
    )
    bursts = state.bursts
    if ended is not None and params.max_bursts > 0:
        bursts = (*bursts, ended)[-params.max_bursts :]
    remembered = [b for b in bursts if now - b.start_ms <= params.memory_s * 1000.0]
    if episode is not None and remembered:
        shape_b = max(remembered, key=_burst_key)
        if (now - episode.start_ms) / 1000.0 <= shape_b.duration_s and episode.base * shape_b.ratio > bound:
            bound = episode.base * shape_b.ratio
            reasons.append("burst-remembered")
    costly = [b for b in remembered if b.lost_tasks > 0 and b.rise_s < lead.lead_s]
    if costly:
        # The peak it reached, in calls/s: between bursts that is the forecast times the ratio;
        # with demand already at burst level it adds nothing (a ratio of a ratio is no burst seen).
        reserve = max(b.base * b.ratio for b in costly)
        if reserve > bound:
            bound = reserve
            reasons.append("burst-reserve")
    return _Bursts(failed_tasks, episode, bursts, remembered, bound, tuple(reasons))


@dataclass(frozen=True, slots=True)
class _Need:
    queued: int
    need: float  # nodes
    reasons: tuple[str, ...]


def _need(t: _Tick, lead: _Lead, per_node: float, bound: float, arrivals: float) -> _Need:
    p, params, window_ms = t.p, t.params, t.window_ms
    # The need: the bound's calls and the queued backlog (spread over a lead: nodes bought now
    # serve only after one) over one node's calls/s.
    reasons: tuple[str, ...] = ()
    queued = sum(n.queue_depth for n in p.active)
    demand_calls = bound + queued / max(lead.lead_s, window_ms / 1000.0)
    if per_node > 0.0:
        need = demand_calls / per_node
    elif lead.shape is None and p.warm:
        need = len(p.warm) * _pressure(p.warm)  # no physics for this node: engine signals
        reasons = ("no-physics",)
    else:
        need = float(len(p.active))
    if need > 0 and arrivals > 0:
        need += params.spare_nodes
    need = min(max(need, 0.0), MAX_NEED_NODES)
    return _Need(queued, need, reasons)


@dataclass(frozen=True, slots=True)
class _Target:
    raw: int  # the need's nodes within bounds
    desired: int
    reason: str
    recs: tuple[tuple[int, int], ...]
    last_failure: int | None


def _target(
    t: _Tick,
    bounds: tuple[int, int],
    lead: _Lead,
    need: float,
    per_node: float,
    *,
    fc: _Forecast,
    bursts: _Bursts,
    reasons: Sequence[str],
) -> _Target:
    # The target: up at once; down to the highest need of the down window, not while tasks
    # fail or accumulate, a remembered burst is under way, or before a window of history.
    p, state, params, now, window_ms = t.p, t.state, t.params, t.now, t.window_ms
    lo, hi = bounds
    current, n_warm = len(p.active), len(p.warm)
    raw = min(max(math.ceil(need - 1e-9), lo), hi)
    down_ms = (params.down_window_s if params.down_window_s is not None else lead.lead_s) * 1000.0
    first = () if state.last_desired is not None else ((now, current),)
    recs = (*first, *((t, r) for t, r in state.recs if now - t <= down_ms), (now, raw))
    last_failure = state.last_failure_ms
    if bursts.failed_tasks > state.failed_tasks and state.last_desired is not None:
        last_failure = now
    failing = last_failure is not None and now - last_failure <= lead.lead_ms
    settled = bool(state.demand) and now - state.demand[0][0] >= max(window_ms, down_ms)
    if current == 0:
        desired, reason = max(raw, lo), "no-active-node"
    elif not n_warm and per_node <= 0.0:
        desired, reason = current, "nothing-warm-yet"
    elif raw > current:
        desired, reason = raw, "scale-up"
    elif raw == current:
        desired, reason = current, "at-need"
    else:
        ceiling = max(r for _, r in recs)
        desired, reason = min(current, ceiling), "scale-down"
        if not settled:
            desired, reason = current, "scale-down-held-settling"
        elif failing:
            desired, reason = current, "scale-down-held-tasks-failing"
        elif fc.accumulating:
            desired, reason = current, "scale-down-held-tasks-accumulating"
        elif bursts.episode is not None and bursts.remembered:
            desired, reason = current, "scale-down-held-burst"
        elif desired == current:
            reason = "scale-down-stabilized"
    clamped = min(max(desired, lo), hi)
    if clamped != desired:
        reason = "at-max-nodes" if clamped < desired else "at-min-nodes"
        desired = clamped
    if reasons and reason in ("scale-up", "at-need", "scale-down"):
        reason = f"{reason}-{reasons[-1]}"
    return _Target(raw, desired, reason, recs, last_failure)


def _drain(p: _Pool, current: int, desired: int) -> tuple[str, ...]:
    """The nodes to drain down to the target (the engine holds them on the pool's drain list)."""
    if desired < current:
        return tuple(n.node_id for n in drain_order(p.active)[: current - desired])
    return ()


def _next_state(
    t: _Tick,
    lead: _Lead,
    demand: _Demand,
    kv_per_call: float | None,
    speed: _Speed,
    *,
    fc: _Forecast,
    bursts: _Bursts,
    target: _Target,
) -> CapacityState:
    """What the next tick reads: this tick's plan joins the demand history, the figures learned."""
    return CapacityState(
        demand=(*fc.history, (t.now, demand.arrivals, fc.forecast, bursts.bound)),
        in_system=demand.in_system,
        cold_start_s=lead.cold_start,
        rates=demand.rates,
        not_warm_since=lead.not_warm_since,
        kv_per_call=kv_per_call,
        slow=speed.slow,
        recs=target.recs,
        last_desired=target.desired,
        failed_tasks=bursts.failed_tasks,
        last_failure_ms=target.last_failure,
        open_workflows=fc.open_wf,
        episode=bursts.episode,
        bursts=bursts.bursts,
    )


def _inputs(
    p: _Pool,
    lead: _Lead,
    demand: _Demand,
    mix: Mix,
    kv_per_call: float | None,
    *,
    speed: _Speed,
    slo: Slo,
    per_node: float,
    fc: _Forecast,
    bursts: _Bursts,
    need: _Need,
    target: _Target,
) -> dict[str, float]:
    """The decision's inputs: every figure the target rests on."""
    slow = speed.slow
    inputs = {
        "warm_nodes": float(len(p.warm)),
        "arriving_nodes": float(len(p.arriving)),
        "arrivals_per_s": r6(demand.arrivals),
        "forecast_per_s": r6(fc.forecast),
        "bound_per_s": r6(bursts.bound),
        "sigma_per_s": r6(fc.sigma),
        "node_calls_per_s": r6(per_node),
        "need_nodes": r6(need.need),
        "raw_desired": float(target.raw),
        "lead_s": r6(lead.lead_s),
        "speed": r6(speed.speed),
        "speed_seen": r6(slow if slow is not None else 1.0),
        "prompt_tokens": r6(mix.prompt),
        "prefilled_tokens": r6(mix.uncached),
        "output_tokens": r6(mix.output),
        "tbt_slo_ms": r6(slo.tbt_ms),
        "ttft_slo_ms": r6(slo.ttft_ms),
        "queued": float(need.queued),
        "bursts": float(len(bursts.remembered)),
    }
    if kv_per_call is not None:
        inputs["kv_per_call"] = r6(kv_per_call)
    if speed.seen is not None and speed.predicted:
        inputs["tbt_p50_seen_ms"] = r6(speed.seen)
        inputs["tbt_p50_physics_ms"] = r6(speed.predicted * 1000.0)
    return inputs


def _hold(
    pid: str, nodes: Sequence[NodeView], state: CapacityState, lo: int, hi: int
) -> PolicyResult[CapacityState]:
    """Fail static: the pool's nodes report nothing fresh (every row stale, or the rows gone from a
    pool that had nodes). Its size and demand are unknown, which is not zero: the target stays where
    it was (else at the nodes last seen), nothing is drained, and the state learns nothing from the
    silence (no zero demand enters the forecast, no scale-down window moves)."""
    seen = sum(1 for n in nodes if not n.draining)
    held = min(max(state.last_desired if state.last_desired is not None else seen, lo), hi)
    decision = AutoscaleDecision(
        entity=f"pool/{pid}",
        pool_id=pid,
        current_nodes=seen,
        desired_nodes=held,
        drain=(),
        reason="held-no-telemetry",
        inputs={"stale_nodes": float(len(nodes)), "raw_desired": float(held)},
    )
    return PolicyResult(decisions=(decision,), state=state, diagnostics={"desired_nodes": float(held)})


def _burst_key(b: Burst) -> tuple[float, int]:
    return (b.ratio, b.start_ms)


def _pressure(warm: Sequence[NodeView]) -> float:
    """Without a physics for the pool's nodes: the engine's own signals, KV use over 80% and a queue
    on every node (the modern baseline's), as a multiple of the warm nodes."""
    kv = sum(n.kv_cache_used_frac for n in warm) / len(warm) / 0.8
    waiting = sum(n.queue_depth for n in warm)
    running = sum(n.running_requests for n in warm)
    queue = (running + waiting) / max(running, 1) if waiting >= len(warm) else 0.0
    return max(kv, queue, 1.0)
