"""hpa: the Kubernetes Horizontal Pod Autoscaler on GPU utilization, as the ``classic`` autoscaler.

What it does: every sync period (15 s of event time) it computes the HPA's replica count from the
pool's GPU utilization against a 70% target, exactly as ``ReplicaCalculator.GetResourceReplicas``
does for a resource-utilization metric (``pkg/controller/podautoscaler/replica_calculator.go``),
then normalizes it as ``HorizontalController.normalizeDesiredReplicasWithBehaviors``
(``horizontal.go``) does with the default ``behavior``: scale up at once, by at most
max(100%, 4 pods) per 15 s; scale down to the highest recommendation of the last 300 s, by at most
100% per 15 s; always within ``[min_replicas, max_replicas]``. Between syncs it keeps publishing
the last target (the scale target's ``spec.replicas``).

Formula, at each sync (``now - last_sync >= sync_period``)::

    current  = spec.replicas: the target set at the previous sync (first sync: nodes not draining)
    pods     = the pool's nodes; draining ones are ignored (a pod being deleted)
    request_i = 1000 * gpu_count_i milli-GPU; usage_i = round(gpu_util_frac_i * request_i)
    unready  = pods not warm (cold or loading: Pending / not Ready); missing = warm but stale
    util%    = floor(100 * sum(usage) / sum(request)) over ready pods with a metric
    ratio    = util% / target%
    if no unready-on-scale-up and nothing missing:
        desired = current                      if 1 - tolerance <= ratio <= 1 + tolerance
                = ceil(ratio * ready)          otherwise
    else: missing pods count max(100, target)% of their request when ratio < 1 (scale down) and 0%
          when ratio > 1 (scale up); unready pods count 0% when ratio > 1; recompute ratio' over
          these pods; keep ``current`` if ratio' is within tolerance or flips direction, else
          desired = ceil(ratio' * #pods counted) unless that flips direction against current.
    stabilized = clamp(current, min(recs in up window), max(recs in down window))  # recs incl. desired
    limited    = min(stabilized, max_replicas, max over up-policies(period start + allowance))
                 or max(stabilized, min_replicas, min over down-policies(period start - allowance))
    period start = current - replicas added + replicas removed within the policy's period
    out of range first: current > max -> max; current < min -> min; current == 0 < min -> 0

Inputs: per node ``gpu_util_frac``, ``gpu_count``, ``weights_state``, ``draining``, ``stale``; event
time ``ctx.now_ms``. State: last sync time and target, the recommendation history (for
stabilization; the first sync records ``current`` as Kubernetes' ``recordInitialRecommendation``
does) and the scale events (for the rate policies), all immutable tuples.

Parameters (defaults, bounds): ``target_utilization_pct`` 70 (1-1000, an integer percentage like
``averageUtilization``), ``tolerance`` 0.1 (0-1, ``--horizontal-pod-autoscaler-tolerance``),
``sync_period_ms`` 15 000 (``--horizontal-pod-autoscaler-sync-period``), ``min_replicas`` 1,
``max_replicas`` 1000, ``pools`` per-pool ``{min_replicas, max_replicas}`` overrides,
``scale_up`` {stabilization 0 s, select Max, Percent 100 / 15 s, Pods 4 / 15 s}, ``scale_down``
{stabilization 300 s (``--horizontal-pod-autoscaler-downscale-stabilization``), select Max,
Percent 100 / 15 s}: Kubernetes' documented default behavior.

Departures: an HPA object with no ``behavior`` at all takes Kubernetes' legacy path, whose scale-up
cap is max(2 x current, 4) per sync instead of max(2 x current, current + 4); this follows the
documented default behavior, as the baseline spec asks. The CPU-only readiness heuristics (a pod's
first minutes after start) become "not warm = unready": loading weights is our initialization
period. Nodes, not pods: one node is one replica.

Trade-offs: simple, well understood and conservative on scale-down; but utilization is a lagging
signal for LLM serving (a GPU can be 100% busy at a healthy queue or at a hopeless one), cold starts
of minutes make reactive scaling late, and it knows nothing of queues, SLOs or cost.

Failure mode: with no fresh metric from any warm node it keeps the current target (Kubernetes:
``FailedGetResourceMetric``, no scaling); during a spike every new node is unready for its whole
cold start and counted at 0%, which damps further scale-up until the weights are loaded. A pool
that has reported no node yet is not synced (its size would read as 0, which disables an HPA).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Self

from pydantic import Field, model_validator

from fleetloop.policies.base import FleetSnapshot, NodeView, Params, PolicyContext, PolicyResult
from fleetloop.schemas.decisions import AutoscaleDecision

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
# (event time ms, replicas) and (event time ms, replica change)
Recommendation = tuple[int, int]
ScaleEvent = tuple[int, int]


class ScalingPolicy(Params):
    type: Literal["Pods", "Percent"]
    value: int = Field(gt=0, le=100_000)
    period_s: int = Field(gt=0, le=1800)


class ScalingRules(Params):
    stabilization_window_s: int = Field(ge=0, le=3600)
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"
    policies: tuple[ScalingPolicy, ...] = ()


DEFAULT_SCALE_UP = ScalingRules(
    stabilization_window_s=0,
    select_policy="Max",
    policies=(
        ScalingPolicy(type="Pods", value=4, period_s=15),
        ScalingPolicy(type="Percent", value=100, period_s=15),
    ),
)
DEFAULT_SCALE_DOWN = ScalingRules(
    stabilization_window_s=300,
    select_policy="Max",
    policies=(ScalingPolicy(type="Percent", value=100, period_s=15),),
)


class PoolBounds(Params):
    min_replicas: int = Field(ge=0, le=100_000)
    max_replicas: int = Field(ge=1, le=100_000)


class ReplicaBounds(Params):
    """``min_replicas``, ``max_replicas`` and per-pool overrides, checked in order (for autoscalers
    built on :func:`sync`)."""

    min_replicas: int = Field(default=1, ge=0, le=100_000)
    max_replicas: int = Field(default=1000, ge=1, le=100_000)
    pools: dict[str, PoolBounds] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        for name, lo, hi in [("", self.min_replicas, self.max_replicas)] + [
            (f"pools.{p}.", b.min_replicas, b.max_replicas) for p, b in sorted(self.pools.items())
        ]:
            if lo > hi:
                raise ValueError(f"{name}min_replicas ({lo}) is above {name}max_replicas ({hi})")
        return self

    def bounds(self, pool_id: str) -> tuple[int, int]:
        b = self.pools.get(pool_id)
        return (b.min_replicas, b.max_replicas) if b is not None else (self.min_replicas, self.max_replicas)


class HpaParams(ReplicaBounds):
    target_utilization_pct: int = Field(default=70, ge=1, le=1000)
    tolerance: float = Field(default=0.1, ge=0.0, le=1.0)
    sync_period_ms: int = Field(default=15_000, ge=1, le=600_000)
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN


@dataclass(frozen=True, slots=True)
class HpaState:
    last_sync_ms: int | None = None
    last_desired: int | None = None  # spec.replicas as the HPA last set it
    recommendations: tuple[Recommendation, ...] | None = None  # None: never synced
    scale_up_events: tuple[ScaleEvent, ...] = ()
    scale_down_events: tuple[ScaleEvent, ...] = ()


@dataclass(frozen=True, slots=True)
class Calculation:
    """The replica calculator's answer; ``replicas`` is None when no ready pod has a metric."""

    replicas: int | None
    utilization_pct: int
    ready: int
    unready: int
    missing: int
    ignored: int


