"""The per-call pick: a node for one model call from the newest desired state, in microseconds.

A :class:`Router` holds a :class:`~fleetloop.router.state.DesiredState` and this router's own
counters (round-robin credit, outstanding calls per node, retries spent against the budget). It
never asks the control plane anything per call (fleetloop is not in the request path).

Per call (:meth:`Router.pick`), in order:

0. **Fit**: a call whose prompt is longer than a pool's ``max_prompt_tokens`` (its routing
   decision's figure: the most tokens one of its nodes holds in KV cache) would fail on every node
   of that pool, so such pools are left out of steps 1-5 while any pool of an acceptable model holds
   it (the preferred model's fitting pools first, else the next model's); when none does, nothing is
   left out (the call fails where it lands, as without the figure). A call of unknown size (0) and a
   pool without the figure are never left out, so picks are unchanged where every pool fits.
1. **Pools**: every pool serving the call's preferred model takes a share of its calls: the primary
   pool of a call is picked by smooth weighted round robin (no random draw) over those pools, each
   weighted by its routable capacity: the sum of ``capacity_of(node)`` over the nodes step 2 leaves
   eligible (the live, warm, non-draining members when it fails static). ``capacity_of`` defaults
   to 1 per node; the simulator passes a node's decode bandwidth, so an H100 pool and an A100 pool
   of one model split traffic by what they can serve. Then the primary's ``spill_to`` pools (when
   they serve an acceptable model) if the call would be shed; if no pool of that chain has a
   routable node, the pools of the next acceptable model (model fallback).
2. **Nodes**: those with weight > 0 in ``by_priority[p]`` (else ``weights``), known to the router,
   not draining (by the node's own ``draining`` flag, or named on the pool's autoscale ``drain``
   list, which the engine holds until the node is gone), and not behind an enforced open breaker.
   A node a later autoscale decision no longer names is eligible again. A node that crashed stays
   routable until the control plane zeroes it: calls to it fail at once, as connection errors
   would.
3. **Prefix affinity**: the first node of ``prefix_affinity[digest]`` among those nodes.
4. **Picker**: ``weighted-random`` (by weight, seeded generator), ``round-robin`` (smooth weighted
   round robin, nginx's algorithm: each node's credit grows by its weight, the richest is picked
   and pays the total), ``least-request-p2c`` (two distinct nodes drawn uniformly, the one with
   fewer of this router's outstanding calls wins, ties to the first: Envoy LEAST_REQUEST),
   ``least-outstanding`` (the node with the fewest of this router's outstanding calls per unit of
   weight, ``(outstanding_i + 1) / w_i``, ties to the first in node-id order: HAProxy's
   ``balance leastconn`` with the published weights as server weights; no random draw),
   ``llm-d-epp`` (llm-d's endpoint picker, :mod:`fleetloop.router.epp`: each node scored on its
   waiting queue, its free KV cache and the share of the call's prompt this router's approximate
   prefix index thinks it holds, weighted as llm-d's default profile weighs them, the best taken, a
   tie drawn; the prompt's blocks are then recorded for the node picked. It runs before the one-node
   shortcut, so the index learns from every pick, and step 3 does not apply: the decision carries no
   ``prefix_affinity``).
5. **Admission**: shed when the node's queue depth is at or above ``max_queue_depth[p]``
   (``new_task_max_queue_depth[p]`` for the first call of a task), when its outstanding work (queue
   depth + running requests) is at or above ``max_outstanding[p]`` (``new_task_max_outstanding[p]``
   for a first call on a node with calls queued), or when the call's remaining latency budget is
   below ``reject_if_budget_below_ms`` (:func:`budget_rejects`: never a call with no deadline,
   budget 0, nor one of a class the decision protects). A first call on a node with nothing queued meets
   ``max_outstanding[p]`` only: the node admits it into its running batch at once, which costs the
   batch some time between tokens, while a shed first call is a lost task (the KPI counts tasks).
5b. **Prefill fit**: a call admitted on a pool whose routing decision says it prefills no prompt
   that long within the call's class TTFT SLO (``slo_prompt_tokens[p]``, physics: the model's
   FLOPs over the GPU's) goes instead to the first pool of the same model in that pool's
   ``spill_to`` whose figure the prompt is within (and whose nodes hold it), when that pool's
   picked node has nothing queued and admits it (reason ``prefill-fit``). On the first pool the
   call misses its SLO however idle the node; on the other it can meet it. The routing policy
   lists a pool in ``spill_to`` only while it has room, and the queue test keeps the move from
   trading the prefill for a wait. A figure unknown on either side, or a stale decision, moves
   nothing. The call's outcome does not name the first pool (``routed_from`` is for step 6): the
   call belongs where it went, so that pool sizes for it.
6. **Model spill**: the pools of ``spill_to`` that serve *another* model the call accepts are
   not part of step 1's spill chain; a call that chain would shed, or admits on a node that
   already has calls queued, goes instead to the first of them (in ``spill_to`` order) whose
   picked node has none queued and which admits it (reason ``model-spill``). Under continuous
   batching a queued call waits until a running one ends (the node is at its KV or sequence
   limit), and the caller listed the other model as acceptable. The routing policy decides which
   pools are offered (cache-aware: another model's pool only while its average node is at least
   half free). A call
   that accepts one model never leaves it, and without another model's pool in ``spill_to``
   (every baseline) nothing changes. The route names the pool the call was moved from
   (``Route.routed_from``); the call's outcome carries it (``RequestOutcome.routed_from``) so that
   pool's autoscaler keeps sizing for the calls it did not serve
   (:mod:`fleetloop.policies.autoscale.predictive`).

Fail static: with no routing decision for a pool, or none newer than ``fail_static_s`` (default 30 s,
bounds (0, 3600]), the router falls back to plain round robin over the pool's live, warm,
non-draining members, ignoring every other held decision (all of it is as old, the drain list
too). With a fresh decision that leaves no eligible node (a drain list naming every weighted node
among the ways), it falls back the same way but skips nodes behind an enforced open breaker, unless
that is every node: a router never ejects every node. This is the rotation rule
every integration keeps (:mod:`fleetloop.router.state`), from its pieces: ``left_out`` for step 2,
``never_empty`` for the fallback.
Retries (:meth:`Router.allow_retry`): a retry is let through while this router's retries since the
newest retry-budget decision are below ``retries_allowed_now`` (the tenant's decision first, then
the pool's); the retry of an attempt whose outcome the decision lists in ``exempt_retries_of``
(``shed``, ``error``) goes without spending it. Failing static ignores the held shed thresholds
(step 5) and the retry budget (at the caller's ``now_s``): both are as old as the routing.

Cost: steps 2-3 are derived once per (pool, priority) and cached until the desired state (a
routing or breaker decision, a changed drain list) or the fleet changes
(:meth:`Router.fleet_changed`, which the embedder calls when a node joins, leaves or starts
draining); ``weighted-random`` is then a bisection, ``least-request-p2c`` two draws, and
``round-robin`` and ``least-outstanding`` one pass over the eligible nodes (``fleetloop bench
router`` measures each).
Failure mode: an embedder that changes membership without calling ``fleet_changed`` keeps routing
by the old membership until the next routing or breaker decision arrives (within a tick).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import numpy as np

from fleetloop.router.epp import EppScheduler
from fleetloop.router.state import DesiredState, never_empty
from fleetloop.schemas.decisions import AdmissionDecision, Decision, RetryBudgetDecision, RoutingDecision

FAIL_STATIC_S = 30.0


class NodeLike(Protocol):
    """What the router needs to know of a node. The simulator's nodes and :class:`Endpoint` fit."""

    @property
    def node_id(self) -> str: ...
    @property
    def alive(self) -> bool: ...
    @property
    def warm(self) -> bool: ...
    @property
    def draining(self) -> bool: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def running(self) -> int: ...


