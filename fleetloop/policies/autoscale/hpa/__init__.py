"""hpa: the Kubernetes Horizontal Pod Autoscaler on GPU utilization, as the ``classic`` autoscaler.

What it does, its formula, inputs, parameters (defaults and bounds), departures from Kubernetes,
trade-offs and failure modes: README.md beside this file. The decisions behind it:
``docs/decisions/hpa.md``.

The package: :mod:`.params` (the replica bounds, the behavior and the sync parameters every
HPA-based autoscaler shares; ``HpaParams``), :mod:`.signals` (the replica calculator: GPU
utilization for ``hpa``, the external-metric rules for the KEDA-generated HPAs) and :mod:`.rule`
(the controller around any metric: sync, stabilization, rate limits, the decision, and
``HpaController``, the policy class). ``keda-engine`` and ``keda-epp`` are subclasses of it on their
own metrics.
"""

from __future__ import annotations

from fleetloop.policies.autoscale.hpa.params import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    HpaParams,
    PoolBounds,
    ReplicaBounds,
    ScalingPolicy,
    ScalingRules,
    SyncParams,
)
from fleetloop.policies.autoscale.hpa.rule import (
    HpaController,
    HpaState,
    Metric,
    Recommendation,
    ScaleEvent,
    drain_order,
    limit_rate,
    replicas_change_per_period,
    scale_down_limit,
    scale_up_limit,
    stabilize,
    sync,
)
from fleetloop.policies.autoscale.hpa.signals import (
    Calculation,
    average_value_replicas,
    calculate_replicas,
    ratio_replicas,
    ready_nodes,
    utilization_ratio,
    within,
    within_abs,
)
from fleetloop.policies.base import NodeView


class Hpa(HpaController[HpaParams]):
    name = "hpa"
    Params = HpaParams
    zero_disables = True  # spec.replicas 0 with a non-zero minimum disables a Kubernetes HPA

    def inputs(self, params: HpaParams) -> dict[str, float]:
        return {"target_utilization_pct": float(params.target_utilization_pct)}

    def metric(self, params: HpaParams) -> Metric:
        def utilization(nodes: tuple[NodeView, ...], current: int) -> tuple[int | None, dict[str, float]]:
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

        return utilization


__all__ = [
    "DEFAULT_SCALE_DOWN",
    "DEFAULT_SCALE_UP",
    "Calculation",
    "Hpa",
    "HpaController",
    "HpaParams",
    "HpaState",
    "Metric",
    "PoolBounds",
    "Recommendation",
    "ReplicaBounds",
    "ScaleEvent",
    "ScalingPolicy",
    "ScalingRules",
    "SyncParams",
    "average_value_replicas",
    "calculate_replicas",
    "drain_order",
    "limit_rate",
    "ratio_replicas",
    "ready_nodes",
    "replicas_change_per_period",
    "scale_down_limit",
    "scale_up_limit",
    "stabilize",
    "sync",
    "utilization_ratio",
    "within",
    "within_abs",
]
