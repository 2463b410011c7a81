"""The snapshot's statement: what ``fleetloop.core.model.snapshot.snapshot`` (built as columns, a
node table whose views are built on demand) is held to, value for value and bit for bit
(``tests/unit/test_fast_snapshot.py``)."""

from __future__ import annotations

from fleetloop.core.model import state as st
from fleetloop.core.model.fleet import FleetModel
from fleetloop.core.model.state import _Node
from fleetloop.core.model.windows import quantile_from_bins
from fleetloop.policies.base import FleetSnapshot, LedgerView, NodeView, PoolView, TenantView


def node_view_plain(node: _Node, now_ms: int, window_ms: int, stale_after_ms: int) -> NodeView:
    """A node as policies see it at ``now_ms``, built with keywords (the table's views are held to it)."""
    t = node.telemetry
    w = node.win.total(now_ms, window_ms)
    age = max(0, now_ms - t.ts_ms)
    return NodeView(
        node_id=t.node_id,
        pool_id=t.pool_id,
        model=t.model,
        gpu_type=t.gpu_type,
        gpu_count=t.gpu_count,
        weights_state=t.weights_state,
        draining=t.draining,
        last_seen_ms=t.ts_ms,
        age_ms=age,
        stale=age > stale_after_ms,
        queue_depth=t.queue_depth,
        running_requests=t.running_requests,
        queued_prompt_tokens=t.queued_prompt_tokens,
        kv_cache_used_frac=t.kv_cache_used_frac,
        hbm_free_gib=t.hbm_free_gib,
        gpu_util_frac=t.gpu_util_frac,
        prefix_cache_hit_frac=t.prefix_cache_hit_frac,
        hot_prefixes=t.hot_prefixes,
        ttft_p50_ms=t.ttft_p50_ms,
        ttft_p99_ms=t.ttft_p99_ms,
        tbt_p50_ms=t.tbt_p50_ms,
        tbt_p99_ms=t.tbt_p99_ms,
        max_batch_tokens=t.max_batch_tokens,
        cost_rate_usd_per_h=t.cost_rate_usd_per_h,
        requests_w=int(w[st._N_REQ]),
        ok_w=int(w[st._N_OK]),
        failures_w=int(w[st._N_FAIL]),
        consecutive_failures=node.consecutive_failures,
        ttft_mean_ms_w=(w[st._N_TTFT_SUM] / w[st._N_TTFT_N]) if w[st._N_TTFT_N] else None,
        node_errors_w=int(w[st._N_ERR]),
        node_timeouts_w=int(w[st._N_TO]),
        preemptions_w=int(w[st._N_PRE]),
        engine=t.engine,
    )


def snapshot_plain(
    model: FleetModel, now_ms: int, *, window_ms: int = 10_000, stale_after_ms: int = 5_000
) -> FleetSnapshot:
    """The snapshot as its plain statement: one :class:`NodeView` per node in a dict, every window
    summed on its own by :meth:`Window.total`."""
    forget = model.config.forget_node_after_ms
    nodes = {
        node_id: node_view_plain(model.nodes[node_id], now_ms, window_ms, stale_after_ms)
        for node_id in sorted(model.nodes)
        if now_ms - model.nodes[node_id].telemetry.ts_ms <= forget
    }
    by_pool: dict[str, list[str]] = {}
    for node_id, view in nodes.items():
        by_pool.setdefault(view.pool_id, []).append(node_id)
    seconds = window_ms / 1000.0
    pools: dict[str, PoolView] = {}
    for pool_id in sorted(model.pools):
        pool = model.pools[pool_id]
        w = pool.win.total(now_ms, window_ms)
        hist = pool.ttft.total(now_ms, window_ms)
        prio = pool.by_priority.total(now_ms, window_ms)
        tasks = pool.tasks.total(now_ms, window_ms)
        diverted = pool.diverted.total(now_ms, window_ms)
        node_prompt, node_out = pool.node_tokens.total(now_ms, window_ms)
        prompt_from_nodes = w[st._P_PROMPT] == 0.0 and w[st._P_OK] > 0.0 and node_prompt > 0.0
        from_nodes = w[st._P_OUT] == 0.0 and w[st._P_OK] > 0.0 and node_out > 0.0
        ids = tuple(by_pool.get(pool_id, ()))
        first = nodes[ids[0]] if ids else None
        pools[pool_id] = PoolView(
            pool_id=pool_id,
            model=first.model if first else "",
            gpu_type=first.gpu_type if first else "",
            node_ids=ids,
            requests_w=int(w[st._P_REQ]),
            ok_w=int(w[st._P_OK]),
            failures_w=int(w[st._P_FAIL]),
            retries_w=int(w[st._P_RETRY]),
            shed_w=int(w[st._P_SHED]),
            request_rate_per_s=w[st._P_REQ] / seconds,
            retry_rate_per_s=w[st._P_RETRY] / seconds,
            ttft_p50_ms_w=quantile_from_bins(hist, 0.50),
            ttft_p99_ms_w=quantile_from_bins(hist, 0.99),
            prompt_tokens_rate_per_s=(node_prompt if prompt_from_nodes else w[st._P_PROMPT]) / seconds,
            output_tokens_rate_per_s=(node_out if from_nodes else w[st._P_OUT]) / seconds,
            requests_by_priority_w={p: int(n) for p, n in enumerate(prio) if n > 0},
            tasks_ended_w=int(tasks[0]),
            tasks_lost_w=int(tasks[1]),
            diverted_tokens_rate_per_s=diverted[0] / seconds,
            open_workflows=pool.wf_open,
            workflows_started=pool.wf_started,
            workflows_ended=pool.wf_ended,
            tasks_failed=pool.wf_failed,
            prompt_from_nodes=prompt_from_nodes,
            output_from_nodes=from_nodes,
        )
    tenants: dict[str, TenantView] = {}
    for tenant_id in sorted(model.tenants):
        tenant = model.tenants[tenant_id]
        w = tenant.win.total(now_ms, window_ms)
        tenants[tenant_id] = TenantView(
            tenant_id, tenant.priority, int(w[st._T_REQ]), int(w[st._T_RETRY]), int(w[st._T_SHED])
        )
    ledger = model.ledger
    return FleetSnapshot(
        now_ms=now_ms,
        window_ms=window_ms,
        nodes=nodes,
        pools=pools,
        tenants=tenants,
        ledger=LedgerView(
            tasks_started=ledger.tasks_started,
            tasks_succeeded=ledger.tasks_succeeded,
            tasks_failed=ledger.tasks_failed,
            active_workflows=len(ledger.active),
            fleet_cost_usd=ledger.fleet_cost_nusd / st.NANO,
            spend_on_failed_usd=ledger.spend_on_failed_nusd / st.NANO,
        ),
    )