@dataclass(slots=True)
class Endpoint:
    """A node as a real router knows it: its address, and load figures the embedder keeps current
    (from ``fleet.telemetry``, or from its own in-flight count; see ``StateFollower``)."""

    node_id: str
    pool_id: str
    address: str = ""
    alive: bool = True
    warm: bool = True
    draining: bool = False
    queue_depth: int = 0
    running: int = 0
    kv_cache_used_frac: float = 0.0  # the engine's KV cache in use (llm-d-epp's KV scorer)
    kv_capacity_tokens: int = 0  # the engine's KV cache size (llm-d-epp's index capacity; 0: unknown)


N = TypeVar("N", bound=NodeLike)


@dataclass(frozen=True, slots=True)
class Route(Generic[N]):
    pool_id: str
    node: N | None  # None: shed (or no node anywhere)
    reason: str  # primary | spill | prefill-fit | model-spill | model-fallback | shed | no-node | no-pool
    # model-spill: the pool the call was moved from (RequestOutcome.routed_from), else None
    routed_from: str | None = None


@dataclass(slots=True)
class _Eligible(Generic[N]):
    key: tuple[int, int, int]  # (state version, fleet version, id of the weights table)
    nodes: list[N]
    weights: list[float]
    cum: list[float]
    total: float
    by_id: dict[str, N]
    capacity: float


