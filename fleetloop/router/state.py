"""Desired state as a router holds it: the newest enforced decision per key, nothing else. Pure.

``control.state`` is compacted and keyed ``<kind>/<entity>``; a router may see the same decision
twice (at-least-once) or an older one after a newer one (a restart re-reading the topic). The rule
is at-least-once delivery of desired state: a decision older, by ``tick_id``, than the one held
for its key is dropped; a decision of the same tick replaces the held one (publishing the same
decision twice is harmless). Shadow-mode decisions never act.

``version`` grows by one with every accepted decision that may change which node a call may go to
(routing, breaker, an autoscale decision whose drain list differs from the one held), so a picker
can cache what it derived from the state and know when to recompute. No clock, no I/O: the caller
says when (``now_s``, on whatever monotonic clock it runs).

**The rotation rule** every router integration and actuator keeps (HAProxy, vllm-router, the
:class:`~fleetloop.router.pick.Router`, and any to come): which of a pool's nodes take new calls.
Fleetloop must never make a pool unreachable that it would not be without fleetloop, so:

1. *No fresh routing decision* (none held, or none newer than the caller's fail-static TTL, plus
   the daemon's refresh period when it sends only changes: ``control.state``'s form 2): the
   state is unknown, not empty. Every node the caller serves the pool with takes calls, evenly,
   whatever else is held ("fail-static"): what the router did before fleetloop.
2. *A fresh decision*: a node takes calls, at its weight, unless :meth:`DesiredState.left_out`
   names why not (not named by the decision, an enforced open breaker, on autoscale's drain list
   where the caller enforces that list, weight 0).
3. *A fresh decision that leaves none of them*: the nodes not behind an enforced open breaker take
   calls evenly, or all of them if that is every one (:func:`never_empty`; an actuator prefers the
   nodes the decision names, the best knowledge it has of which of its slots have a node behind
   them). A decision that names no node (a daemon that lost sight of the pool's nodes), weight 0
   everywhere, a drain list naming every node, or breakers on every weighted node never empty a
   pool.

Breakers on every node: the daemon's envelope already enforces at most ``max_ejected_frac`` of a
pool's nodes, and when that cap lets every node be ejected (1.0) its routing fails open, spreading
the pool evenly over its nodes with the breakers ignored (``fleetloop.core.decide.engine``). A
router follows that decision: the rule would allow a pool with an enforced open breaker on each
node to go dark, but neither the daemon nor a router ever asks for it, so no integration has to
know the policy's cap. An all-failing pool keeps getting calls, as it would without fleetloop.

:func:`rotation` is the whole rule for a caller that holds a pool's nodes by id (the actuators).
The Router applies the same pieces (:meth:`DesiredState.routing_fresh`, :meth:`DesiredState.left_out`
with :meth:`DesiredState.draining`, :func:`never_empty`) over its two views of a pool: the nodes it
knows for the weighted pick (cached per state version) and its live members for the plain one.
Every caller enforces the drain list: a node on it takes no new calls while the routing decision is
fresh, whatever its own telemetry says, and takes them again once a later autoscale decision for
its pool no longer names it.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

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
    """What is held for one pool. ``routing_at_s`` is when the routing decision arrived;
    ``routing_refresh_s`` how often its daemon re-sends an unchanged one (0: every tick)."""

    routing: RoutingDecision | None = None
    routing_at_s: float = -1e18
    routing_refresh_s: float = 0.0
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

    def accept(self, d: Decision, now_s: float, refresh_s: float = 0.0) -> bool:
        """File ``d`` if it is enforced and not older than what is held for its key. ``refresh_s``:
        the record's form on ``control.state`` (:func:`fleetloop.schemas.decisions.refresh_s_of`):
        0 when its daemon sends every decision every tick, else how often it re-sends an unchanged
        one."""
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
            st.routing_refresh_s = refresh_s
            self.version += 1
        elif isinstance(body, BreakerDecision):
            self.breakers[body.node_id] = body
            self.version += 1
        elif isinstance(body, AdmissionDecision):
            self.pool(body.pool_id).admission = body
        elif isinstance(body, RetryBudgetDecision):
            self.pool(body.pool_id).budgets[body.tenant_id or ""] = body
        elif isinstance(body, AutoscaleDecision):
            st = self.pool(body.pool_id)
            if (st.autoscale.drain if st.autoscale is not None else ()) != body.drain:
                self.version += 1  # the drain list keeps nodes out of rotation
            st.autoscale = body
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
        """The pool's routing decision while it is younger than ``ttl_s``, plus its daemon's refresh
        period when the daemon sends only changes (an unchanged pool's record is that much older
        while the daemon still stands by it); None once it went stale."""
        st = self.pools.get(pool_id)
        if st is None or st.routing is None or now_s - st.routing_at_s > ttl_s + st.routing_refresh_s:
            return None
        return st.routing

    def draining(self, pool_id: str) -> frozenset[str]:
        """The nodes on the pool's autoscale drain list (empty without an autoscale decision)."""
        st = self.pools.get(pool_id)
        if st is None or st.autoscale is None or not st.autoscale.drain:
            return _NONE
        return frozenset(st.autoscale.drain)

    def left_out(self, node_id: str, weight: float | None, drain: Container[str] = ()) -> str | None:
        """Why a fresh routing decision that gives ``node_id`` ``weight`` (None: does not name it)
        keeps it out of rotation, or None when it takes calls (the rule's step 2, module docstring):
        ``not-a-member``, ``breaker-open`` (enforced), ``autoscale-drain`` (when ``drain``, the
        pool's drain list where the caller enforces it, names it), ``weight-zero``."""
        if weight is None:
            return "not-a-member"
        if self.ejected(node_id):
            return "breaker-open"
        if node_id in drain:
            return "autoscale-drain"
        if not weight > 0:
            return "weight-zero"
        return None

    def half_open(self, node_id: str) -> bool:
        """True when an enforced half-open breaker probes ``node_id`` (it takes calls at its weight)."""
        b = self.breakers.get(node_id)
        return b is not None and b.enforced and b.state == "half_open"


