"""latency-outlier: eject a node that is far slower than its pool, or that keeps failing; probe it
before trusting it again; bring returning and newly warm nodes back on a slow-start ramp.

What it does, its formula, inputs, parameters (defaults and bounds), trade-offs and failure modes:
README.md beside this file. The decisions behind it and what measured them:
``docs/decisions/latency-outlier.md``.

The package: :mod:`.params` (the ``Params`` model and the formula's constants), :mod:`.signals` (what
it reads of the snapshot, the pools' references and every node's verdict, as array operations),
:mod:`.rule` (the state machines, the caps and each node's decision: one pool's tick) and
:mod:`.batch` (the columnar forms: ``decide_columns`` for one pool, ``decide_pools`` for a batch).
``tests/oracles/latency_outlier.py`` is the same rule node by node, the form the tests hold this one to.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult
from fleetloop.policies.breaker.latency_outlier.batch import decide_columns, decide_pools, rows_of
from fleetloop.policies.breaker.latency_outlier.params import (
    MAD_SCALE,
    POOL_WIDE_SHARE,
    SIGNALS,
    TBT_SIGNALS,
    TTFT_SIGNALS,
    LatencyOutlierParams,
)
from fleetloop.policies.breaker.latency_outlier.rule import (
    HEALTHY,
    NodeState,
    RowCache,
    State,
    Verdict,
    backoff_ms,
    breaker_decision,
    failing_with_pool,
    node_decision,
    queueing,
    quiet,
    row_cache,
)
from fleetloop.policies.breaker.latency_outlier.signals import FleetFigures, fleet_figures


class LatencyOutlier:
    name = "latency-outlier"
    section = "breaker"
    Params = LatencyOutlierParams

    def initial_state(self) -> State:
        return State()

    def decide(
        self, snap: FleetSnapshot, params: LatencyOutlierParams, state: State, ctx: PolicyContext
    ) -> PolicyResult[State]:
        return decide_columns(snap, params, state, ctx)

    def decide_pools(
        self,
        snap: FleetSnapshot,
        params: LatencyOutlierParams,
        states: Sequence[State],
        ctxs: Sequence[PolicyContext],
    ) -> list[PolicyResult[State]]:
        """Equal, element for element and bit for bit (decisions, state, diagnostics), to
        ``[self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]``: every pool
        of the batch at once over the fleet's columns (:func:`.batch.decide_pools`)."""
        return decide_pools(snap, params, states, ctxs)


__all__ = [
    "HEALTHY",
    "MAD_SCALE",
    "POOL_WIDE_SHARE",
    "SIGNALS",
    "TBT_SIGNALS",
    "TTFT_SIGNALS",
    "FleetFigures",
    "LatencyOutlier",
    "LatencyOutlierParams",
    "NodeState",
    "RowCache",
    "State",
    "Verdict",
    "backoff_ms",
    "breaker_decision",
    "decide_columns",
    "decide_pools",
    "failing_with_pool",
    "fleet_figures",
    "node_decision",
    "queueing",
    "quiet",
    "row_cache",
    "rows_of",
]
