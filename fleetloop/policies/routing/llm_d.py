"""llm-d-epp: llm-d's endpoint picker in its default profile, as a control-plane decision.

What it does: publishes an equal share for every warm node of the pool (as ``least-request-p2c``
does: every ready pod is a candidate of llm-d's InferencePool) and tells the router to pick per call
with llm-d's endpoint picker in its default profile (``picker="llm-d-epp"``,
:mod:`fleetloop.router.epp`). The per-call choice is the router's: the EPP sits in the request path
and reads each engine's metrics as they are (it scrapes them every 50 ms), which a control loop
ticking once a second cannot do.

Formula, for each node ``i`` of the pool::

    weight_i = 1 / n_warm     if i is warm and not draining, else 0
    picker   = llm-d-epp      # router, per call, over {i : weight_i > 0}:
                              #   S_i = 2 x s_queue_i              (min-max of waiting queues)
                              #       + 2 x (1 - kv_cache_usage_i)
                              #       + 3 x matched_blocks_i / total_blocks  (16-token blocks,
                              #                               at most 256, an LRU per node)
                              #   the node with the highest S_i, a tie drawn at random

Inputs: ``weights_state`` and ``draining`` per node; the router's own view of each engine's queue
and KV cache per call, and its own prefix index.

Parameters: none. The scorers' weights and the prefix index's block size, match limit and capacity
are the EPP's configuration, held by the router (:class:`fleetloop.router.epp.EppProfile`, llm-d's
default profile; the policy file cites each value's source), as Envoy's ``choice_count`` is for
``least-request-p2c``.

Trade-offs: the best of today's open-source LLM routers on prefix-heavy work: it sends a call where
its prefix is probably cached unless that node's queue or KV cache is much fuller than the others',
with no control-plane lag. But its prefix index is a guess from its own past picks (it never
learns what an engine evicted), the queue score is relative (one waiting call reads 0 against
idle peers and 1 against busier ones), and it knows nothing of priorities, deadlines, tasks, cost,
or a node that is slow but answers.

Failure mode: a node that fails fast keeps a short queue and a free KV cache, so it scores best and
draws calls until the readiness probe takes it out (no outlier detection in the baseline); a node
that slows down keeps its prefix score and draws its tasks' calls while its queue is no longer than
the others'.
"""

from __future__ import annotations

from fleetloop.policies.base import FleetSnapshot, Params, PolicyContext, PolicyResult
from fleetloop.policies.routing.least_request import equal_share_decision


class LlmDParams(Params):
    pass


class LlmDEpp:
    name = "llm-d-epp"
    section = "routing"
    Params = LlmDParams

    def initial_state(self) -> None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: LlmDParams, state: None, ctx: PolicyContext
    ) -> PolicyResult[None]:
        decision = equal_share_decision(snap.pool_nodes(ctx.pool_id), ctx.pool_id, "llm-d-epp")
        return PolicyResult(decisions=(decision,), state=None)
