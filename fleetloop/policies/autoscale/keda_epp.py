"""keda-epp: llm-d's recommended autoscaler, a KEDA ScaledObject on the endpoint picker's queue and
running requests (the ``llm-d`` baseline).

llm-d's workload-autoscaling guide recommends "KEDA + EPP Metrics", with the queue signal as its
default (its Workload Variant Autoscaler path is deprecated). The ScaledObject has two Prometheus
triggers, both ``AverageValue`` (a per-replica target), which KEDA turns into one HPA that takes
the larger replica count:

- ``epp-queue-size``: ``sum(llm_d_epp_flow_control_queue_size)``, threshold 1: requests the EPP's
  flow control holds back because the pool is saturated;
- ``epp-running-requests``: ``sum(llm_d_epp_request_running)``, threshold 16: requests the EPP has
  dispatched to an engine and that have not finished (``pkg/epp/handlers/server.go`` counts a
  request from the moment it is sent on until its response ends).

The simulator's router has no gateway queue: a call goes to an engine at once and waits in its
queue. Flow control's saturation detector (``utilization-detector``, llm-d's default) counts an
engine as full at ``queue_depth_threshold`` 5 waiting requests (or 80% KV cache) and holds what
would go beyond; so here the part of an engine's waiting queue above that threshold stands for
what flow control would hold, and the rest of what the engine has (waiting up to the threshold,
plus running) for what the EPP has dispatched. The KV-cache half of the detector has no
counterpart: an engine whose KV cache is full queues the calls it cannot admit, which shows up as
waiting anyway.

Formula, at each sync (``current`` = the target set at the previous sync; ``ready`` = warm,
non-draining nodes with fresh telemetry)::

    held     = sum_i max(0, queue_depth_i - queue_depth_threshold)
    running  = sum_i (running_requests_i + min(queue_depth_i, queue_depth_threshold))
    desired  = max(AverageValue(held, queue_per_node), AverageValue(running, running_per_node))
    AverageValue(total, t) = current if |total / (t x current) - 1| <= tolerance else ceil(total / t)

then the HPA's stabilization and rate limits with the ScaledObject's ``behavior`` (its policy
file gives them), through the same controller as ``hpa`` and ``keda-engine``
(:class:`fleetloop.policies.autoscale.hpa.HpaController`).

Inputs: per node ``queue_depth`` (vLLM ``num_requests_waiting``), ``running_requests``,
``weights_state``, ``draining``, ``stale``; event time. State:
:class:`fleetloop.policies.autoscale.hpa.HpaState`.

Parameters (defaults, bounds): ``queue_per_node`` 1 (0.1-10 000), ``running_per_node`` 16
(0.1-10 000), ``queue_depth_threshold`` 5 (0-10 000), ``tolerance`` 0.1 (0-1), ``sync_period_ms``
15 000, ``min_replicas`` 1, ``max_replicas`` 1000, ``pools``, ``scale_up`` / ``scale_down`` (HPA
rules; defaults: Kubernetes').

Trade-offs: it reacts to demand the engines already hold (queued and running requests), not to GPU
utilization, so it gives nodes back when calls stop; the running target is a per-replica
concurrency that suits one model and GPU and is wrong for another, and the queue signal only
moves once the pool is saturated, a cold start before new nodes serve.

Failure mode: with no ready node reporting fresh metrics it keeps the current target (HPA's
``FailedGetExternalMetric``).
"""

from __future__ import annotations

from pydantic import Field

from fleetloop.policies.autoscale.hpa import (
    HpaController,
    Metric,
    SyncParams,
    average_value_replicas,
    ready_nodes,
)
from fleetloop.policies.base import NodeView


class KedaEppParams(SyncParams):
    queue_per_node: float = Field(default=1.0, ge=0.1, le=10_000.0)
    running_per_node: float = Field(default=16.0, ge=0.1, le=10_000.0)
    queue_depth_threshold: int = Field(default=5, ge=0, le=10_000)


def epp_replicas(
    nodes: tuple[NodeView, ...] | list[NodeView], current: int, params: KedaEppParams
) -> tuple[int | None, dict[str, float]]:
    """Both triggers' replica counts and the larger; None when no ready node has fresh metrics."""
    ready = ready_nodes(nodes)
    if not ready:
        return None, {"ready_nodes": 0.0}
    cut = params.queue_depth_threshold
    held = float(sum(max(0, n.queue_depth - cut) for n in ready))
    running = float(sum(n.running_requests + min(n.queue_depth, cut) for n in ready))
    by_queue = average_value_replicas(held, params.queue_per_node, current, params.tolerance)
    by_running = average_value_replicas(running, params.running_per_node, current, params.tolerance)
    inputs = {
        "ready_nodes": float(len(ready)),
        "epp_queue": held,
        "epp_running": running,
        "desired_by_queue": float(by_queue),
        "desired_by_running": float(by_running),
    }
    return max(by_queue, by_running), inputs


class KedaEpp(HpaController[KedaEppParams]):
    """The HPA KEDA generates for the ScaledObject with the two EPP triggers (:func:`epp_replicas`)."""

    name = "keda-epp"
    Params = KedaEppParams

    def metric(self, params: KedaEppParams) -> Metric:
        return lambda nodes, current: epp_replicas(nodes, current, params)
