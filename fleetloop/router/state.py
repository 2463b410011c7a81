"""Desired state as a router holds it: the newest enforced decision per key, nothing else. Pure.

``control.state`` is compacted and keyed ``<kind>/<entity>``; a router may see the same decision
twice (at-least-once) or an older one after a newer one (a restart re-reading the topic). The rule
is the one in DESIGN.md, "Delivery semantics": a decision older, by ``tick_id``, than the one held
for its key is dropped; a decision of the same tick replaces the held one (publishing the same
decision twice is harmless). Shadow-mode decisions never act.

``version`` grows by one with every accepted decision of a kind that changes which node a call may
go to (routing, breaker), so a picker can cache what it derived from the state and know when to
recompute. No clock, no I/O: the caller says when (``now_s``, on whatever monotonic clock it runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetloop.schemas.decisions import (
    AdmissionDecision,
    AutoscaleDecision,
    BatchingDecision,
    BreakerDecision,
    Decision,
    RetryBudgetDecision,
    RoutingDecision,
)


@dataclass(slots=True)
class PoolState:
    """What is held for one pool. ``routing_at_s`` is when the routing decision arrived."""

    routing: RoutingDecision | None = None
    routing_at_s: float = -1e18
    admission: AdmissionDecision | None = None
    budgets: dict[str, RetryBudgetDecision] = field(default_factory=dict)  # tenant ("" = pool-wide)
    autoscale: AutoscaleDecision | None = None
    batching: BatchingDecision | None = None


@dataclass(slots=True)
class DesiredState:
    """The newest enforced decision per ``<kind>/<entity>`` key, filed by pool and node."""

    pools: dict[str, PoolState] = field(default_factory=dict)
    breakers: dict[str, BreakerDecision] = field(default_factory=dict)  # node id -> newest
    held: dict[str, int] = field(default_factory=dict)  # key -> tick id held
    version: int = 0
    accepted: int = 0
    dropped_stale: int = 0
    dropped_shadow: int = 0

    def pool(self, pool_id: str) -> PoolState:
        st = self.pools.get(pool_id)
        if st is None:
            st = self.pools[pool_id] = PoolState()
        return st

    def accept(self, d: Decision, now_s: float) -> bool:
        """File ``d`` if it is enforced and not older than what is held for its key."""
        if d.policy.mode != "enforce":
            self.dropped_shadow += 1
            return False
        key = d.key
        held = self.held.get(key)
        if held is not None and d.tick_id < held:
            self.dropped_stale += 1
            return False
        self.held[key] = d.tick_id
        self.accepted += 1
        body = d.body
        if isinstance(body, RoutingDecision):
            st = self.pool(body.pool_id)
            st.routing = body
            st.routing_at_s = now_s
            self.version += 1
        elif isinstance(body, BreakerDecision):
            self.breakers[body.node_id] = body
            self.version += 1
        elif isinstance(body, AdmissionDecision):
            self.pool(body.pool_id).admission = body
        elif isinstance(body, RetryBudgetDecision):
            self.pool(body.pool_id).budgets[body.tenant_id or ""] = body
        elif isinstance(body, AutoscaleDecision):
            self.pool(body.pool_id).autoscale = body
        elif isinstance(body, BatchingDecision):
            self.pool(body.pool_id).batching = body
        return True

    def ejected(self, node_id: str) -> bool:
        """True when an enforced open breaker holds ``node_id`` out of rotation."""
        b = self.breakers.get(node_id)
        return b is not None and b.enforced and b.state == "open"

    def open_breakers(self) -> int:
        return sum(1 for b in self.breakers.values() if b.enforced and b.state == "open")

    def routing_fresh(self, pool_id: str, now_s: float, ttl_s: float) -> RoutingDecision | None:
        """The pool's routing decision while it is younger than ``ttl_s``; None once it went stale."""
        st = self.pools.get(pool_id)
        if st is None or st.routing is None or now_s - st.routing_at_s > ttl_s:
            return None
        return st.routing