@dataclass(slots=True)
class _PoolCounters:
    budget_used: dict[str, int] = field(default_factory=dict)
    rr_credit: dict[str, float] = field(default_factory=dict)
    rr_fallback: int = 0


def _one(node: NodeLike) -> float:
    return 1.0


def _engine_attrs(node: NodeLike) -> tuple[float, int]:
    """A node's (KV cache used fraction, KV capacity tokens) from attributes of those names
    (:class:`Endpoint` has them; (0.0, 0) for a node without them)."""
    return float(getattr(node, "kv_cache_used_frac", 0.0)), int(getattr(node, "kv_capacity_tokens", 0))


def _node_id(node: NodeLike) -> str:
    return node.node_id


def budget_rejects(adm: AdmissionDecision, priority: int, budget_ms: float) -> bool:
    """The latency-budget threshold (step 5): True when the call's remaining budget is known and
    below ``reject_if_budget_below_ms`` and its class is not protected. ``budget_ms`` 0 or below
    is "no deadline" (``x-fleetloop-budget-ms`` unset, an embedder passing 0): such a call is never
    shed for its budget, or every call of an integration that knows no deadline would be. Classes
    ``budget_protected_priority`` and better (the envelope's ``protected_priority``, copied into the
    decision by the engine) are never shed for their budget either, as the envelope floors their
    queue and outstanding limits: a control plane must not shed the class it protects on a figure
    (the pool's median first-token time) it would not shed it on otherwise."""
    floor_ms = adm.reject_if_budget_below_ms
    return 0 < budget_ms < floor_ms and priority > adm.budget_protected_priority


