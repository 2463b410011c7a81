"""cache-aware: score every node on load, memory, speed and warmth; pin a task to the node holding its
prefix; give priority 0 the nodes furthest from saturation; name the pools to spill over to.

What it does, its formula, inputs, parameters (defaults and bounds), trade-offs and failure modes:
README.md beside this file. The decisions behind it and what measured them:
``docs/decisions/cache-aware.md``.

The package: :mod:`.params` (the ``Params`` model), :mod:`.signals` (the remembered step times, the
hot prefixes, the prompt limits), :mod:`.rule` (the scorers, the shares, the prefix map, the spill
ranking and the decision; ``decide_pool`` is one pool's tick in any state) and :mod:`.batch`
(``decide_pools``: the steady state of a batch of pools with segment operations).
``tests/oracles/cache_aware.py`` states the scorers node by node, the form the tests hold them to.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult
from fleetloop.policies.memory import PoolMemory
from fleetloop.policies.routing.cache_aware.batch import decide_pools
from fleetloop.policies.routing.cache_aware.params import COMPONENTS, PICKER, CacheAwareParams
from fleetloop.policies.routing.cache_aware.rule import (
    decide_pool,
    fleet_headroom,
    fleet_load,
    load_terms,
    pool_scores,
    routing_decision,
    shares,
    spill_targets,
    with_speed,
)
from fleetloop.policies.routing.cache_aware.signals import (
    State,
    as_memory,
    pool_max_prompt,
    pool_slo_prompt,
    remember_rows,
)


class CacheAware:
    name = "cache-aware"
    section = "routing"
    Params = CacheAwareParams

    def initial_state(self) -> PoolMemory:
        return PoolMemory.empty(1)

    def decide(
        self, snap: FleetSnapshot, params: CacheAwareParams, state: PoolMemory | State, ctx: PolicyContext
    ) -> PolicyResult[PoolMemory]:
        return decide_pool(snap, params, state, ctx)

    def decide_pools(
        self,
        snap: FleetSnapshot,
        params: CacheAwareParams,
        states: Sequence[PoolMemory | State],
        ctxs: Sequence[PolicyContext],
    ) -> list[PolicyResult[PoolMemory]]:
        """Equal, element for element and bit for bit (decisions, state, diagnostics), to
        ``[self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]``: every pool of
        the batch at once over the snapshot's columns (:func:`.batch.decide_pools`)."""
        return decide_pools(snap, params, states, ctxs)


__all__ = [
    "COMPONENTS",
    "PICKER",
    "CacheAware",
    "CacheAwareParams",
    "State",
    "as_memory",
    "decide_pool",
    "decide_pools",
    "fleet_headroom",
    "fleet_load",
    "load_terms",
    "pool_max_prompt",
    "pool_scores",
    "pool_slo_prompt",
    "remember_rows",
    "routing_decision",
    "shares",
    "spill_targets",
    "with_speed",
]
