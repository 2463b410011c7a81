"""ratio: retries capped at a share of a pool's requests (Finagle's RetryBudget, gRPC retry throttling).

Formula, over the engine's window ``W`` (seconds)::

    counted = max(0, retries_w - shed_w - lost_w)      (retries_w when exempt_shed_and_lost is off)
    ratio   = retry_ratio + k / max(1, warm)           (k nodes short after a mass failure, below)
    allowed = max(0, floor(min_retries_per_s * W + ratio * requests_w) - counted)
    exempt_retries_of = (error, shed)                   (empty when exempt_shed_and_lost is off)

published per pool (and per tenant seen in the window, with the tenant's own counts; the pool's
``lost_w`` is shared out by the tenant's share of requests), so a router drops a retry once the
window's budget is spent. ``requests_w`` counts every attempt routed to the pool, ``retries_w``
those with ``attempt > 0``, ``shed_w`` the calls our own admission turned away, ``lost_w`` the
calls that failed on nodes that left service (stale: crashed; not warm: reclaimed and reloading).

A retry budget exists to break one feedback loop: failures caused by load, whose retries add load
(the storm). Three kinds of failed call are not in that loop:

- **a shed call** never ran: it cost no GPU time, and its retry is admitted or shed again by the
  same admission thresholds. Refusing it as well turns one shed first call into a lost task while
  the budget's own job (keeping retries from loading the GPUs) is already done by admission.
- **a call lost with its node** (a crash, a preemption, a rack): every call in flight there fails
  at the same moment whatever the load. That is a correlated mass failure, not a storm: the
  retries are bounded by the calls that were in flight (they do not feed themselves: the node is
  gone, the retry goes elsewhere), and refusing them loses tasks that a surviving node can serve.
- **a call that timed out on a survivor of a mass failure**: with ``k`` of ``N`` nodes gone, the
  ``N - k`` survivors carry ``N / (N - k)`` of their load until the lost capacity is back (a
  reclaimed node reloads, the autoscaler replaces a crashed one: a cold start). The excess,
  ``k / (N - k)`` of the requests, is the lost nodes' displaced load, not load that retries
  created: it waits or times out, and its retries are bounded by it. So while the pool is short of
  the nodes it lost, the ratio grows by ``k / warm`` (half a pool lost: +1, every displaced call
  may retry once per window). A storm on the survivors is still bounded, at ``1 + ratio`` of the
  offered load; a storm without a lost node (a slowdown, a black hole that keeps reporting warm)
  meets the plain ratio.

Mass failure, the episode (state, per pool): a node is *lost* when it failed calls in the window
and is stale (crashed) or not warm without draining (reclaimed, reloading); a scale-up node that is
still loading has failed no call and is not lost. On the first lost node the episode records
``ref = warm + lost`` (the serving nodes before the failure); while it lasts ``k = max(0, ref -
warm)`` with ``warm`` the warm, fresh, not-draining nodes now. It ends once ``warm >= ref`` and a
window has passed since the last lost node (the survivors' queued timeouts arrive up to a client
timeout later), or ``episode_max_s`` after it began: capacity that has not come back by then is the
pool's new size, and the plain ratio applies.

They are told apart where the retry happens: the decision lists ``exempt_retries_of = (error,
shed)`` and the router lets such a retry through without spending the count (a mass failure's
retries come within a backoff of the failure, before any window that counts them could reach a
tick). An ``error`` is a call its node dropped (connection refused, node lost); a slow call is a
``timeout`` and stays budgeted (by the grown ratio during an episode). The window's own count
leaves those exempt retries out (about one per shed or lost call), so they do not shrink the
budget left for the others either.

Inputs: the pool's and tenants' request, retry and shed counts over the window; the pool's nodes
(``failures_w``, ``stale``, ``weights_state``, ``draining``). Parameters (defaults, bounds):
``retry_ratio`` 0.2 (0-1; Finagle's default percentCanRetry), ``min_retries_per_s`` 10 (0-10 000;
Finagle's minRetriesPerSec), ``per_tenant`` true, ``exempt_shed_and_lost`` true (false: Finagle's
plain budget, which counts every retry the same, and no episode), ``episode_max_s`` 300 (0-3600;
0 turns the episode off): published vLLM cold starts are 82 s with every cache warm and 294 s
uncached for an 8B model (the simulator's catalog), so a lost node is back or replaced within
about five minutes; capacity still missing after that is not coming back by itself.
Trade-offs: bounds storm retry load at 1 + ratio of offered load, which breaks the retry-storm
feedback loop; a burst of real transient errors on serving nodes beyond the ratio is not retried.
A shed call's retry is granted by the budget but can be shed again: shedding, not the budget,
decides whether the overload turns into lost tasks. During an episode a storm on the survivors is
bounded more loosely (``1 + retry_ratio + k / warm``).
Failure mode: the counts are a window behind; a sudden storm can overspend one window's budget.
A node that keeps reporting warm while it fails every call fast (a black hole) is not "lost": its
failures count as a storm until the breaker ejects it. A router whose shed calls are retried by a
client that ignores backoff can spend the shed grant on those retries within one window (bounded
by the shed count). A pool that loses nodes and then scales down on purpose within the episode
keeps the grown ratio until ``warm`` is back at ``ref`` or ``episode_max_s`` passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pydantic import Field

from fleetloop.policies.base import FleetSnapshot, NodeView, Params, PolicyContext, PolicyResult
from fleetloop.policies.pool_figures import (
    EMPTY,
    distinct_pools,
    figures_of,
    inputs_ok,
    is_ident,
    pool_figures,
)
from fleetloop.schemas.base import MAX_COUNT, MAX_FIGURE, assemble
from fleetloop.schemas.decisions import RetryBudgetDecision, RetryExempt


class RatioParams(Params):
    retry_ratio: float = Field(default=0.2, ge=0.0, le=1.0)
    min_retries_per_s: float = Field(default=10.0, ge=0.0, le=10_000.0)
    per_tenant: bool = True
    exempt_shed_and_lost: bool = True
    episode_max_s: float = Field(default=300.0, ge=0.0, le=3600.0)


@dataclass(frozen=True, slots=True)
class Episode:
    """A mass failure in progress: the serving nodes before it (``ref``), when it began, and when
    a node was last seen lost."""

    ref: int
    since_ms: int
    last_loss_ms: int


def allowed(
    params: RatioParams,
    window_s: float,
    requests: int,
    retries: int,
    exempt: int = 0,
    *,
    extra: float = 0.0,
) -> int:
    """The window's budget for retries the router counts; ``exempt`` estimates the retries of shed
    and lost calls among ``retries`` (the router lets those through uncounted); ``extra`` is the
    ratio a mass failure adds (``k / warm``)."""
    counted = max(0, retries - max(0, exempt)) if params.exempt_shed_and_lost else retries
    ratio = params.retry_ratio + max(0.0, extra)
    return max(0, math.floor(params.min_retries_per_s * window_s + ratio * requests) - counted)


def lost_nodes(nodes: Iterable[NodeView]) -> int:
    """Nodes that failed calls in the window and left service: crashed (stale) or reclaimed (not
    warm, not draining). A scale-up node still loading has failed nothing and is not counted."""
    return sum(
        1 for n in nodes if n.failures_w > 0 and (n.stale or (n.weights_state != "warm" and not n.draining))
    )


def next_episode(
    params: RatioParams, episode: Episode | None, nodes: Iterable[NodeView], now_ms: int, window_ms: int
) -> tuple[Episode | None, int, int]:
    """(the episode after this tick, ``k`` nodes short, ``warm`` nodes serving); see the module
    docstring. No episode without ``exempt_shed_and_lost`` or with ``episode_max_s`` 0."""
    nodes = list(nodes)
    warm = sum(1 for n in nodes if n.warm and not n.stale)
    return episode_after(
        params, episode, warm, lost_now=lambda: lost_nodes(nodes), now_ms=now_ms, window_ms=window_ms
    )


def episode_after(
    params: RatioParams,
    episode: Episode | None,
    warm: int,
    *,
    lost_now: Callable[[], int],
    now_ms: int,
    window_ms: int,
) -> tuple[Episode | None, int, int]:
    """:func:`next_episode` from the pool's counts: ``warm`` nodes serving, ``lost_now()`` nodes
    lost (:func:`lost_nodes`, asked only when an episode can start)."""
    if not params.exempt_shed_and_lost or params.episode_max_s <= 0:
        return None, 0, warm
    lost = lost_now()
    if lost:
        if episode is None:
            episode = Episode(ref=warm + lost, since_ms=now_ms, last_loss_ms=now_ms)
        else:
            episode = Episode(max(episode.ref, warm + lost), episode.since_ms, now_ms)
    if episode is None:
        return None, 0, warm
    over = now_ms - episode.since_ms >= params.episode_max_s * 1000.0
    back = warm >= episode.ref and now_ms - episode.last_loss_ms >= window_ms
    if over or back:
        return None, 0, warm
    return episode, max(0, episode.ref - warm), warm


def lost_calls(nodes: Iterable[NodeView]) -> int:
    """Calls that failed on nodes no longer serving: crashed (stale) or reclaimed (not warm)."""
    return sum(n.failures_w for n in nodes if n.stale or n.weights_state != "warm")


class Ratio:
    name = "ratio"
    section = "retry_budget"
    Params = RatioParams

    def initial_state(self) -> Episode | None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: RatioParams, state: Episode | None, ctx: PolicyContext
    ) -> PolicyResult[Episode | None]:
        window_s = snap.window_ms / 1000.0
        pool = snap.pools.get(ctx.pool_id)
        requests = pool.requests_w if pool else 0
        retries = pool.retries_w if pool else 0
        shed = pool.shed_w if pool else 0
        # The pool's counts from the fleet-wide columns (:mod:`fleetloop.policies.pool_figures`):
        # ``lost_calls``, ``lost_nodes`` and the warm count of the pool's nodes, without its views.
        figs = figures_of(snap, ctx.pool_id)
        lost = figs.lost_calls
        episode, short, warm = episode_after(
            params,
            state,
            figs.warm_fresh,
            lost_now=lambda: figs.lost_nodes,
            now_ms=snap.now_ms,
            window_ms=snap.window_ms,
        )
        extra = short / max(1, warm) if short else 0.0
        inputs = {
            "requests_w": float(requests),
            "retries_w": float(retries),
            "shed_w": float(shed),
            "lost_w": float(lost),
        }
        if episode is not None:
            inputs["nodes_short"] = float(short)
            inputs["nodes_warm"] = float(warm)
            inputs["ratio_added"] = round(extra, 6)
        if episode is not None:
            reason = "budget+mass-failure"
        elif shed + lost == 0 or not params.exempt_shed_and_lost:
            reason = "budget"
        else:
            reason = "budget+shed-lost"
        exempt: tuple[RetryExempt, ...] = ("error", "shed") if params.exempt_shed_and_lost else ()
        decisions = [
            budget_decision(
                f"pool/{ctx.pool_id}",
                pool_id=ctx.pool_id,
                tenant_id=None,
                params=params,
                retries_allowed_now=allowed(params, window_s, requests, retries, shed + lost, extra=extra),
                exempt_retries_of=exempt,
                reason=reason,
                inputs=inputs,
            )
        ]
        if params.per_tenant:
            for t in snap.tenants.values():
                if t.requests_w == 0:
                    continue
                # The tenant's share of the calls lost with their nodes (the view is not per node).
                lost_t = math.floor(lost * min(1.0, t.requests_w / requests)) if requests > 0 else 0
                decisions.append(
                    budget_decision(
                        f"pool/{ctx.pool_id}/tenant/{t.tenant_id}",
                        pool_id=ctx.pool_id,
                        tenant_id=t.tenant_id,
                        params=params,
                        retries_allowed_now=allowed(
                            params, window_s, t.requests_w, t.retries_w, t.shed_w + lost_t, extra=extra
                        ),
                        exempt_retries_of=exempt,
                        reason="tenant-budget",
                        inputs={
                            "requests_w": float(t.requests_w),
                            "retries_w": float(t.retries_w),
                            "shed_w": float(t.shed_w),
                            "lost_w": float(lost_t),
                        },
                    )
                )
        return PolicyResult(decisions=tuple(decisions), state=episode)

    def decide_pools(
        self,
        snap: FleetSnapshot,
        params: RatioParams,
        states: Sequence[Episode | None],
        ctxs: Sequence[PolicyContext],
    ) -> list[PolicyResult[Episode | None]]:
        """Equal, element for element and bit for bit (decisions, state, diagnostics), to
        ``[self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]``: each
        tenant's budget and inputs computed once per lost share and added ratio, not once per pool
        (see ``_decide_pools``)."""
        if len(states) != len(ctxs) or not distinct_pools(ctxs):
            return [self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]
        return _decide_pools(snap, params, states, ctxs)


_BUDGET_FIELDS = (
    "entity", "reason", "inputs", "kind", "pool_id", "tenant_id", "retry_ratio", "min_retries_per_s",
    "retries_allowed_now", "exempt_retries_of",
)  # fmt: skip
assert tuple(RetryBudgetDecision.model_fields) == _BUDGET_FIELDS  # ``budget_decision`` lists them in order
_EXEMPT: frozenset[str] = frozenset(("shed", "error"))


def budget_decision(
    entity: str,
    *,
    pool_id: str,
    tenant_id: str | None,
    params: RatioParams,
    retries_allowed_now: int,
    exempt_retries_of: tuple[RetryExempt, ...],
    reason: str,
    inputs: dict[str, float],
) -> RetryBudgetDecision:
    """``RetryBudgetDecision(...)`` with these fields (``tenant_id`` only when given), assembled
    without validation when every part is valid by construction: the ids come from validated
    telemetry, outcomes and ticks, the ratio and floor from the validated params, and the count and
    figures are checked here against the schema's bounds. A pool decides one per tenant every tick
    (~4,000 at 10,000 nodes), and validating them cost more than computing them. Anything else goes
    through validation and fails there, exactly as before (``tests/unit/test_fast_bodies.py``)."""
    if (
        entity
        and reason
        and type(retries_allowed_now) is int
        and 0 <= retries_allowed_now <= MAX_COUNT
        and type(params.retry_ratio) is float
        and 0.0 <= params.retry_ratio <= 1.0
        and type(params.min_retries_per_s) is float
        and 0.0 <= params.min_retries_per_s <= MAX_FIGURE
        and type(exempt_retries_of) is tuple
        and len(exempt_retries_of) <= 2
        and all(x in _EXEMPT for x in exempt_retries_of)
        and all(type(x) is float and -MAX_FIGURE <= x <= MAX_FIGURE for x in inputs.values())  # not NaN
    ):
        values: dict[str, object] = {
            "entity": entity,
            "reason": reason,
            "inputs": inputs,
            "kind": "retry_budget",
            "pool_id": pool_id,
            "tenant_id": tenant_id,
            "retry_ratio": params.retry_ratio,
            "min_retries_per_s": params.min_retries_per_s,
            "retries_allowed_now": retries_allowed_now,
            "exempt_retries_of": exempt_retries_of,
        }
        given = _GIVEN_TENANT if tenant_id is not None else _GIVEN_POOL
        return assemble(RetryBudgetDecision, values, set(given))
    if tenant_id is None:
        return RetryBudgetDecision(
            entity=entity,
            pool_id=pool_id,
            retry_ratio=params.retry_ratio,
            min_retries_per_s=params.min_retries_per_s,
            retries_allowed_now=retries_allowed_now,
            exempt_retries_of=exempt_retries_of,
            reason=reason,
            inputs=inputs,
        )
    return RetryBudgetDecision(
        entity=entity,
        pool_id=pool_id,
        tenant_id=tenant_id,
        retry_ratio=params.retry_ratio,
        min_retries_per_s=params.min_retries_per_s,
        retries_allowed_now=retries_allowed_now,
        exempt_retries_of=exempt_retries_of,
        reason=reason,
        inputs=inputs,
    )


_GIVEN_POOL: frozenset[str] = frozenset(
    ("entity", "pool_id", "retry_ratio", "min_retries_per_s", "retries_allowed_now", "exempt_retries_of",
     "reason", "inputs")
)  # fmt: skip
_GIVEN_TENANT: frozenset[str] = _GIVEN_POOL | {"tenant_id"}


def _const(n: int) -> Callable[[], int]:
    return lambda: n


def _decide_pools(
    snap: FleetSnapshot, params: RatioParams, states: Sequence[Episode | None], ctxs: Sequence[PolicyContext]
) -> list[PolicyResult[Episode | None]]:
    """:meth:`Ratio.decide` for a batch of pools. A tenant's decision reads the pool only through
    its lost calls (its share) and the ratio a mass failure adds: its budget and inputs are
    computed once per (tenant, share, added ratio) and copied into each pool's decision, assembled
    without validation when every part is in bounds (:func:`budget_decision`'s test, made once)."""
    window_s = snap.window_ms / 1000.0
    figures = pool_figures(snap)
    exempt: tuple[RetryExempt, ...] = ("error", "shed") if params.exempt_shed_and_lost else ()
    tenants = [t for t in snap.tenants.values() if t.requests_w != 0] if params.per_tenant else []
    params_ok = (
        type(params.retry_ratio) is float
        and 0.0 <= params.retry_ratio <= 1.0
        and type(params.min_retries_per_s) is float
        and 0.0 <= params.min_retries_per_s <= MAX_FIGURE
    )
    tenant_ok = [is_ident(t.tenant_id) for t in tenants]
    tenant_small = [type(t.requests_w) is int and abs(t.requests_w) < 2**53 for t in tenants]
    # Each tenant decision's values, in the model's field order: the pool's parts are set per pool.
    templates: list[dict[str, object]] = [
        {
            "entity": "",
            "reason": "tenant-budget",
            "inputs": None,
            "kind": "retry_budget",
            "pool_id": "",
            "tenant_id": t.tenant_id,
            "retry_ratio": params.retry_ratio,
            "min_retries_per_s": params.min_retries_per_s,
            "retries_allowed_now": 0,
            "exempt_retries_of": exempt,
        }
        for t in tenants
    ]
    # (tenant index, its lost share, the added ratio) -> (allowed, inputs, whether both are in bounds)
    made: dict[tuple[int, int, float], tuple[int, dict[str, float], bool]] = {}
    out: list[PolicyResult[Episode | None]] = []
    for state, ctx in zip(states, ctxs, strict=True):
        pid = ctx.pool_id
        pool = snap.pools.get(pid)
        requests = pool.requests_w if pool else 0
        retries = pool.retries_w if pool else 0
        shed = pool.shed_w if pool else 0
        figs = figures.get(pid, EMPTY)
        lost = figs.lost_calls
        episode, short, warm = episode_after(
            params,
            state,
            figs.warm_fresh,
            lost_now=_const(figs.lost_nodes),
            now_ms=snap.now_ms,
            window_ms=snap.window_ms,
        )
        extra = short / max(1, warm) if short else 0.0
        inputs = {
            "requests_w": float(requests),
            "retries_w": float(retries),
            "shed_w": float(shed),
            "lost_w": float(lost),
        }
        if episode is not None:
            inputs["nodes_short"] = float(short)
            inputs["nodes_warm"] = float(warm)
            inputs["ratio_added"] = round(extra, 6)
        if episode is not None:
            reason = "budget+mass-failure"
        elif shed + lost == 0 or not params.exempt_shed_and_lost:
            reason = "budget"
        else:
            reason = "budget+shed-lost"
        decisions: list[RetryBudgetDecision] = [
            budget_decision(
                f"pool/{pid}",
                pool_id=pid,
                tenant_id=None,
                params=params,
                retries_allowed_now=allowed(params, window_s, requests, retries, shed + lost, extra=extra),
                exempt_retries_of=exempt,
                reason=reason,
                inputs=inputs,
            )
        ]
        fast = params_ok and is_ident(pid)
        prefix = f"pool/{pid}/tenant/"
        for k, t in enumerate(tenants):
            if lost or not tenant_small[k]:
                lost_t = math.floor(lost * min(1.0, t.requests_w / requests)) if requests > 0 else 0
            else:
                lost_t = 0  # no call lost: no share (the division cannot overflow, checked above)
            key = (k, lost_t, extra)
            found = made.get(key)
            if found is None:
                n = allowed(params, window_s, t.requests_w, t.retries_w, t.shed_w + lost_t, extra=extra)
                t_inputs = {
                    "requests_w": float(t.requests_w),
                    "retries_w": float(t.retries_w),
                    "shed_w": float(t.shed_w),
                    "lost_w": float(lost_t),
                }
                ok = (
                    type(n) is int
                    and 0 <= n <= MAX_COUNT
                    and tenant_ok[k]
                    and inputs_ok(list(t_inputs.values()))
                )
                found = made[key] = (n, t_inputs, ok)
            n, t_inputs, ok = found
            if fast and ok:
                values = templates[k].copy()
                values["entity"] = prefix + t.tenant_id
                values["inputs"] = t_inputs.copy()
                values["pool_id"] = pid
                values["retries_allowed_now"] = n
                decisions.append(assemble(RetryBudgetDecision, values, set(_GIVEN_TENANT)))
            else:
                decisions.append(
                    budget_decision(
                        prefix + t.tenant_id,
                        pool_id=pid,
                        tenant_id=t.tenant_id,
                        params=params,
                        retries_allowed_now=n,
                        exempt_retries_of=exempt,
                        reason="tenant-budget",
                        inputs=dict(t_inputs),
                    )
                )
        out.append(PolicyResult(decisions=tuple(decisions), state=episode))
    return out
