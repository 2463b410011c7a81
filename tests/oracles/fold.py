"""The folds' statement, one record at a time: what ``FleetModel.fold_telemetries`` and
``FleetModel.fold_outcomes`` (the one implementation, a batch at a time: the batch's bookkeeping,
the caps, the snapshot's kept rows) are held to, byte for byte (``tests/unit/test_fold_batch.py``)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from fleetloop.core.model import state as st
from fleetloop.core.model.fleet import FleetModel
from fleetloop.core.model.state import (
    _MAX_NUSD,
    FAILED_OUTCOMES,
    GAP_EDGES_MS,
    N_PRIORITIES,
    PARTIAL_TENANTS,
    PARTIAL_UNPLACED,
    _Node,
    _Tenant,
    _Workflow,
    nano_usd,
)
from fleetloop.core.model.windows import BUCKET_MS, LAT_EDGES_MS, N_LAT_BINS, Window
from fleetloop.schemas.fast import Outcome, Telemetry


def _made(win: Window, b: int) -> None:
    """A row made in ``win`` at bucket ``b``: its ``low`` comes down to it (as ``Window.add``)."""
    win.low = min(win.low, b)


def fold_telemetry(model: FleetModel, t: Telemetry) -> str | None:
    """Fold one telemetry record; returns why it was refused (a cap), or None."""
    pool_id, node_id, ts = t.pool_id, t.node_id, t.ts_ms
    pool = model.pools.get(pool_id)
    if pool is None:
        pool = model._pool(pool_id, ts)
        if pool is None:
            return f"capacity-pools: pool cap {model.config.max_pools} reached, no silent pool to evict"
    nodes = model.nodes
    node = nodes.get(node_id)
    if node is None:
        if len(pool.nodes) >= model.config.max_nodes_per_pool and not model._make_room(pool, t):
            model.refused["nodes"] += 1
            return f"capacity-nodes: node cap {model.config.max_nodes_per_pool} of pool {pool_id} reached"
        if len(nodes) >= model.config.max_nodes:
            model.refused["nodes"] += 1
            return f"capacity-nodes: fleet node cap {model.config.max_nodes} reached"
    cost = t.cost_rate_usd_per_h * t.interval_ms / 3_600_000.0
    if cost > 0.0:
        model.ledger.fleet_cost_nusd += nano_usd(cost)
    # The pool's clock (``_admit``), whose common case (not newer, not late) changes nothing.
    if ts > pool.watermark_ms or ts // BUCKET_MS <= pool.evicted_to:
        if not model._admit(pool_id, pool, ts):
            return None
        node = nodes.get(node_id)  # the pool's clock moved: this node may have been evicted
    if node is None:
        win = model.node_wins.pop(node_id, None) or Window(8)
        node = nodes[node_id] = _Node(telemetry=t, win=win)
        pool.nodes.add(node_id)
        model._nodes_changed += 1
    elif ts >= node.telemetry.ts_ms:
        if node.telemetry.pool_id != pool_id:
            old = model.pools.get(node.telemetry.pool_id)
            if old is not None:
                old.nodes.discard(node_id)
            pool.nodes.add(node_id)
            model._nodes_changed += 1
        node.telemetry = t
    if t.prompt_tokens or t.output_tokens:
        b = ts // BUCKET_MS
        if b < model._written_from:
            model._written_from = b
        pool.node_tokens.add_at(b, 0, float(t.prompt_tokens))
        pool.node_tokens.add_at(b, 1, float(t.output_tokens))
    if t.errors or t.timeouts or t.preemptions:
        b = ts // BUCKET_MS
        if b < model._node_written_from:
            model._node_written_from = b
        node.win.add_at(b, st._N_ERR, t.errors)
        node.win.add_at(b, st._N_TO, t.timeouts)
        node.win.add_at(b, st._N_PRE, t.preemptions)
    return None


def fold_outcome(model: FleetModel, o: Outcome) -> str | None:
    """Fold one request outcome; returns why it was refused (a cap), or None. Window rows are
    updated in place, column by column, as the batch fold does (the same sums as
    :meth:`Window.add`: adding 0.0 to a count column is skipped, which changes nothing)."""
    if o.diverted_to is not None:
        model._fold_copy(o)
        return None
    pool_id, ts = o.pool_id, o.ts_ms
    pool = model.pools.get(pool_id)
    if pool is None:
        pool = model._pool(pool_id, ts)
        if pool is None:
            return f"capacity-pools: pool cap {model.config.max_pools} reached, no silent pool to evict"
    _fold_ledger(model, o)
    if (ts > pool.watermark_ms or ts // BUCKET_MS <= pool.evicted_to) and not model._admit(pool_id, pool, ts):
        return None
    if ts > pool.outcomes_ms:
        new_bucket = ts // BUCKET_MS > pool.outcomes_ms // BUCKET_MS
        pool.outcomes_ms = ts
        if new_bucket:
            model._advance_ledger_clock()  # at most once per bucket per pool
    b = ts // BUCKET_MS
    if b < model._written_from:
        model._written_from = b
    if b < model._node_written_from:
        model._node_written_from = b
    outcome = o.outcome
    ok = outcome == "ok"
    failed = outcome in FAILED_OUTCOMES
    shed = outcome == "shed"
    retry = o.attempt > 0
    rows = pool.win.buckets
    row = rows.get(b)
    if row is None:
        rows[b] = [1.0, float(ok), float(failed), float(retry), float(shed),
                   float(o.prompt_tokens), float(o.output_tokens)]  # fmt: skip
        _made(pool.win, b)
    else:
        row[st._P_REQ] += 1.0
        if ok:
            row[st._P_OK] += 1.0
        if failed:
            row[st._P_FAIL] += 1.0
        if retry:
            row[st._P_RETRY] += 1.0
        if shed:
            row[st._P_SHED] += 1.0
        row[st._P_PROMPT] += o.prompt_tokens
        row[st._P_OUT] += o.output_tokens
    ttft_ms = o.ttft_ms
    if ttft_ms is not None:  # pool.ttft.add_at(b, lat_bin(ttft_ms), 1.0), inlined
        rows = pool.ttft.buckets
        row = rows.get(b)
        if row is None:
            row = rows[b] = [0.0] * N_LAT_BINS
            _made(pool.ttft, b)
        row[bisect_right(LAT_EDGES_MS, ttft_ms)] += 1.0
    if not shed:  # the classes the pool served, not those it turned away (add_at, inlined)
        rows = pool.by_priority.buckets
        row = rows.get(b)
        if row is None:
            row = rows[b] = [0.0] * N_PRIORITIES
            _made(pool.by_priority, b)
        row[min(max(o.priority, 0), N_PRIORITIES - 1)] += 1.0
    if o.task_outcome is not None:  # a task ended on this call; lost unless ok or our own shed
        pool.tasks.add(b, (1.0, float(o.task_outcome == "failed" and not shed)))
    tenant = model.tenants.get(o.tenant_id)
    if tenant is None:
        if len(model.tenants) < model.config.max_tenants:
            tenant = model.tenants[o.tenant_id] = _Tenant(priority=o.priority)
        else:
            model.refused["tenants"] += 1
    elif o.priority < tenant.priority:
        tenant.priority = o.priority  # the tenant's most important class seen: order-independent
    if tenant is not None:
        rows = tenant.win.buckets
        row = rows.get(b)
        if row is None:
            rows[b] = [1.0, float(retry), float(shed)]
            _made(tenant.win, b)
        else:
            row[st._T_REQ] += 1.0
            if retry:
                row[st._T_RETRY] += 1.0
            if shed:
                row[st._T_SHED] += 1.0
    node_id = o.node_id
    if node_id is None or shed:  # a shed call never reached a node: no evidence about one
        return None
    node = model.nodes.get(node_id)
    if node is not None:
        win: Window | None = node.win
    else:
        win = model.node_wins.get(node_id)
        if win is None:
            if len(model.node_wins) < model.config.max_unplaced_nodes:
                win = model.node_wins[node_id] = Window(8)
            else:
                model.refused["unplaced_nodes"] += 1
    if win is not None:
        rows = win.buckets
        row = rows.get(b)
        ttft = ttft_ms if ttft_ms is not None else 0.0
        if row is None:
            rows[b] = [1.0, float(ok), float(failed), ttft, float(ttft_ms is not None), 0.0, 0.0, 0.0]
            _made(win, b)
        else:
            row[st._N_REQ] += 1.0
            if ok:
                row[st._N_OK] += 1.0
            if failed:
                row[st._N_FAIL] += 1.0
            row[st._N_TTFT_SUM] += ttft  # always added: keeps a -0.0 sum's sign as Window.add did
            if ttft_ms is not None:
                row[st._N_TTFT_N] += 1.0
    if node is not None:
        if ok:
            node.consecutive_failures = 0
        elif failed:
            node.consecutive_failures += 1
    return None


def _fold_ledger(model: FleetModel, o: Outcome) -> None:
    model._ledger_fifo()
    ledger = model.ledger
    wf_id = o.workflow_id
    wf = ledger.active.get(wf_id)
    if wf is None:
        if wf_id in ledger.finished:
            return  # a late or duplicate record of a finished task
        if len(ledger.active) >= model.config.max_open_workflows:
            # Full: the earliest opened is let go as handed off (by count, as by age), so a new
            # task, and the outcome of one that ends on its first call here, is never refused.
            model._close_workflow(ledger.active.pop(next(iter(ledger.active))))
            ledger.tasks_handed_off += 1
            model.evicted["workflows"] += 1
        wf = ledger.active[wf_id] = _Workflow(o.tenant_id, o.priority, o.ts_ms, o.ts_ms)
        ledger.tasks_started += 1
    else:
        gap = o.ts_ms - wf.last_ms
        gaps = ledger.gaps
        if gap <= GAP_EDGES_MS[0]:
            gaps[0] += 1
        else:
            gaps[bisect_left(GAP_EDGES_MS, gap)] += 1
        if gap > 0:
            wf.last_ms = o.ts_ms
    if o.pool_id not in wf.pools:
        wf.pools = (*wf.pools, o.pool_id)
        pool = model.pools.get(o.pool_id)
        if pool is not None:
            pool.wf_open += 1
            pool.wf_started += 1
    wf.attempts += 1
    if o.attempt == 0:
        wf.calls += 1
    cost = o.cost_usd
    if cost > 0.0:
        wf.spend_nusd += nano_usd(cost)
    if o.task_outcome is not None:
        del ledger.active[wf_id]
        model._close_workflow(wf)
        model._finish(wf_id, o.ts_ms)
        if o.task_outcome == "succeeded":
            ledger.tasks_succeeded += 1
        else:
            ledger.tasks_failed += 1
            pool = model.pools.get(o.pool_id)
            if pool is not None:
                pool.wf_failed += 1
            # The router's running total covers the calls other shards saw; this shard's own sum
            # covers attempts a router reported without it. The task spent at least both.
            carried = nano_usd(o.workflow_spend_usd) + (nano_usd(cost) if cost > 0.0 else 0)
            ledger.spend_on_failed_nusd += max(wf.spend_nusd, min(carried, _MAX_NUSD))


def fold_plain(
    model: FleetModel, items: Sequence[Telemetry | Outcome | None], *, outcomes: bool
) -> list[tuple[int, str]]:
    """:meth:`FleetModel.fold_telemetries` / :meth:`FleetModel.fold_outcomes` as their plain
    statement: one :meth:`FleetModel.fold_telemetry` / :meth:`FleetModel.fold_outcome` call per
    record, a part left out by a partial cap read from the ``refused`` counters before and after
    it, an exception caught per record. What the tests hold the batch folds to (byte for byte)."""
    fold = fold_outcome if outcomes else fold_telemetry
    refused = model.refused
    out: list[tuple[int, str]] = []
    for i, item in enumerate(items):
        if item is None:
            continue
        try:
            rt, ru = refused["tenants"], refused["unplaced_nodes"]
            why = fold(model, item)  # type: ignore[operator]
            if why is None and refused["tenants"] != rt:
                why = PARTIAL_TENANTS
            elif why is None and refused["unplaced_nodes"] != ru:
                why = PARTIAL_UNPLACED
        except Exception as exc:
            why = f"fold-error: {type(exc).__name__}: {exc}"[:500]
        if why is not None:
            out.append((i, why))
    return out
