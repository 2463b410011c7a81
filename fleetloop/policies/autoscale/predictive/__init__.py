"""slo-predictive: size each pool for its token demand one cold start ahead, against SLO headroom.

What it does, its formula, inputs, parameters (defaults and bounds), trade-offs and failure modes:
README.md beside this file. The decisions behind it and what measured them:
``docs/decisions/slo-predictive.md``.

The package: :mod:`.params` (the ``Params`` model), :mod:`.signals` (what it reads of the snapshot),
:mod:`.rule` (the per-pool arithmetic, the state it keeps and the target's stabilization) and
:mod:`.batch` (``decide_pools``: every pool of a tick at once, the one implementation; ``decide`` is
a batch of one). ``tests/oracles/predictive.py`` is the same rule over each pool's nodes one by one,
the form the tests hold this one to.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetloop.policies.autoscale.predictive.batch import decide_pools
from fleetloop.policies.autoscale.predictive.params import PoolBounds, SloPredictiveParams
from fleetloop.policies.autoscale.predictive.rule import (
    MAX_NEED_NODES,
    MIN_LEARN_PRESSURE,
    SloPredictiveState,
    Target,
    accumulation,
    cold_starts,
    drain_order,
    fit_slope,
    learn_cold_start,
    target,
    trend_slope,
)
from fleetloop.policies.autoscale.predictive.signals import (
    Node,
    NodeFigures,
    Pressure,
    node_figures,
    predicted_prefill_ms,
    pressure,
    sibling_excess,
)
from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult
from fleetloop.policies.pool_figures import distinct_pools


class SloPredictive:
    name = "slo-predictive"
    section = "autoscale"
    Params = SloPredictiveParams

    def initial_state(self) -> SloPredictiveState:
        return SloPredictiveState()

    def decide(
        self,
        snap: FleetSnapshot,
        params: SloPredictiveParams,
        state: SloPredictiveState,
        ctx: PolicyContext,
    ) -> PolicyResult[SloPredictiveState]:
        """One pool: :func:`decide_pools` of a batch of one."""
        return decide_pools(snap, params, [state], [ctx])[0]

    def decide_pools(
        self,
        snap: FleetSnapshot,
        params: SloPredictiveParams,
        states: Sequence[SloPredictiveState],
        ctxs: Sequence[PolicyContext],
    ) -> list[PolicyResult[SloPredictiveState]]:
        """Every pool of the batch at once (:mod:`.batch`); contexts naming a pool twice are decided
        one by one."""
        if len(states) != len(ctxs) or not distinct_pools(ctxs):
            return [self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]
        return decide_pools(snap, params, states, ctxs)


__all__ = [
    "MAX_NEED_NODES",
    "MIN_LEARN_PRESSURE",
    "Node",
    "NodeFigures",
    "PoolBounds",
    "Pressure",
    "SloPredictive",
    "SloPredictiveParams",
    "SloPredictiveState",
    "Target",
    "accumulation",
    "cold_starts",
    "decide_pools",
    "drain_order",
    "fit_slope",
    "learn_cold_start",
    "node_figures",
    "predicted_prefill_ms",
    "pressure",
    "sibling_excess",
    "target",
    "trend_slope",
]
