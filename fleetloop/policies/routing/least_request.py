"""least-request-p2c: Envoy's LEAST_REQUEST load balancer, as a control-plane decision.

What it does: publishes an equal share for every healthy node of the pool and tells the router to
pick per call with power-of-two choices (``picker="least-request-p2c"``): draw two distinct nodes
at random among those with weight > 0 and send the call to the one with fewer requests outstanding
*at that router*. The per-call choice is the router's, not fleetloop's: fleetloop only says which
nodes are candidates. This is Envoy's ``LEAST_REQUEST`` policy with its defaults
(``choice_count`` 2; with equal host weights Envoy uses the unweighted P2C path, so
``active_request_bias`` has no effect), the least-outstanding-requests routing of the ``classic``
baseline.

Formula, for each node ``i`` of the pool::

    weight_i = 1 / n_healthy    if i is warm (weights loaded) and not draining
             = 0                otherwise
    picker   = least-request-p2c      # router: pick 2 of {i : weight_i > 0}, keep the less loaded

Inputs: ``weights_state`` and ``draining`` per node. Health from outlier detection is applied by
the engine after this algorithm: an ejected node (an enforced ``open`` breaker) gets weight 0, a
stale node gets weight 0, and when every node would get 0 the engine fails open.

Parameters (defaults, bounds): none. ``choice_count`` is the router's (Envoy's default 2) and is not
a knob here.

Trade-offs: P2C on outstanding requests reacts per call to the router's own view of load, with no
control-plane lag and without herding onto one "best" node; but outstanding-request counts are
blind to how expensive each request is (a 100 000-token prompt counts as one request), to KV-cache
and prefix state, to tenant priority and to SLOs. Envoy's ``healthy_panic_threshold`` (50%) cannot
trigger here: outlier detection ejects at most 10% of hosts, and a Kubernetes pod that is not ready
(here: not warm) is not in the endpoint set at all, so it never counts as an unhealthy host.

Failure mode: a slow node that still answers keeps its equal share; P2C drains it only as far as
its outstanding count grows at each router, so many routers with a few calls each barely see it.
A node that fails fast looks *less* loaded and attracts calls until outlier detection ejects it.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetloop.policies.base import FleetSnapshot, NodeView, Params, PolicyContext, PolicyResult, r6
from fleetloop.schemas.decisions import Picker, RoutingDecision


class LeastRequestParams(Params):
    pass


def equal_share_decision(nodes: Sequence[NodeView], pool_id: str, picker: Picker) -> RoutingDecision:
    """An equal share for every warm node, 0 for the others, and the per-call ``picker`` (reason:
    the picker, or ``no-warm-node``). Health is the engine's (see the module docstring)."""
    healthy = [n.node_id for n in nodes if n.warm]
    share = r6(1.0 / len(healthy)) if healthy else 0.0
    return RoutingDecision(
        entity=f"pool/{pool_id}",
        pool_id=pool_id,
        weights={n.node_id: (share if n.warm else 0.0) for n in nodes},
        picker=picker,
        reason=picker if healthy else "no-warm-node",
        inputs={"nodes": float(len(nodes)), "healthy_nodes": float(len(healthy))},
    )


class LeastRequest:
    name = "least-request-p2c"
    section = "routing"
    Params = LeastRequestParams

    def initial_state(self) -> None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: LeastRequestParams, state: None, ctx: PolicyContext
    ) -> PolicyResult[None]:
        decision = equal_share_decision(snap.pool_nodes(ctx.pool_id), ctx.pool_id, "least-request-p2c")
        return PolicyResult(decisions=(decision,), state=None)
