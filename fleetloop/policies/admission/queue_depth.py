"""queue-depth: shed calls at the router when the chosen node's queue is already too deep.

Formula, for priority class ``p`` (0 is most important)::

    max_queue_depth[p]          = max(min_depth, floor(depth_p0 * priority_factor ** p))
    new_task_max_queue_depth[p] = max(min_depth, floor(max_queue_depth[p] * new_task_factor))

A call is rejected when the node it would go to has ``queue_depth >= max_queue_depth[p]``; the first
call of a task meets the lower ``new_task`` threshold, so work that has already spent money is
protected before new work is admitted. Rejecting fast (a shed outcome) beats queueing forever:
the client learns at once and the queue stays short enough to meet TTFT.

Inputs: none from the snapshot beyond the pool's priority classes in use (tenants seen); the
router compares against live queue depth. Parameters (defaults, bounds): ``depth_p0`` 64 (1-100 000),
``priority_factor`` 0.5 (0.05-1), ``new_task_factor`` 0.75 (0.05-1), ``min_depth`` 2,
``classes`` 3 (priority classes 0..classes-1 published).
Trade-offs: static per class; it does not move with load (the SLO-aware admission does).
Failure mode: thresholds too low shed work the fleet could have served; the engine never lets a
protected class's threshold fall below ``min_queue_threshold``.
"""

from __future__ import annotations

import math

from pydantic import Field

from fleetloop.policies.base import FleetSnapshot, Params, PolicyContext, PolicyResult
from fleetloop.schemas.decisions import AdmissionDecision


class QueueDepthParams(Params):
    depth_p0: int = Field(default=64, ge=1, le=100_000)
    priority_factor: float = Field(default=0.5, ge=0.05, le=1.0)
    new_task_factor: float = Field(default=0.75, ge=0.05, le=1.0)
    min_depth: int = Field(default=2, ge=1)
    classes: int = Field(default=3, ge=1, le=10)


def thresholds(params: QueueDepthParams) -> tuple[dict[str, int], dict[str, int]]:
    running: dict[str, int] = {}
    new_task: dict[str, int] = {}
    for p in range(params.classes):
        depth = max(params.min_depth, math.floor(params.depth_p0 * params.priority_factor**p))
        running[str(p)] = depth
        new_task[str(p)] = max(params.min_depth, math.floor(depth * params.new_task_factor))
    return running, new_task


class QueueDepth:
    name = "queue-depth"
    section = "admission"
    Params = QueueDepthParams

    def initial_state(self) -> None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: QueueDepthParams, state: None, ctx: PolicyContext
    ) -> PolicyResult[None]:
        running, new_task = thresholds(params)
        nodes = snap.pool_nodes(ctx.pool_id)
        decision = AdmissionDecision(
            entity=f"pool/{ctx.pool_id}",
            pool_id=ctx.pool_id,
            max_queue_depth=running,
            new_task_max_queue_depth=new_task,
            reason="static-thresholds",
            inputs={"max_queue_depth_seen": float(max((n.queue_depth for n in nodes), default=0))},
        )
        return PolicyResult(decisions=(decision,), state=None)
