"""ratio: retries capped at a share of a pool's requests (Finagle's RetryBudget, gRPC retry throttling).

What it does, its formula, inputs, parameters (defaults and bounds), trade-offs and failure modes:
README.md beside this file. The decisions behind it: ``docs/decisions/ratio.md``.

The package: :mod:`.params` (the ``Params`` model), :mod:`.signals` (the mass-failure episode),
:mod:`.rule` (the budget, the pool's and each tenant's decision: ``decide_pool`` is one pool's tick)
and :mod:`.batch` (``decide_pools``: a batch of pools, each tenant's part made once).
``tests/oracles/ratio.py`` states the pool's counts node by node.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult
from fleetloop.policies.retry_budget.ratio.batch import decide_pools
from fleetloop.policies.retry_budget.ratio.params import RatioParams
from fleetloop.policies.retry_budget.ratio.rule import allowed, budget_decision, decide_pool
from fleetloop.policies.retry_budget.ratio.signals import Episode, episode_after


class Ratio:
    name = "ratio"
    section = "retry_budget"
    Params = RatioParams

    def initial_state(self) -> Episode | None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: RatioParams, state: Episode | None, ctx: PolicyContext
    ) -> PolicyResult[Episode | None]:
        return decide_pool(snap, params, state, ctx)

    def decide_pools(
        self,
        snap: FleetSnapshot,
        params: RatioParams,
        states: Sequence[Episode | None],
        ctxs: Sequence[PolicyContext],
    ) -> list[PolicyResult[Episode | None]]:
        """Equal, element for element and bit for bit (decisions, state, diagnostics), to
        ``[self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]``
        (:func:`.batch.decide_pools`)."""
        return decide_pools(snap, params, states, ctxs)


__all__ = [
    "Episode",
    "Ratio",
    "RatioParams",
    "allowed",
    "budget_decision",
    "decide_pool",
    "decide_pools",
    "episode_after",
]
