"""The HPA's controller (``pkg/controller/podautoscaler/horizontal.go``) around any metric: the
sync period, the replica bounds, the stabilization window, the behavior's rate limits, the scale
events kept for them and the decision (README.md beside this file: "Formula"). One implementation
for ``hpa`` and the KEDA-generated HPAs (``keda-engine``, ``keda-epp``): :class:`HpaController` is
the policy, and each autoscaler a subclass giving only its metric (:data:`Metric`). Pure: event time
only.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from fleetloop.policies.autoscale.hpa.params import ScalingRules, SyncParams
from fleetloop.policies.base import FleetSnapshot, NodeView, PolicyContext, PolicyResult
from fleetloop.schemas.decisions import AutoscaleDecision

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
# (event time ms, replicas) and (event time ms, replica change)
Recommendation = tuple[int, int]
ScaleEvent = tuple[int, int]


@dataclass(frozen=True, slots=True)
class HpaState:
    last_sync_ms: int | None = None
    last_desired: int | None = None  # spec.replicas as the HPA last set it
    recommendations: tuple[Recommendation, ...] | None = None  # None: never synced
    scale_up_events: tuple[ScaleEvent, ...] = ()
    scale_down_events: tuple[ScaleEvent, ...] = ()


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
    return _rate_limit(current, up, down, rules, now_ms, rising=True)


def scale_down_limit(
    current: int, up: Sequence[ScaleEvent], down: Sequence[ScaleEvent], rules: ScalingRules, now_ms: int
) -> int:
    """``calculateScaleDownLimitWithBehaviors``."""
    return _rate_limit(current, up, down, rules, now_ms, rising=False)


def _rate_limit(
    current: int,
    up: Sequence[ScaleEvent],
    down: Sequence[ScaleEvent],
    rules: ScalingRules,
    now_ms: int,
    *,
    rising: bool,
) -> int:
    """The limit of one direction's policies: each policy's allowance added to (``rising``) or taken
    from the replicas at the start of its period, the most permissive (``select_policy`` Max) or the
    least (Min) of them; ``current`` when the direction is disabled."""
    if rules.select_policy == "Disabled":
        return current
    lowest = (rules.select_policy == "Min") == rising  # the limit is the lowest of the proposals
    pick = min if lowest else max
    result = INT32_MAX if lowest else INT32_MIN
    for p in rules.policies:
        start = (
            current
            - replicas_change_per_period(p.period_s, up, now_ms)
            + replicas_change_per_period(p.period_s, down, now_ms)
        )
        if rising:
            proposed = start + p.value if p.type == "Pods" else math.ceil(start * (1 + p.value / 100))
        else:
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
    KEDA's scale-to-zero does not). Every HPA-based autoscaler's (:class:`HpaController`)."""
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


# The pool's nodes and spec.replicas -> the metric's replica count (None: no metric) and its inputs.
Metric = Callable[[tuple[NodeView, ...], int], tuple[int | None, dict[str, float]]]


P = TypeVar("P", bound=SyncParams)


class HpaController(abc.ABC, Generic[P]):
    """An HPA on one metric as a policy of the autoscale section: the subclass names the algorithm and
    gives :meth:`metric` (and, for ``hpa``, the inputs every decision carries and the Kubernetes HPA's
    scale-to-zero disabling; a KEDA-generated HPA has neither)."""

    section = "autoscale"
    zero_disables = False

    def initial_state(self) -> HpaState:
        return HpaState()

    @abc.abstractmethod
    def metric(self, params: P) -> Metric:
        raise NotImplementedError

    def inputs(self, params: P) -> dict[str, float]:
        return {}

    def decide(
        self, snap: FleetSnapshot, params: P, state: HpaState, ctx: PolicyContext
    ) -> PolicyResult[HpaState]:
        """One sync (:func:`sync`) of the pool's nodes on :meth:`metric` with ``params``' sync
        period, bounds and behavior."""
        nodes = snap.pool_nodes(ctx.pool_id)
        metric = self.metric(params)
        return sync(
            ctx,
            nodes,
            state,
            sync_period_ms=params.sync_period_ms,
            bounds=params.bounds(ctx.pool_id),
            up_rules=params.scale_up,
            down_rules=params.scale_down,
            recommend=lambda current: metric(nodes, current),
            inputs=self.inputs(params),
            zero_disables=self.zero_disables,
        )
