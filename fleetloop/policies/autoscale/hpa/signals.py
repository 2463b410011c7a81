"""The HPA's replica calculator (``pkg/controller/podautoscaler/replica_calculator.go``): what it
reads of the pool's nodes and the replica count each metric asks for. ``hpa`` reads GPU utilization
(:func:`calculate_replicas`); the KEDA-generated HPAs read external metrics of the ready nodes
(:func:`ready_nodes`, :func:`average_value_replicas`, :func:`ratio_replicas`). README.md beside
this file: "Formula"."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fleetloop.policies.base import NodeView

Within = Callable[[float, float], bool]


def within(ratio: float, tolerance: float) -> bool:
    """``Tolerances.isWithin`` (Kubernetes 1.33+), with the same tolerance both ways."""
    return (1.0 - tolerance) <= ratio <= (1.0 + tolerance)


def within_abs(ratio: float, tolerance: float) -> bool:
    """The tolerance test of Kubernetes before 1.33, ``|ratio - 1| <= tolerance``, which the KEDA
    baselines keep. Not :func:`within` to the bit: at a bound the two may differ by the rounding of
    ``ratio - 1`` (11 waiting on 2 nodes at 5 a node is a ratio of 1.1, outside here, inside there);
    docs/decisions/hpa.md says why both stay."""
    return abs(ratio - 1.0) <= tolerance


def ratio_replicas(ratio: float, current: int, count: int, tolerance: float, test: Within = within) -> int:
    """A utilization or ``Value`` metric's replica count (``GetResourceReplicas`` with every pod
    ready and reporting; ``GetExternalMetricReplicas``): ``current`` while ``ratio`` is within
    ``tolerance`` of 1, else ``ceil(ratio x count)`` over the ``count`` pods measured."""
    return current if test(ratio, tolerance) else math.ceil(ratio * count)


def average_value_replicas(total: float, per_node: float, current: int, tolerance: float) -> int:
    """An external metric with an ``AverageValue`` target (KEDA's default metric type), as
    Kubernetes' ``GetExternalPerPodMetricReplicas``: ``current`` while ``total / (per_node x
    current)`` is within ``tolerance`` of 1 (:func:`within_abs`), else ``ceil(total / per_node)``."""
    ratio = total / (per_node * current) if current > 0 else math.inf
    return current if within_abs(ratio, tolerance) else math.ceil(total / per_node)


def ready_nodes(nodes: Sequence[NodeView]) -> list[NodeView]:
    """The nodes whose engine metrics an external-metrics autoscaler reads: warm, not draining,
    with fresh telemetry (cold and loading pods report nothing; a stale one is missing)."""
    return [n for n in nodes if not n.draining and n.weights_state == "warm" and not n.stale]


@dataclass(frozen=True, slots=True)
class Calculation:
    """The replica calculator's answer; ``replicas`` is None when no ready pod has a metric."""

    replicas: int | None
    utilization_pct: int
    ready: int
    unready: int
    missing: int
    ignored: int


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
        return done(ratio_replicas(ratio, current, ready, tolerance))
    if missing:
        if ratio < 1.0:  # scale down: a missing pod counts as using max(100%, target) of its request
            fallback = max(100, target_pct)
            metrics.update({m: requests[m] * fallback // 100 for m in missing})
        elif ratio > 1.0:  # scale up: a missing pod counts as idle
            metrics.update(dict.fromkeys(missing, 0))
    if scale_up_with_unready:
        metrics.update(dict.fromkeys(unready, 0))
    new_ratio, _ = utilization_ratio(metrics, requests, target_pct)
    if within(new_ratio, tolerance) or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return done(current)
    new_replicas = math.ceil(new_ratio * len(metrics))
    if (new_ratio < 1.0 and new_replicas > current) or (new_ratio > 1.0 and new_replicas < current):
        return done(current)
    return done(new_replicas)
