"""keda-engine: KEDA/KServe-style autoscaling on the engine's own queue and KV signals (``modern``).

What a careful operator runs today instead of HPA on GPU utilization: a KEDA ``ScaledObject`` with
two Prometheus triggers on the serving engine's metrics, which KEDA turns into one Kubernetes HPA
with two external metrics; the HPA computes a replica count per metric and takes the largest
(``HorizontalController.computeReplicasForMetrics``), then applies the same default ``behavior`` as
:mod:`fleetloop.policies.autoscale.hpa` (stabilization, rate limits, bounds): this module gives
that controller its metric, nothing more.

Formula, at each sync (``current`` = the target set at the previous sync):

1. **Queue**: ``vllm:num_requests_waiting`` summed over the pool, ``AverageValue`` target
   ``waiting_per_node`` 5 (KEDA's default metric type for a trigger is AverageValue; threshold 5 is
   the vLLM production-stack KEDA tutorial's ScaledObject, docs.vllm.ai/projects/production-stack,
   "Autoscaling with KEDA"). Kubernetes ``GetExternalPerPodMetricReplicas``
   (``replica_calculator.go``)::

       usage_ratio = total_waiting / (waiting_per_node x current)
       desired_q   = current if |usage_ratio - 1| <= tolerance else ceil(total_waiting / waiting_per_node)

2. **KV cache**: ``vllm:kv_cache_usage_perc`` averaged over the ready nodes, ``Value`` target
   ``kv_target`` 0.8 (KServe's LLM autoscaling guide names waiting requests and KV-cache usage as the
   two signals, kserve.github.io "Autoscale InferenceService with LLM metrics"; 0.8 keeps a fifth of
   the cache for growth before vLLM starts preempting, our choice, stated as such).
   ``GetExternalMetricReplicas``::

       usage_ratio = avg_kv / kv_target
       desired_kv  = current if |usage_ratio - 1| <= tolerance else ceil(usage_ratio x ready)

   ``desired = max(desired_q, desired_kv)``, then stabilized and rate limited as HPA does with its
   default behavior through the same controller as ``hpa``
   (:class:`fleetloop.policies.autoscale.hpa.HpaController`:
   scale up at once by max(100%, 4 pods) per 15 s; scale down to the highest
   recommendation of the last 300 s, by at most 100% per 15 s), within ``[min_replicas,
   max_replicas]``, every ``sync_period_ms`` 15 000 (KEDA's tutorial polls every 15 s, HPA syncs
   every 15 s).

Inputs: per node ``queue_depth`` (num_requests_waiting), ``kv_cache_used_frac``, ``weights_state``,
``draining``, ``stale``; event time. State: :class:`fleetloop.policies.autoscale.hpa.HpaState`.

Parameters (defaults, bounds): ``waiting_per_node`` 5 (0.1-10 000), ``kv_target`` 0.8 (0.05-1),
``tolerance`` 0.1 (0-1), ``sync_period_ms`` 15 000 (1-600 000), ``min_replicas`` 1 (0-100 000),
``max_replicas`` 1000, ``pools`` per-pool bounds, ``scale_up`` / ``scale_down`` HPA rules (defaults
as Kubernetes documents them).

Trade-offs: the engine's signals move with real load (a busy GPU reads 100% whether or not it
keeps up; a queue and a full KV cache do not lie), so it neither runs at quota like ``classic`` nor
waits for a saturation signal that never comes. But it is still reactive: it adds nodes only once
the queue has formed or the cache has filled, and each takes a full cold start; it knows nothing of
SLOs, priorities, tasks or cost, and the 300 s stabilization holds idle nodes after a burst.

Failure mode: with no ready node reporting fresh metrics it keeps the current target (HPA's
``FailedGetExternalMetric``); cold and loading nodes report no metrics, so during a cold start the
ready nodes' queue (a sum) still drives scale-up while the KV average counts only them.
"""

from __future__ import annotations

from pydantic import Field

from fleetloop.policies.autoscale.hpa import (
    HpaController,
    Metric,
    SyncParams,
    average_value_replicas,
    ratio_replicas,
    ready_nodes,
    within_abs,
)
from fleetloop.policies.base import NodeView


class KedaEngineParams(SyncParams):
    waiting_per_node: float = Field(default=5.0, ge=0.1, le=10_000.0)
    kv_target: float = Field(default=0.8, ge=0.05, le=1.0)


def metric_replicas(
    nodes: tuple[NodeView, ...] | list[NodeView], current: int, params: KedaEngineParams
) -> tuple[int | None, dict[str, float]]:
    """Both metrics' replica counts and the larger; None when no ready node has fresh metrics."""
    ready = ready_nodes(nodes)
    if not ready:
        return None, {"ready_nodes": 0.0}
    waiting = float(sum(n.queue_depth for n in ready))
    kv = sum(n.kv_cache_used_frac for n in ready) / len(ready)
    q_desired = average_value_replicas(waiting, params.waiting_per_node, current, params.tolerance)
    kv_desired = ratio_replicas(kv / params.kv_target, current, len(ready), params.tolerance, within_abs)
    inputs = {
        "ready_nodes": float(len(ready)),
        "waiting_total": waiting,
        "kv_used_avg": kv,
        "desired_by_queue": float(q_desired),
        "desired_by_kv": float(kv_desired),
    }
    return max(q_desired, kv_desired), inputs


class KedaEngine(HpaController[KedaEngineParams]):
    """The HPA KEDA generates for a ScaledObject with the two triggers above (:func:`metric_replicas`)."""

    name = "keda-engine"
    Params = KedaEngineParams

    def metric(self, params: KedaEngineParams) -> Metric:
        return lambda nodes, current: metric_replicas(nodes, current, params)