def _within(ratio: float, tolerance: float) -> bool:
    """``Tolerances.isWithin`` (Kubernetes 1.33+), with the same tolerance both ways."""
    return (1.0 - tolerance) <= ratio <= (1.0 + tolerance)


def utilization_ratio(
    metrics: Mapping[str, int], requests: Mapping[str, int], target_pct: int
) -> tuple[float, int]:
    """``GetResourceUtilizationRatio``: the integer utilization percentage and its ratio to target."""
    used = sum(metrics.values())
    requested = sum(requests[k] for k in metrics)
    utilization = (used * 100) // requested
    return utilization / target_pct, utilization


def calculate_replicas(
    nodes: Sequence[NodeView], current: int, target_pct: int, tolerance: float
) -> Calculation:
    """``ReplicaCalculator.GetResourceReplicas`` with ``groupPods``, nodes standing in for pods."""
    requests: dict[str, int] = {}
    metrics: dict[str, int] = {}
    unready: list[str] = []
    missing: list[str] = []
    ignored = 0
    for n in sorted(nodes, key=lambda v: v.node_id):
        if n.draining:  # DeletionTimestamp set / Failed: ignored altogether
            ignored += 1
            continue
        requests[n.node_id] = 1000 * n.gpu_count
        if n.weights_state != "warm":  # Pending, or not Ready: unready
            unready.append(n.node_id)
        elif n.stale:  # no fresh metric: missing
            missing.append(n.node_id)
        else:
            metrics[n.node_id] = round(n.gpu_util_frac * requests[n.node_id])
    ready = len(metrics)
    if not metrics:
        return Calculation(None, 0, 0, len(unready), len(missing), ignored)
    ratio, utilization = utilization_ratio(metrics, requests, target_pct)

    def done(replicas: int) -> Calculation:
        return Calculation(replicas, utilization, ready, len(unready), len(missing), ignored)

    scale_up_with_unready = bool(unready) and ratio > 1.0
    if not scale_up_with_unready and not missing:
        if _within(ratio, tolerance):
            return done(current)
        return done(math.ceil(ratio * ready))
    if missing:
        if ratio < 1.0:  # scale down: a missing pod counts as using max(100%, target) of its request
            fallback = max(100, target_pct)
            metrics.update({m: requests[m] * fallback // 100 for m in missing})
        elif ratio > 1.0:  # scale up: a missing pod counts as idle
            metrics.update(dict.fromkeys(missing, 0))
    if scale_up_with_unready:
        metrics.update(dict.fromkeys(unready, 0))
    new_ratio, _ = utilization_ratio(metrics, requests, target_pct)
    if _within(new_ratio, tolerance) or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return done(current)
    new_replicas = math.ceil(new_ratio * len(metrics))
    if (new_ratio < 1.0 and new_replicas > current) or (new_ratio > 1.0 and new_replicas < current):
        return done(current)
    return done(new_replicas)


def stabilize(
    recommendations: Sequence[Recommendation],
    desired: int,
    current: int,
    *,
    now_ms: int,
    up_window_ms: int,
    down_window_ms: int,
) -> tuple[int, tuple[Recommendation, ...]]:
    """``stabilizeRecommendationWithBehaviors``: clamp ``current`` between the lowest recommendation
    of the up window and the highest of the down window (both including ``desired``), and record
    ``desired``, reusing the last slot that is older than both windows."""
    up_cutoff = now_ms - up_window_ms
    down_cutoff = now_ms - down_window_ms
    up_rec = down_rec = desired
    reuse: int | None = None
    for i, (ts, rec) in enumerate(recommendations):
        if ts > up_cutoff:
            up_rec = min(rec, up_rec)
        if ts > down_cutoff:
            down_rec = max(rec, down_rec)
        if ts < up_cutoff and ts < down_cutoff:
            reuse = i
    recommendation = max(current, up_rec)
    recommendation = min(recommendation, down_rec)
    recs = list(recommendations)
    if reuse is not None:
        recs[reuse] = (now_ms, desired)
    else:
        recs.append((now_ms, desired))
    return recommendation, tuple(recs)


def replicas_change_per_period(period_s: int, events: Sequence[ScaleEvent], now_ms: int) -> int:
    """``getReplicasChangePerPeriod``: replicas changed by events strictly within the period."""
    cutoff = now_ms - period_s * 1000
    return sum(change for ts, change in events if ts > cutoff)


def scale_up_limit(
    current: int, up: Sequence[ScaleEvent], down: Sequence[ScaleEvent], rules: ScalingRules, now_ms: int
) -> int:
    """``calculateScaleUpLimitWithScalingRules``."""
    if rules.select_policy == "Disabled":
        return current
    pick = min if rules.select_policy == "Min" else max
    result = INT32_MAX if rules.select_policy == "Min" else INT32_MIN
    for p in rules.policies:
        start = (
            current
            - replicas_change_per_period(p.period_s, up, now_ms)
            + replicas_change_per_period(p.period_s, down, now_ms)
        )
        proposed = start + p.value if p.type == "Pods" else math.ceil(start * (1 + p.value / 100))
        result = pick(result, proposed)
    return result


def scale_down_limit(
    current: int, up: Sequence[ScaleEvent], down: Sequence[ScaleEvent], rules: ScalingRules, now_ms: int
) -> int:
    """``calculateScaleDownLimitWithBehaviors``."""
    if rules.select_policy == "Disabled":
        return current
    pick = max if rules.select_policy == "Min" else min
    result = INT32_MIN if rules.select_policy == "Min" else INT32_MAX
    for p in rules.policies:
        start = (
            current
            - replicas_change_per_period(p.period_s, up, now_ms)
            + replicas_change_per_period(p.period_s, down, now_ms)
        )
        proposed = start - p.value if p.type == "Pods" else int(start * (1 - p.value / 100))
        result = pick(result, proposed)
    return result


def limit_rate(
    current: int,
    desired: int,
    *,
    min_replicas: int,
    max_replicas: int,
    up: Sequence[ScaleEvent],
    down: Sequence[ScaleEvent],
    up_rules: ScalingRules,
    down_rules: ScalingRules,
    now_ms: int,
) -> tuple[int, str]:
    """``convertDesiredReplicasWithBehaviorRate``: returns the replicas and the condition reason."""
    if desired > current:
        limit = max(scale_up_limit(current, up, down, up_rules, now_ms), current)
        if max_replicas > limit:
            maximum, reason = limit, "ScaleUpLimit"
        else:
            maximum, reason = max_replicas, "TooManyReplicas"
        if desired > maximum:
            return maximum, reason
    elif desired < current:
        limit = min(scale_down_limit(current, up, down, down_rules, now_ms), current)
        if min_replicas < limit:
            minimum, reason = limit, "ScaleDownLimit"
        else:
            minimum, reason = min_replicas, "TooFewReplicas"
        if desired < minimum:
            return minimum, reason
    return desired, "DesiredWithinRange"


def _kebab(reason: str) -> str:
    return "".join(f"-{c.lower()}" if c.isupper() else c for c in reason).lstrip("-")


def drain_order(nodes: Sequence[NodeView]) -> list[NodeView]:
    """Which nodes go first on a scale-down, after the ReplicaSet controller's ``ActivePods`` order:
    not started (cold) before starting (loading) before running, unknown (stale) before fresh, and
    newest first (node ids stand in for creation time, highest first)."""
    rank = {"cold": 0, "loading": 1}
    by_id = sorted(nodes, key=lambda n: n.node_id, reverse=True)
    return sorted(by_id, key=lambda n: (rank.get(n.weights_state, 2), 0 if n.stale else 1))


Recommend = Callable[[int], tuple[int | None, dict[str, float]]]


def sync(
    ctx: PolicyContext,
    nodes: Sequence[NodeView],
    state: HpaState,
    *,
    sync_period_ms: int,
    bounds: tuple[int, int],
    up_rules: ScalingRules,
    down_rules: ScalingRules,
    recommend: Recommend,
    inputs: dict[str, float],
    zero_disables: bool,
) -> PolicyResult[HpaState]:
    """One HPA sync around a metric (``reconcileAutoscaler``): hold between syncs, clamp to the
    replica bounds, ``recommend(spec_replicas)`` -> (metric replicas or None, inputs), then the
    stabilization window and the behavior's rate limits, and the scale events kept for them.
    ``zero_disables``: spec.replicas 0 with a non-zero minimum disables scaling (Kubernetes HPA;
    KEDA's scale-to-zero does not). Shared by ``hpa`` and ``keda-engine``."""
    now = ctx.now_ms
    active = [n for n in nodes if not n.draining]
    if state.last_sync_ms is not None and now - state.last_sync_ms < sync_period_ms:
        desired = state.last_desired if state.last_desired is not None else len(active)
        hold = {
            "spec_replicas": float(desired),
            "next_sync_ms": float(state.last_sync_ms + sync_period_ms),
        }
        return PolicyResult(decisions=(_decision(ctx, active, desired, "between-syncs", hold),), state=state)

    if state.last_desired is None and not active:
        # No scale target to read yet (the pool has reported no node): nothing to sync against.
        # Syncing now would take 0 as spec.replicas, which disables the HPA for good.
        return PolicyResult(decisions=(_decision(ctx, active, 0, "no-nodes-yet", {}),), state=state)
    current = state.last_desired if state.last_desired is not None else len(active)
    lo, hi = bounds
    recs = state.recommendations if state.recommendations is not None else ((now, current),)
    inputs = {"spec_replicas": float(current), **inputs}
    if zero_disables and current == 0 and lo != 0:
        desired, reason = 0, "scaling-disabled"
    elif current > hi:
        desired, reason = hi, "above-max-replicas"
    elif current < lo:
        desired, reason = lo, "below-min-replicas"
    else:
        wanted, more = recommend(current)
        inputs.update(more)
        if wanted is None:
            desired, reason = current, "no-metrics"
        else:
            stabilized, recs = stabilize(
                recs,
                wanted,
                current,
                now_ms=now,
                up_window_ms=up_rules.stabilization_window_s * 1000,
                down_window_ms=down_rules.stabilization_window_s * 1000,
            )
            inputs["stabilized"] = float(stabilized)
            desired, condition = limit_rate(
                current,
                stabilized,
                min_replicas=lo,
                max_replicas=hi,
                up=state.scale_up_events,
                down=state.scale_down_events,
                up_rules=up_rules,
                down_rules=down_rules,
                now_ms=now,
            )
            if condition != "DesiredWithinRange":
                reason = _kebab(condition)
            elif stabilized != wanted:
                reason = "scale-up-stabilized" if wanted > current else "scale-down-stabilized"
            else:
                reason = "scale-up" if desired > current else "scale-down" if desired < current else "steady"

    up_events, down_events = state.scale_up_events, state.scale_down_events
    if desired != current:
        horizon = max((p.period_s for p in (*up_rules.policies, *down_rules.policies)), default=0)
        cutoff = now - horizon * 1000
        up_events = tuple(e for e in up_events if e[0] > cutoff)
        down_events = tuple(e for e in down_events if e[0] > cutoff)
        if desired > current:
            up_events = (*up_events, (now, desired - current))
        else:
            down_events = (*down_events, (now, current - desired))
    new_state = HpaState(
        last_sync_ms=now,
        last_desired=desired,
        recommendations=recs,
        scale_up_events=up_events,
        scale_down_events=down_events,
    )
    return PolicyResult(decisions=(_decision(ctx, active, desired, reason, inputs),), state=new_state)


def _decision(
    ctx: PolicyContext, active: Sequence[NodeView], desired: int, reason: str, inputs: dict[str, float]
) -> AutoscaleDecision:
    surplus = len(active) - desired
    drain = tuple(n.node_id for n in drain_order(active)[:surplus]) if surplus > 0 else ()
    return AutoscaleDecision(
        entity=f"pool/{ctx.pool_id}",
        pool_id=ctx.pool_id,
        current_nodes=len(active),
        desired_nodes=desired,
        drain=drain,
        reason=reason,
        inputs=inputs,
    )


class Hpa:
    name = "hpa"
    section = "autoscale"
    Params = HpaParams

    def initial_state(self) -> HpaState:
        return HpaState()

    def decide(
        self, snap: FleetSnapshot, params: HpaParams, state: HpaState, ctx: PolicyContext
    ) -> PolicyResult[HpaState]:
        nodes = snap.pool_nodes(ctx.pool_id)

        def recommend(current: int) -> tuple[int | None, dict[str, float]]:
            calc = calculate_replicas(nodes, current, params.target_utilization_pct, params.tolerance)
            more = {
                "utilization_pct": float(calc.utilization_pct),
                "ready_nodes": float(calc.ready),
                "unready_nodes": float(calc.unready),
                "missing_nodes": float(calc.missing),
                "ignored_nodes": float(calc.ignored),
            }
            if calc.replicas is not None:
                more["metric_desired"] = float(calc.replicas)
            return calc.replicas, more

        return sync(
            ctx,
            nodes,
            state,
            sync_period_ms=params.sync_period_ms,
            bounds=params.bounds(ctx.pool_id),
            up_rules=params.scale_up,
            down_rules=params.scale_down,
            recommend=recommend,
            inputs={"target_utilization_pct": float(params.target_utilization_pct)},
            zero_disables=True,
        )