class Router(Generic[N]):
    """One router's view: desired state plus its own counters. Not thread-safe (one per event loop)."""

    def __init__(
        self,
        pools_by_model: Mapping[str, Sequence[str]],
        rng: np.random.Generator,
        *,
        members: Mapping[str, Sequence[N]] | None = None,
        nodes: Mapping[str, N] | None = None,
        fail_static_s: float = FAIL_STATIC_S,
        capacity_of: Callable[[N], float] | None = None,
        cache: bool = True,
        engine_of: Callable[[N], tuple[float, int]] | None = None,
    ) -> None:
        if not 0.0 < fail_static_s <= 3600.0:
            raise ValueError(f"fail_static_s must be in (0, 3600], got {fail_static_s}")
        self.pools_by_model = pools_by_model
        self.rng = rng
        self.members: Mapping[str, Sequence[N]] = members if members is not None else {}
        self.nodes: Mapping[str, N] = nodes if nodes is not None else {}
        self.fail_static_s = fail_static_s
        self.state = DesiredState()
        self.outstanding: dict[str, int] = {}
        self._counters: dict[str, _PoolCounters] = {}
        self._eligible: dict[tuple[str, int], _Eligible[N]] = {}
        self._fleet_version = 0
        self._cache = cache
        self._chains: dict[tuple[str, ...], tuple[tuple[str, ...], list[str]]] = {}
        self.capacity_of: Callable[[N], float] = capacity_of if capacity_of is not None else _one
        self.pool_credit: dict[str, float] = {}  # smooth weighted round robin across a model's pools
        # llm-d-epp: (KV cache used fraction, KV capacity tokens) of a node, and the EPP's state
        self.engine_of: Callable[[N], tuple[float, int]] = (
            engine_of if engine_of is not None else _engine_attrs
        )
        self.epp = EppScheduler()

    # -- desired state ----------------------------------------------------------------------------

    def apply(self, decisions: Iterable[Decision], now_s: float, refresh_s: float = 0.0) -> list[Decision]:
        """Take in decisions (any order, duplicates welcome); return those accepted, in order.
        ``refresh_s``: their form on ``control.state`` (:meth:`DesiredState.accept`)."""
        out: list[Decision] = []
        for d in decisions:
            body = d.body
            old = None
            if isinstance(body, RoutingDecision):
                st = self.state.pools.get(body.pool_id)
                old = st.routing if st is not None else None
            if not self.state.accept(d, now_s, refresh_s):
                continue
            out.append(d)
            if isinstance(body, RoutingDecision):
                if old is None or old.weights != body.weights:
                    self._pool(body.pool_id).rr_credit = {}
            elif isinstance(body, RetryBudgetDecision):
                self._pool(body.pool_id).budget_used[body.tenant_id or ""] = 0
        return out

    def fleet_changed(self) -> None:
        """Tell the router a node joined, left or started draining (drops derived caches)."""
        self._fleet_version += 1

    def node_replaced(self, node_id: str) -> None:
        """``node_id`` came back empty (a reclaimed host's replacement: in Kubernetes a new pod, which
        llm-d's endpoint picker has never sent a prompt to): ``llm-d-epp`` forgets what its prefix
        index credited it with."""
        self.epp.index.forget(node_id)

    def open_breakers(self) -> int:
        return self.state.open_breakers()

    def _pool(self, pool_id: str) -> _PoolCounters:
        c = self._counters.get(pool_id)
        if c is None:
            c = self._counters[pool_id] = _PoolCounters()
        return c

    # -- per call ---------------------------------------------------------------------------------

    def started(self, node_id: str) -> None:
        """A call went out to ``node_id`` (feeds least-request-p2c)."""
        self.outstanding[node_id] = self.outstanding.get(node_id, 0) + 1

    def finished(self, node_id: str) -> None:
        self.outstanding[node_id] = self.outstanding.get(node_id, 1) - 1

    def allow_retry(self, pool_id: str, tenant_id: str, failed_as: str = "timeout", *, now_s: float) -> bool:
        """Spend one retry of the budget if one is left; True when the retry may go out. The retry
        of an attempt that ended as an outcome the budget exempts (``exempt_retries_of``) goes
        without spending it. A pool failing static at ``now_s`` (no routing decision fresher than
        ``fail_static_s``; the caller's clock, the one it passes to :meth:`pick` and :meth:`apply`)
        lets every retry go: a budget whose control plane went away is not refilled, and spent it
        would refuse every retry for good. ``now_s`` is required so that no caller can leave it
        out and hold a stale budget."""
        st = self.state.pools.get(pool_id)
        if st is None:
            return True
        if self.state.routing_fresh(pool_id, now_s, self.fail_static_s) is None:
            return True
        key = tenant_id if tenant_id in st.budgets else ""
        d = st.budgets.get(key)
        if d is None:
            return True
        if failed_as in d.exempt_retries_of:
            return True
        used_by = self._pool(pool_id).budget_used
        used = used_by.get(key, 0)
        if used >= d.retries_allowed_now:
            return False
        used_by[key] = used + 1
        return True

    def _eligible_for(self, pool_id: str, priority: int, now_s: float) -> _Eligible[N] | None:
        """Nodes with weight > 0 and their weights; None when the router must fail static."""
        d = self.state.routing_fresh(pool_id, now_s, self.fail_static_s)
        if d is None:
            return None
        weights = d.by_priority.get(str(priority)) or d.weights
        key = (self.state.version, self._fleet_version, id(weights))
        ck = (pool_id, priority)
        hit = self._eligible.get(ck)
        if hit is not None and hit.key == key and self._cache:
            return hit
        state = self.state
        nodes_by_id = self.nodes
        nodes: list[N] = []
        ws: list[float] = []
        left_out = state.left_out
        drained = state.draining(pool_id)  # the pool's autoscale drain list, as every actuator reads it
        for node_id in sorted(weights):
            w = weights[node_id]
            node = nodes_by_id.get(node_id)
            if node is None or node.draining or left_out(node_id, w, drained) is not None:
                continue
            nodes.append(node)
            ws.append(w)
        cum: list[float] = []
        acc = 0.0
        for w in ws:
            acc += w
            cum.append(acc)
        cap = self.capacity_of
        el = _Eligible(
            key, nodes, ws, cum, sum(ws), {n.node_id: n for n in nodes}, sum(cap(n) for n in nodes)
        )
        self._eligible[ck] = el
        return el

    def _round_robin(self, pool_id: str, *, honour_breakers: bool) -> N | None:
        """Plain round robin over live, warm, non-draining members (and, while the state is fresh,
        not ejected ones, unless every one is: a router never ejects every node)."""
        live = [n for n in self.members.get(pool_id, ()) if n.alive and n.warm and not n.draining]
        if honour_breakers:
            live = never_empty(self.state, live, _node_id)
        if not live:
            return None
        c = self._pool(pool_id)
        node = live[c.rr_fallback % len(live)]
        c.rr_fallback += 1
        return node

    def pick_node(
        self,
        pool_id: str,
        priority: int,
        digest: str | None,
        now_s: float,
        *,
        prompt_tokens: int = 0,
        prefix_tokens: int = 0,
    ) -> N | None:
        """A node of ``pool_id`` for a call of ``priority`` (steps 2-4), admission not applied.
        ``prompt_tokens`` and ``prefix_tokens`` (the call's size and its task's shared prefix, 0:
        unknown) are what ``llm-d-epp`` scores prefix-cache hits on."""
        el = self._eligible_for(pool_id, priority, now_s)
        if el is None:
            return self._round_robin(pool_id, honour_breakers=False)
        if not el.nodes:
            return self._round_robin(pool_id, honour_breakers=True)
        st = self.state.pools[pool_id]
        d = st.routing
        assert d is not None
        if d.picker == "llm-d-epp":
            return self._epp_pick(el.nodes, digest, prompt_tokens, prefix_tokens)
        if digest is not None:
            holders = d.prefix_affinity.get(digest)
            if holders:
                ids = el.by_id
                for h in holders:
                    n = ids.get(h)
                    if n is not None:
                        return n
        nodes = el.nodes
        if len(nodes) == 1:
            return nodes[0]
        picker = d.picker
        if picker == "round-robin":
            credit = self._pool(pool_id).rr_credit
            total = 0.0
            best = nodes[0]
            best_credit = -1e300
            for node, w in zip(nodes, el.weights, strict=True):
                c = credit.get(node.node_id, 0.0) + w
                credit[node.node_id] = c
                total += w
                if c > best_credit:
                    best, best_credit = node, c
            credit[best.node_id] -= total
            return best
        if picker == "least-outstanding":
            out = self.outstanding
            best = nodes[0]
            best_key = (out.get(best.node_id, 0) + 1) / el.weights[0]
            for node, w in zip(nodes, el.weights, strict=True):
                key = (out.get(node.node_id, 0) + 1) / w
                if key < best_key:
                    best, best_key = node, key
            return best
        if picker == "least-request-p2c":
            i, j = self.rng.choice(len(nodes), size=2, replace=False)
            a, b = nodes[int(i)], nodes[int(j)]
            out = self.outstanding
            return a if out.get(a.node_id, 0) <= out.get(b.node_id, 0) else b
        # weighted-random
        x = float(self.rng.random()) * el.total
        k = bisect_right(el.cum, x)
        return nodes[k] if k < len(nodes) else nodes[-1]

    def _epp_pick(
        self,
        nodes: list[N],
        digest: str | None,
        prompt_tokens: int,
        prefix_tokens: int,
    ) -> N:
        """Step 4, ``llm-d-epp`` (:class:`fleetloop.router.epp.EppScheduler`)."""
        engine = self.engine_of
        return self.epp.pick(
            nodes,
            [n.node_id for n in nodes],
            [n.queue_depth for n in nodes],
            [engine(n) for n in nodes],
            digest,
            prompt_tokens,
            prefix_tokens,
            self.rng,
        )

    def admit(
        self,
        pool_id: str,
        node: N,
        priority: int,
        *,
        new_task: bool,
        budget_ms: float,
        now_s: float | None = None,
    ) -> bool:
        """Step 5: False when the pool's shed thresholds reject this call on this node. Given
        ``now_s``, a pool failing static (no routing decision fresher than ``fail_static_s``)
        admits every call: its held thresholds are as old as its routing, and a router whose
        control plane went away must not go on shedding a class for it."""
        st = self.state.pools.get(pool_id)
        adm = st.admission if st is not None else None
        if adm is None:
            return True
        if now_s is not None and self.state.routing_fresh(pool_id, now_s, self.fail_static_s) is None:
            return True
        key = str(priority)
        limit = adm.new_task_max_queue_depth.get(key) if new_task else None
        if limit is None:
            limit = adm.max_queue_depth.get(key)
        if limit is not None and node.queue_depth >= limit:
            return False
        # A first call's own limit binds only on a node with calls queued (step 5).
        cap = adm.new_task_max_outstanding.get(key) if new_task and node.queue_depth > 0 else None
        if cap is None:
            cap = adm.max_outstanding.get(key)
        if cap is not None and node.queue_depth + node.running >= cap:
            return False
        return not budget_rejects(adm, priority, budget_ms)

    def _candidates(self, models: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
        """(the preferred model's pools, every acceptable pool in preference order), cached."""
        c = self._chains.get(models)
        if c is None:
            pools: list[str] = []
            for m in models:
                for p in self.pools_by_model.get(m, ()):
                    if p not in pools:
                        pools.append(p)
            first = next((tuple(self.pools_by_model[m]) for m in models if self.pools_by_model.get(m)), ())
            c = self._chains[models] = (first, pools)
        return c

    def _capacity(self, pool_id: str, priority: int, now_s: float) -> float:
        el = self._eligible_for(pool_id, priority, now_s)
        if el is not None:
            return el.capacity
        cap = self.capacity_of
        return sum(cap(n) for n in self.members.get(pool_id, ()) if n.alive and n.warm and not n.draining)

    def _primary(self, pools: tuple[str, ...], priority: int, now_s: float) -> str:
        """The pool that takes this call among the pools of one model (step 1)."""
        if len(pools) == 1:
            return pools[0]
        shares = [(p, self._capacity(p, priority, now_s)) for p in pools]
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

    def _holds(self, pool_id: str, prompt_tokens: int) -> bool:
        """Whether a node of the pool holds a prompt this long (its routing decision's
        ``max_prompt_tokens``; no decision or no figure: it does)."""
        st = self.state.pools.get(pool_id)
        limit = st.routing.max_prompt_tokens if st is not None and st.routing is not None else None
        return limit is None or prompt_tokens <= limit

    def _fitting(
        self, first: tuple[str, ...], pools: list[str], prompt_tokens: int
    ) -> tuple[tuple[str, ...], list[str]]:
        """Step 0: the pools whose nodes hold the prompt, when any pool of an acceptable model
        does; otherwise every pool, as if no limit were known (the call fails where it lands, as
        it would have)."""
        if prompt_tokens <= 0 or all(self._holds(p, prompt_tokens) for p in pools):
            return first, pools
        fit = [p for p in pools if self._holds(p, prompt_tokens)]
        if not fit:
            return first, pools
        first_fit = tuple(p for p in first if p in fit)
        if not first_fit:  # the preferred model fits nowhere: the next acceptable model's pools
            first_fit = tuple(p for p in fit if self._model_of(p) == self._model_of(fit[0]))
        return first_fit, fit

    def _model_of(self, pool_id: str) -> str:
        return next((m for m, ps in self.pools_by_model.items() if pool_id in ps), "")

    def pick(
        self,
        models: tuple[str, ...],
        priority: int,
        digest: str | None,
        *,
        new_task: bool,
        budget_ms: float,
        now_s: float,
        prompt_tokens: int = 0,
        prefix_tokens: int = 0,
    ) -> Route[N]:
        """Steps 1-6 for one call: where it goes, or why it is shed (see the module docstring).
        ``prompt_tokens`` (0: unknown) keeps the call off pools whose nodes cannot hold it and
        moves it to a pool that prefills it within its SLO (step 5b); with ``prefix_tokens`` (the
        leading tokens of the prompt that are its task's shared prefix) ``llm-d-epp`` scores prefix
        hits on it."""
        size = {"prompt_tokens": prompt_tokens, "prefix_tokens": prefix_tokens}
        first, pools = self._candidates(models)
        if not pools:
            return Route("", None, "no-pool")
        first, pools = self._fitting(first, pools, prompt_tokens)
        primary = self._primary(first, priority, now_s)
        candidates = pools if primary == pools[0] else [primary, *(p for p in pools if p != primary)]
        st = self.state.pools.get(primary)
        spill = st.routing.spill_to if st is not None and st.routing is not None else ()
        others: list[str] = []
        if spill and len(models) > 1:
            # Step 6's pools: those of another model the call accepts (and whose nodes hold it).
            own = self._model_of(primary)
            others = [p for p in spill if p in candidates and self._model_of(p) != own]
            spill = tuple(p for p in spill if p not in others)
        chain = [primary] + [p for p in spill if p in candidates and p != primary] if spill else [primary]
        shed_pool: str | None = None
        for pool_id in chain:
            node = self.pick_node(pool_id, priority, digest, now_s, **size)
            if node is None:
                continue
            if self.admit(pool_id, node, priority, new_task=new_task, budget_ms=budget_ms, now_s=now_s):
                route = Route(pool_id, node, "spill" if pool_id != primary else "primary")
                moved = self._prefill_fit(route, priority, digest, new_task, budget_ms, now_s, prompt_tokens)
                if moved is not None:
                    return moved
                if others and node.queue_depth >= 1:
                    return self._model_spill(route, others, priority, digest, new_task, budget_ms, now_s)
                return route
            if shed_pool is None:
                shed_pool = pool_id
        if shed_pool is not None:
            shed: Route[N] = Route(shed_pool, None, "shed")
            if others:
                return self._model_spill(shed, others, priority, digest, new_task, budget_ms, now_s)
            return shed
        for pool_id in candidates:
            if pool_id in chain:
                continue
            node = self.pick_node(pool_id, priority, digest, now_s, **size)
            if node is None:
                continue
            if self.admit(pool_id, node, priority, new_task=new_task, budget_ms=budget_ms, now_s=now_s):
                return Route(pool_id, node, "model-fallback")
            return Route(pool_id, None, "shed")
        return Route(primary, None, "no-node")

    def _prefill_fit(  # noqa: PLR0917 - the route and the call's figures
        self,
        route: Route[N],
        priority: int,
        digest: str | None,
        new_task: bool,
        budget_ms: float,
        now_s: float,
        prompt_tokens: int,
    ) -> Route[N] | None:
        """Step 5b: the call's route on the first pool of the same model in the admitting pool's
        ``spill_to`` that prefills ``prompt_tokens`` within the class's TTFT SLO where the admitting
        pool does not (both routing decisions' ``slo_prompt_tokens``), whose picked node has nothing
        queued and admits it; None when the call stays (the figure unknown on either side, the
        admitting pool's decision stale, or no such pool)."""
        if prompt_tokens <= 0:
            return None
        st = self.state.pools.get(route.pool_id)
        d = st.routing if st is not None else None
        if d is None or not d.spill_to:
            return None
        key = str(priority)
        here = d.slo_prompt_tokens.get(key)
        if here is None or prompt_tokens <= here:
            return None
        if self._eligible_for(route.pool_id, priority, now_s) is None:  # stale: fail static
            return None
        model = self._model_of(route.pool_id)
        for pool_id in d.spill_to:
            other = self.state.pools.get(pool_id)
            od = other.routing if other is not None else None
            fits = od.slo_prompt_tokens.get(key) if od is not None else None
            if fits is None or prompt_tokens > fits or self._model_of(pool_id) != model:
                continue
            if not self._holds(pool_id, prompt_tokens):
                continue
            node = self.pick_node(pool_id, priority, digest, now_s)
            if node is None or node.queue_depth > 0:
                continue
            if self.admit(pool_id, node, priority, new_task=new_task, budget_ms=budget_ms, now_s=now_s):
                return Route(pool_id, node, "prefill-fit")
        return None

    def _model_spill(  # noqa: PLR0917 - the route and the call's figures
        self,
        route: Route[N],
        others: list[str],
        priority: int,
        digest: str | None,
        new_task: bool,
        budget_ms: float,
        now_s: float,
    ) -> Route[N]:
        """Step 6: the first of ``others`` (pools of another model the call accepts, in the primary's
        ``spill_to`` order) whose picked node has no call queued and which admits the call; else
        ``route`` (the call admitted on a node with calls queued, or shed)."""
        for pool_id in others:
            other = self.pick_node(pool_id, priority, digest, now_s)
            if other is None or other.queue_depth > 0:
                continue
            if self.admit(pool_id, other, priority, new_task=new_task, budget_ms=budget_ms, now_s=now_s):
                return Route(pool_id, other, "model-spill", routed_from=route.pool_id)
        return route