_NONE: frozenset[str] = frozenset()
T = TypeVar("T")


def _same(x: str) -> str:
    return x


def never_empty(
    state: DesiredState, nodes: Sequence[T], key: Callable[[T], str], named: Container[str] | None = None
) -> list[T]:
    """The nodes that take calls, evenly, when a fresh decision leaves none of ``nodes`` in
    rotation (the rule's step 3); ``key`` gives a node's id.

    ``named``: the decision's nodes, for a caller that cannot tell which of its nodes exist (an
    actuator's declared servers or workers, some with nothing behind them): the nodes it names are
    preferred, all of ``nodes`` when it names none of them. A caller that knows its live nodes (the
    Router's members) passes None. Of those, the ones not behind an enforced open breaker; every
    one of them when that is all: a router never ejects every node."""
    pool = list(nodes)
    if named is not None:
        pool = [n for n in pool if key(n) in named] or pool
    if not state.breakers:
        return pool
    healthy = [n for n in pool if not state.ejected(key(n))]
    return healthy or pool


Mode = Literal["routing", "fail-static", "never-empty"]


@dataclass(frozen=True, slots=True)
class Rotation:
    """One pool's rotation (:func:`rotation`): the nodes that take new calls and why the rest do not.

    ``mode`` ``routing``: ``weights`` are the fresh decision's (each > 0) for the nodes in
    rotation; ``fail-static`` and ``never-empty``: the nodes in rotation share evenly (1.0 each).
    ``why`` names every node given: ``routing``, ``half-open``, ``fail-static`` or ``never-empty``
    for one in rotation, the :meth:`DesiredState.left_out` reason for one out."""

    mode: Mode
    weights: Mapping[str, float]  # node in rotation -> weight, in the order the nodes were given
    why: Mapping[str, str]  # every node given -> why it is in or out

    def serves(self, node_id: str) -> bool:
        return node_id in self.weights


def rotation(
    state: DesiredState,
    pool_id: str,
    node_ids: Iterable[str],
    now_s: float,
    ttl_s: float,
    *,
    drain: bool = True,
) -> Rotation:
    """The rotation rule (module docstring) for the pool's nodes ``node_ids`` (the ones the caller
    can send calls to: its declared servers or workers), from the state held at ``now_s`` with
    fail-static TTL ``ttl_s``. ``drain``: the caller enforces autoscale's drain list (an actuator
    of a router that cannot be told a node is draining any other way)."""
    ids = list(node_ids)
    routing = state.routing_fresh(pool_id, now_s, ttl_s)
    if routing is None:
        return Rotation("fail-static", dict.fromkeys(ids, 1.0), dict.fromkeys(ids, "fail-static"))
    table = routing.weights
    drained = state.draining(pool_id) if drain else _NONE
    weights: dict[str, float] = {}
    why: dict[str, str] = {}
    for node_id in ids:
        w = table.get(node_id)
        out = state.left_out(node_id, w, drained)
        if out is not None:
            why[node_id] = out
            continue
        assert w is not None
        weights[node_id] = w
        why[node_id] = "half-open" if state.half_open(node_id) else "routing"
    if weights or not ids:
        return Rotation("routing", weights, why)
    spread = never_empty(state, ids, _same, table)
    for node_id in spread:
        why[node_id] = "never-empty"
    return Rotation("never-empty", dict.fromkeys(spread, 1.0), why)
