"""Builders for the policies' frozen inputs: NodeView, PoolView, FleetSnapshot and PolicyContext.

Every field has a plain default (a warm, idle, healthy node); a test names only what it is about::

    snap = snapshot([node("a", queue_depth=3), node("b", weights_state="loading")])
    result = Algo().decide(snap, Algo.Params(), Algo().initial_state(), ctx(snap))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from fleetloop.policies.base import (
    FleetSnapshot,
    LedgerView,
    NodeView,
    PolicyContext,
    PolicyResult,
    PoolView,
    TenantView,
)
from fleetloop.policies.slo import DEFAULT_BOOK, SloBook
from fleetloop.schemas.decisions import BreakerDecision

POOL = "p"
NOW_MS = 1_700_000_000_000
WINDOW_MS = 10_000

_NODE = NodeView(
    node_id="n0",
    pool_id=POOL,
    model="llama-8b",
    gpu_type="L40S",
    gpu_count=1,
    weights_state="warm",
    draining=False,
    last_seen_ms=NOW_MS,
    age_ms=0,
    stale=False,
    queue_depth=0,
    running_requests=0,
    queued_prompt_tokens=0,
    kv_cache_used_frac=0.0,
    hbm_free_gib=20.0,
    gpu_util_frac=0.5,
    prefix_cache_hit_frac=0.0,
    hot_prefixes=(),
    ttft_p50_ms=None,
    ttft_p99_ms=None,
    tbt_p50_ms=None,
    tbt_p99_ms=None,
    max_batch_tokens=8192,
    cost_rate_usd_per_h=1.0,
    requests_w=0,
    ok_w=0,
    failures_w=0,
    consecutive_failures=0,
    ttft_mean_ms_w=None,
    node_errors_w=0,
    node_timeouts_w=0,
    preemptions_w=0,
)


def node(node_id: str = "n0", pool_id: str = POOL, **fields: Any) -> NodeView:
    """A node view; ``ok_w``/``failures_w`` given without ``requests_w`` set it to their sum."""
    if "requests_w" not in fields and ("ok_w" in fields or "failures_w" in fields):
        fields["requests_w"] = fields.get("ok_w", 0) + fields.get("failures_w", 0)
    return replace(_NODE, node_id=node_id, pool_id=pool_id, **fields)


def nodes(count: int, pool_id: str = POOL, prefix: str = "n", **fields: Any) -> list[NodeView]:
    """``count`` identical nodes named ``n0``, ``n1``, ... (zero-padded so they sort in order)."""
    width = len(str(max(count - 1, 0)))
    return [node(f"{prefix}{i:0{width}d}", pool_id, **fields) for i in range(count)]


def pool(pool_id: str, node_ids: Iterable[str], **fields: Any) -> PoolView:
    base: dict[str, Any] = {
        "pool_id": pool_id,
        "model": "llama-8b",
        "gpu_type": "L40S",
        "node_ids": tuple(sorted(node_ids)),
        "requests_w": 0,
        "ok_w": 0,
        "failures_w": 0,
        "retries_w": 0,
        "shed_w": 0,
        "request_rate_per_s": 0.0,
        "retry_rate_per_s": 0.0,
        "ttft_p50_ms_w": None,
        "ttft_p99_ms_w": None,
        "prompt_tokens_rate_per_s": 0.0,
        "output_tokens_rate_per_s": 0.0,
    }
    base.update(fields)
    return PoolView(**base)


def tenant(
    tenant_id: str, priority: int = 0, requests_w: int = 0, retries_w: int = 0, shed_w: int = 0
) -> TenantView:
    return TenantView(tenant_id, priority, requests_w, retries_w, shed_w)


def ledger(**fields: Any) -> LedgerView:
    base: dict[str, Any] = {
        "tasks_started": 0,
        "tasks_succeeded": 0,
        "tasks_failed": 0,
        "active_workflows": 0,
        "fleet_cost_usd": 0.0,
        "spend_on_failed_usd": 0.0,
    }
    base.update(fields)
    return LedgerView(**base)


def snapshot(
    node_views: Iterable[NodeView] = (),
    *,
    now_ms: int = NOW_MS,
    window_ms: int = WINDOW_MS,
    pools: Mapping[str, PoolView] | None = None,
    pool_fields: Mapping[str, Mapping[str, Any]] | None = None,
    tenants: Iterable[TenantView] = (),
    ledger_view: LedgerView | None = None,
) -> FleetSnapshot:
    """A snapshot whose pools are built from the nodes' ``pool_id`` (plus ``pool_fields`` per pool),
    unless ``pools`` is given. Mappings are in sorted key order, as the model builds them."""
    by_id = {n.node_id: n for n in sorted(node_views, key=lambda n: n.node_id)}
    if pools is None:
        members: dict[str, list[str]] = {}
        for n in by_id.values():
            members.setdefault(n.pool_id, []).append(n.node_id)
        for pool_id in pool_fields or {}:
            members.setdefault(pool_id, [])
        extra = pool_fields or {}
        pools = {p: pool(p, ids, **extra.get(p, {})) for p, ids in sorted(members.items())}
    return FleetSnapshot(
        now_ms=now_ms,
        window_ms=window_ms,
        nodes=by_id,
        pools=dict(sorted(pools.items())),
        tenants={t.tenant_id: t for t in sorted(tenants, key=lambda t: t.tenant_id)},
        ledger=ledger_view or ledger(),
    )


def ctx(
    snap: FleetSnapshot | None = None,
    *,
    pool_id: str = POOL,
    now_ms: int | None = None,
    tick_id: int = 1,
    tick_ms: int = 1000,
    breakers: Mapping[str, BreakerDecision] | None = None,
    seed: int = 0,
    slo: SloBook = DEFAULT_BOOK,
    draining: tuple[str, ...] = (),
) -> PolicyContext:
    """A context at the snapshot's event time (or ``now_ms``), with a seeded generator; ``draining``
    the pool's drain list as the engine would hold it."""
    now = now_ms if now_ms is not None else (snap.now_ms if snap is not None else NOW_MS)
    return PolicyContext(
        now_ms=now,
        tick_id=tick_id,
        tick_ms=tick_ms,
        pool_id=pool_id,
        seed=(seed, tick_id),
        breakers=dict(breakers or {}),
        slo=slo,
        draining=draining,
    )


def by_node(result: PolicyResult[Any]) -> dict[str, BreakerDecision]:
    """A result's breaker decisions keyed by node id."""
    return {d.node_id: d for d in result.decisions if isinstance(d, BreakerDecision)}
