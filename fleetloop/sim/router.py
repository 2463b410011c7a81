"""The router: picks a node per call from the newest desired state the control plane published.

It holds, per pool, the newest routing, admission and retry-budget decision and, per node, the
newest breaker decision (a decision older, by ``tick_id``, than the one held for its key is
dropped). It never asks the control plane anything per call (fleetloop is not in the request path).

Per call, in order:

1. **Pools**: every pool serving the workload's preferred model takes a share of its calls: the
   primary pool of a call is picked by smooth weighted round robin (nginx's algorithm, no random
   draw) over those pools, each weighted by its routable capacity, i.e. the number of nodes its
   newest routing decision publishes with weight > 0 (that are routable; the warm live nodes when it
   fails static) times the node's decode bandwidth (HBM bytes/s achieved, the resource a decode step
   is bound by), so an H100 pool and an A100 pool of one model split traffic by what they can serve.
   Then the primary's ``spill_to`` pools (when they serve an acceptable model) if the call would be
   shed; if no pool of that chain has a routable node, the pools of the next acceptable model
   (model fallback).
2. **Nodes**: those with weight > 0 in ``by_priority[p]`` (else ``weights``), not draining, and not
   behind an enforced open breaker. A node that crashed stays routable until the control plane
   zeroes it: calls to it fail at once, as connection errors would.
3. **Prefix affinity**: the first node of ``prefix_affinity[digest]`` among those nodes.
4. **Picker**: ``weighted-random`` (by weight, seeded generator), ``round-robin`` (smooth weighted
   round robin, nginx's algorithm: each node's credit grows by its weight, the richest is picked
   and pays the total), ``least-request-p2c`` (two distinct nodes drawn uniformly, the one with
   fewer of this router's outstanding calls wins, ties to the first: Envoy LEAST_REQUEST).
5. **Admission**: shed when the node's queue depth is at or above ``max_queue_depth[p]``
   (``new_task_max_queue_depth[p]`` for the first call of a task), when its outstanding work (queue
   depth + running requests) is at or above ``max_outstanding[p]`` (``new_task_max_outstanding[p]``
   for a first call), or when the call's remaining latency budget is below
   ``reject_if_budget_below_ms``.

Fail static: with no routing decision, or none for ``FAIL_STATIC_S``, the router falls back to
plain round robin over the pool's warm, non-draining, live nodes. Retries: a retry is let through
while this router's retries since the newest retry-budget decision are below
``retries_allowed_now`` (tenant-specific decision first, then the pool's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fleetloop.schemas.decisions import (
    AdmissionDecision,
    BreakerDecision,
    RetryBudgetDecision,
    RoutingDecision,
)
from fleetloop.sim.node import Node

FAIL_STATIC_S = 30.0


@dataclass(slots=True)
class _PoolState:
    routing: RoutingDecision | None = None
    routing_t: float = -1e18
    admission: AdmissionDecision | None = None
    budgets: dict[str, RetryBudgetDecision] = field(default_factory=dict)  # "" = pool-wide
    budget_used: dict[str, int] = field(default_factory=dict)
    rr_credit: dict[str, float] = field(default_factory=dict)
    rr_plain: int = 0


@dataclass(frozen=True, slots=True)
class Route:
    pool_id: str
    node: Node | None  # None: shed (or no node anywhere)
    reason: str


class Router:
    def __init__(self, pools_by_model: Mapping[str, tuple[str, ...]], rng: np.random.Generator) -> None:
        self.pools_by_model = pools_by_model
        self.rng = rng
        self.pools: dict[str, _PoolState] = {}
        self.breakers: dict[str, BreakerDecision] = {}
        self.outstanding: dict[str, int] = {}
        self.members: dict[str, list[Node]] = {}  # pool -> nodes known to discovery (sorted by id)
        self.nodes: dict[str, Node] = {}
        self.pool_credit: dict[str, float] = {}  # smooth weighted round robin across a model's pools

    # -- desired state ----------------------------------------------------------------------------

    def _pool(self, pool_id: str) -> _PoolState:
        st = self.pools.get(pool_id)
        if st is None:
            st = self.pools[pool_id] = _PoolState()
        return st

    def set_routing(self, d: RoutingDecision, now: float) -> None:
        st = self._pool(d.pool_id)
        if st.routing is None or st.routing.weights != d.weights:
            st.rr_credit = {}
        st.routing = d
        st.routing_t = now

    def set_admission(self, d: AdmissionDecision) -> None:
        self._pool(d.pool_id).admission = d

    def set_retry_budget(self, d: RetryBudgetDecision) -> None:
        st = self._pool(d.pool_id)
        key = d.tenant_id or ""
        st.budgets[key] = d
        st.budget_used[key] = 0

    def set_breaker(self, d: BreakerDecision) -> None:
        self.breakers[d.node_id] = d

    def open_breakers(self) -> int:
        return sum(1 for d in self.breakers.values() if d.enforced and d.state == "open")

    # -- per call ---------------------------------------------------------------------------------

    def allow_retry(self, pool_id: str, tenant_id: str) -> bool:
        st = self.pools.get(pool_id)
        if st is None:
            return True
        key = tenant_id if tenant_id in st.budgets else ""
        d = st.budgets.get(key)
        if d is None:
            return True
        used = st.budget_used.get(key, 0)
        if used >= d.retries_allowed_now:
            return False
        st.budget_used[key] = used + 1
        return True

    def _eligible(self, pool_id: str, priority: int, now: float) -> list[tuple[Node, float]] | None:
        """Nodes with weight > 0 and their weights; None when the router must fail static."""
        st = self.pools.get(pool_id)
        d = st.routing if st is not None else None
        if d is None or st is None or now - st.routing_t > FAIL_STATIC_S:
            return None
        weights = d.by_priority.get(str(priority)) or d.weights
        out: list[tuple[Node, float]] = []
        for node_id in sorted(weights):
            w = weights[node_id]
            if w <= 0:
                continue
            node = self.nodes.get(node_id)
            if node is None or node.draining:
                continue
            b = self.breakers.get(node_id)
            if b is not None and b.enforced and b.state == "open":
                continue
            out.append((node, w))
        return out

    def _capacity(self, pool_id: str, priority: int, now: float) -> float:
        """Routable capacity of a pool: routable nodes by its published weights x decode bandwidth."""
        eligible = self._eligible(pool_id, priority, now)
        if eligible is None:
            nodes = [n for n in self.members.get(pool_id, ()) if n.alive and n.warm and not n.draining]
        else:
            nodes = [n for n, _ in eligible]
        return sum(n.spec.bytes_per_s for n in nodes)

    def _primary(self, pools: tuple[str, ...], priority: int, now: float) -> str:
        """The pool that takes this call among the pools of one model (see the module docstring)."""
        if len(pools) == 1:
            return pools[0]
        shares = [(p, self._capacity(p, priority, now)) for p in pools]
        total = sum(c for _, c in shares)
        if total <= 0.0:
            return pools[0]
        credit = self.pool_credit
        best, best_credit = pools[0], -1e300
        for p, c in shares:
            v = credit.get(p, 0.0) + c / total
            credit[p] = v
            if v > best_credit:
                best, best_credit = p, v
        credit[best] -= 1.0
        return best

    def _plain(self, pool_id: str) -> Node | None:
        live = [n for n in self.members.get(pool_id, ()) if n.alive and n.warm and not n.draining]
        if not live:
            return None
        st = self._pool(pool_id)
        node = live[st.rr_plain % len(live)]
        st.rr_plain += 1
        return node

    def _pick(self, pool_id: str, priority: int, digest: str | None, now: float) -> Node | None:
        eligible = self._eligible(pool_id, priority, now)
        if not eligible:
            return self._plain(pool_id)
        st = self.pools[pool_id]
        d = st.routing
        assert d is not None
        if digest is not None:
            holders = d.prefix_affinity.get(digest)
            if holders:
                ids = {n.node_id: n for n, _ in eligible}
                for h in holders:
                    if h in ids:
                        return ids[h]
        if len(eligible) == 1:
            return eligible[0][0]
        picker = d.picker
        if picker == "round-robin":
            total = 0.0
            best: Node | None = None
            best_credit = -1e300
            credit = st.rr_credit
            for node, w in eligible:
                c = credit.get(node.node_id, 0.0) + w
                credit[node.node_id] = c
                total += w
                if c > best_credit:
                    best, best_credit = node, c
            assert best is not None
            credit[best.node_id] -= total
            return best
        if picker == "least-request-p2c":
            i, j = self.rng.choice(len(eligible), size=2, replace=False)
            a, b = eligible[int(i)][0], eligible[int(j)][0]
            return a if self.outstanding.get(a.node_id, 0) <= self.outstanding.get(b.node_id, 0) else b
        # weighted-random
        total = sum(w for _, w in eligible)
        x = float(self.rng.random()) * total
        acc = 0.0
        for node, w in eligible:
            acc += w
            if x < acc:
                return node
        return eligible[-1][0]

    def _admit(self, pool_id: str, node: Node, priority: int, *, new_task: bool, budget_ms: float) -> bool:
        st = self.pools.get(pool_id)
        adm = st.admission if st is not None else None
        if adm is None:
            return True
        key = str(priority)
        limit = adm.new_task_max_queue_depth.get(key) if new_task else None
        if limit is None:
            limit = adm.max_queue_depth.get(key)
        if limit is not None and node.queue_depth >= limit:
            return False
        cap = adm.new_task_max_outstanding.get(key) if new_task else None
        if cap is None:
            cap = adm.max_outstanding.get(key)
        if cap is not None and node.queue_depth + node.running >= cap:
            return False
        return not (adm.reject_if_budget_below_ms and budget_ms < adm.reject_if_budget_below_ms)

    def route(
        self,
        models: tuple[str, ...],
        priority: int,
        digest: str | None,
        *,
        new_task: bool,
        budget_ms: float,
        now: float,
    ) -> Route:
        candidates: list[str] = []
        for m in models:
            for p in self.pools_by_model.get(m, ()):
                if p not in candidates:
                    candidates.append(p)
        if not candidates:
            return Route("", None, "no-pool")
        first = next((self.pools_by_model[m] for m in models if self.pools_by_model.get(m)), ())
        primary = self._primary(first, priority, now)
        candidates.remove(primary)
        candidates.insert(0, primary)
        st = self.pools.get(primary)
        spill = st.routing.spill_to if st is not None and st.routing is not None else ()
        chain = [primary] + [p for p in spill if p in candidates and p != primary]
        shed_pool: str | None = None
        for pool_id in chain:
            node = self._pick(pool_id, priority, digest, now)
            if node is None:
                continue
            if self._admit(pool_id, node, priority, new_task=new_task, budget_ms=budget_ms):
                return Route(pool_id, node, "spill" if pool_id != primary else "primary")
            if shed_pool is None:
                shed_pool = pool_id
        if shed_pool is not None:
            return Route(shed_pool, None, "shed")
        for pool_id in candidates:
            if pool_id in chain:
                continue
            node = self._pick(pool_id, priority, digest, now)
            if node is None:
                continue
            if self._admit(pool_id, node, priority, new_task=new_task, budget_ms=budget_ms):
                return Route(pool_id, node, "model-fallback")
            return Route(pool_id, None, "shed")
        return Route(primary, None, "no-node")
