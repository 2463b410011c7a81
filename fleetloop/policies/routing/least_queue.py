"""least-queue: send each pool's traffic to the nodes with the shortest queues.

Formula, for each node ``i`` of the pool::

    load_i   = queue_depth_i + running_weight * running_requests_i
    score_i  = 1 / (1 + load_i / queue_scale) ** alpha        if i is warm and not draining
             = 0                                               otherwise
    weight_i = score_i / sum(score)

Inputs: each node's newest ``queue_depth``, ``running_requests``, ``weights_state`` and ``draining``.
Parameters (defaults, bounds): ``alpha`` 2.0 (0.1-8; higher sends more to the emptiest queue),
``queue_scale`` 4.0 (>0; queue length at which a node's score halves, for alpha 1),
``running_weight`` 0.25 (0-1; running requests count a quarter of a queued one: they are
already batched and leave at decode speed).
Trade-offs: queue length is the most direct backlog signal a node has; it ignores how long each
queued prompt is and which node holds a caller's prefix (the cache-aware router handles both).
Failure mode: a node reporting stale numbers looks as good as its last report; the engine zeroes
stale nodes and falls back to an even spread when every node would get zero.
"""

from __future__ import annotations

from pydantic import Field

from fleetloop.policies.base import FleetSnapshot, Params, PolicyContext, PolicyResult, r6
from fleetloop.schemas.decisions import RoutingDecision


class LeastQueueParams(Params):
    alpha: float = Field(default=2.0, ge=0.1, le=8.0)
    queue_scale: float = Field(default=4.0, gt=0.0, le=10_000.0)
    running_weight: float = Field(default=0.25, ge=0.0, le=1.0)


class LeastQueue:
    name = "least-queue"
    section = "routing"
    Params = LeastQueueParams

    def initial_state(self) -> None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: LeastQueueParams, state: None, ctx: PolicyContext
    ) -> PolicyResult[None]:
        scores: dict[str, float] = {}
        for node in snap.pool_nodes(ctx.pool_id):
            if not node.warm:
                scores[node.node_id] = 0.0
                continue
            load = node.queue_depth + params.running_weight * node.running_requests
            scores[node.node_id] = 1.0 / (1.0 + load / params.queue_scale) ** params.alpha
        total = sum(scores.values())
        weights = {k: r6(v / total) if total > 0 else 0.0 for k, v in scores.items()}
        decision = RoutingDecision(
            entity=f"pool/{ctx.pool_id}",
            pool_id=ctx.pool_id,
            weights=weights,
            reason="least-queue" if total > 0 else "no-warm-node",
            inputs={
                "nodes": float(len(scores)),
                "warm_nodes": float(sum(1 for s in scores.values() if s > 0)),
            },
        )
        return PolicyResult(decisions=(decision,), state=None)
