"""The snapshot: the model frozen as policies see it at a tick's event time ``now_ms``.

``snapshot(model, now_ms, window_ms=..., stale_after_ms=...)`` gives a
:class:`~fleetloop.policies.base.FleetSnapshot`: nodes, pools, tenants and the ledger, every window
summed over ``(now_ms - window_ms, now_ms]``. It is built as columns: every node's and every pool's
window totals for the whole fleet in array operations
(:class:`~fleetloop.core.model.windows.WindowColumns`), re-reading only the buckets folded into since
the previous snapshot (the folds mark the lowest one, or re-read the rows they wrote into the kept
columns), and the nodes as a :class:`~fleetloop.policies.columns.NodeTable` whose views are built
when a policy asks for one. What the snapshot keeps between ticks is transient: it is not
checkpointed (``ModelState._TRANSIENT``), and a model without it reads everything again.

A node is in the snapshot while its own newest telemetry is at most ``forget_node_after_ms`` older
than ``now_ms``; it is stale past ``stale_after_ms``. Rows are grouped by pool (pool-id order), each
pool's in node-id order, and that layout is kept until a node arrives, leaves or moves.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import islice, repeat
from operator import attrgetter, is_not, le
from typing import cast

import numpy as np
import numpy.typing as npt

from fleetloop.core.model.state import (
    _NEVER,
    _P_FAIL,
    _P_OK,
    _P_OUT,
    _P_PROMPT,
    _P_REQ,
    _P_RETRY,
    _P_SHED,
    _T_REQ,
    _T_RETRY,
    _T_SHED,
    N_PRIORITIES,
    NANO,
    ModelState,
    _Pool,
)
from fleetloop.core.model.windows import N_LAT_BINS, WindowColumns, lat_value
from fleetloop.policies.base import FleetSnapshot, LedgerView, PoolView, TenantView
from fleetloop.policies.columns import N_TEL, NodeTable, tel_numbers


def ledger_view(model: ModelState) -> LedgerView:
    """The ledger as policies see it."""
    ledger = model.ledger
    return LedgerView(
        tasks_started=ledger.tasks_started,
        tasks_succeeded=ledger.tasks_succeeded,
        tasks_failed=ledger.tasks_failed,
        active_workflows=len(ledger.active),
        fleet_cost_usd=ledger.fleet_cost_nusd / NANO,
        spend_on_failed_usd=ledger.spend_on_failed_nusd / NANO,
    )


class _NodeRows:
    """The model's nodes in snapshot row order (by pool, then node id), their windows' columns and
    their newest telemetry's numbers; valid while the model's ``_nodes_changed`` stays at ``changed``.

    ``numbers[r]`` is :func:`~fleetloop.policies.columns.tel_numbers` of ``held[r]``, the record
    it was read from (None: not read). The batch fold reads the records it makes a node's newest
    (:meth:`take`, one array write per batch), so the snapshot reads only the rows whose newest
    record is not the one held (:meth:`numbers_of`): the check is by identity, so a record that was
    not read here (a restore) is read there, and nothing else is trusted."""

    __slots__ = (
        "bounds",
        "changed",
        "held",
        "ids",
        "index",
        "nodes",
        "numbers",
        "pool_ids",
        "row_pools",
        "sorted_ids",
        "windows",
        "wins",
    )

    def __init__(self, model: ModelState, before: _NodeRows | None = None) -> None:
        self.changed = model._nodes_changed
        nodes = model.nodes
        if before is None:
            start = list(nodes)
        else:
            # The rows laid out before, in their order, then the nodes that arrived: the same sort
            # then finds the old order's runs (a few arrivals, departures or moves cost a pass, not a
            # sort of every node, which took ~10 ms of a 10,000-node snapshot's 20-50 ms layout).
            start = [k for k in before.ids if k in nodes]
            if len(start) != len(nodes):
                was = before.index
                start += [k for k in nodes if k not in was]
        got = list(map(nodes.__getitem__, start))
        # By (pool, node id), ids unique: the order ``sorted(items, key=(pool, id))`` gives.
        order = sorted(zip(map(_POOL_ID, map(_TELEMETRY, got)), start, range(len(start)), strict=True))
        at = [i for _, _, i in order]
        self.ids: list[str] = [start[i] for i in at]
        self.nodes = [got[i] for i in at]
        self.row_pools = [p for p, _, _ in order]
        self.wins = list(map(_WIN, self.nodes))
        n = len(self.ids)
        self.index: dict[str, int] = dict(zip(self.ids, range(n), strict=True))
        if before is None:
            self.sorted_ids = sorted(self.ids)
        else:  # the old sorted ids still here, then the arrivals: one pass over the sorted run
            self.sorted_ids = [k for k in before.sorted_ids if k in nodes]
            if len(self.sorted_ids) != n:
                was = before.index
                self.sorted_ids += [k for k in self.ids if k not in was]
            self.sorted_ids.sort()
        self.pool_ids, self.bounds = _pool_bounds(self.row_pools)
        self.windows = WindowColumns(self.wins, 8)
        # Row ``n`` is spare: what :meth:`take` reads for a node not in these rows lands there. One
        # row per node (a fold writes whole rows; the snapshot hands the table its transpose).
        self.numbers: npt.NDArray[np.float64] = np.zeros((n + 1, N_TEL), dtype=np.float64)
        self.held: list[object] = [None] * (n + 1)
        if before is not None:  # keep the rows already read of the nodes still here
            fro = list(map(before.index.get, self.ids))
            old = before.held
            if None not in fro:  # no arrival: every row's from somewhere
                every = cast("list[int]", fro)
                self.numbers[:n] = before.numbers[every]
                self.held[:n] = map(old.__getitem__, every)
            else:
                pairs = [(r, i) for r, i in enumerate(fro) if i is not None]
                if pairs:
                    to, fro_i = zip(*pairs, strict=True)
                    self.numbers[list(to)] = before.numbers[list(fro_i)]
                    held = self.held
                    for r, i in pairs:
                        held[r] = old[i]

    def _read(self, rows: list[int], recs: Sequence[object]) -> bool:
        """Read ``recs`` into ``rows`` (one array write); False, and nothing written, when a record
        holds something that is not one number."""
        try:
            values = tel_numbers(recs)
        except (TypeError, ValueError, OverflowError):
            return False
        self.numbers[rows] = values
        held = self.held
        for r, t in zip(rows, recs, strict=True):
            held[r] = t
        return True

    def take(self, items: Sequence[object | None]) -> None:
        """After a batch fold: read the batch's records into their nodes' rows (one array write;
        a node not in these rows writes the spare row at the end). Nearly every record of a batch is
        then its node's newest; one that is not (refused, older, out of order in the batch) is held
        by no row whose node holds it, so the snapshot reads that row again:
        checking it here would cost more than the few rows it saves. A batch that holds something
        odd is read record by record, leaving the odd ones unread."""
        if None in items:
            items = [t for t in items if t is not None]
        if not items:
            return
        try:
            rows = list(map(self.index.get, map(_NODE_ID, items), repeat(len(self.ids))))
        except AttributeError:  # not a telemetry record (the fold reported it): nothing to read
            return
        # One record per row, the batch's last (numpy does not promise which of a repeated index's
        # values an array write keeps; the row must hold the values of the record it says it holds).
        last = dict(zip(rows, items, strict=True))
        if not self._read(list(last), list(last.values())):
            for r, t in last.items():
                self._read([r], [t])

    def refresh(self, ids: Sequence[str], buckets: Sequence[int]) -> bool:
        """After a batch fold wrote bucket ``buckets[k]`` of node ``ids[k]``'s window:
        re-read those rows of the kept bucket arrays (:meth:`WindowColumns.refresh`). By node id,
        whichever window the row holds (re-reading a row nobody wrote changes nothing), so a node
        that arrived, left or moved since the rows were laid out is read right too. False when a
        bucket could not be read (the caller marks it written instead)."""
        index = self.index
        rows = list(map(index.get, ids))
        if len(set(buckets)) == 1:
            groups = {buckets[0]: rows}
        else:
            groups = {}
            for r, b in zip(rows, buckets, strict=True):
                groups.setdefault(b, []).append(r)
        ok = True
        for b, at in groups.items():
            ok = self.windows.refresh(b, [r for r in dict.fromkeys(at) if r is not None]) and ok
        return ok

    def numbers_of(self, tels: Sequence[object]) -> npt.NDArray[np.float64] | None:
        """``tel_numbers(tels).T`` (``tels``: every row's newest record, in row order), reading only
        the rows whose record is not the one held; None when one of them holds something odd."""
        differ = list(map(is_not, self.held[:-1], tels))
        stale = [r for r, d in enumerate(differ) if d] if True in differ else []
        if stale and not self._read(stale, [tels[r] for r in stale]):
            return None
        return self.numbers[:-1].T


class _PoolRows:
    """The model's pools in id order and their six windows' columns, valid while the model holds
    these same pool objects."""

    __slots__ = ("by_priority", "diverted", "ids", "node_tokens", "pools", "tasks", "ttft", "win")

    def __init__(self, ids: list[str], pools: list[_Pool]) -> None:
        self.ids = ids
        self.pools = pools
        self.win = WindowColumns([p.win for p in pools], 7)
        self.ttft = WindowColumns([p.ttft for p in pools], N_LAT_BINS)
        self.by_priority = WindowColumns([p.by_priority for p in pools], N_PRIORITIES)
        self.tasks = WindowColumns([p.tasks for p in pools], 2)
        self.diverted = WindowColumns([p.diverted for p in pools], 1)
        self.node_tokens = WindowColumns([p.node_tokens for p in pools], 2)

    def columns(self) -> tuple[WindowColumns, ...]:
        return (self.win, self.ttft, self.by_priority, self.tasks, self.diverted, self.node_tokens)


class _Snapshots:
    """What :func:`snapshot` keeps between ticks: the row layouts and the windows' bucket arrays."""

    __slots__ = ("nodes", "pools")

    def __init__(self) -> None:
        self.nodes: _NodeRows | None = None
        self.pools: _PoolRows | None = None


_NODE_ID = attrgetter("node_id")
_POOL_ID = attrgetter("pool_id")
_TELEMETRY = attrgetter("telemetry")
_WIN = attrgetter("win")


def _pool_bounds(row_pools: Sequence[str]) -> tuple[tuple[str, ...], dict[str, tuple[int, int]]]:
    """The pools of rows grouped by pool (in order), and each one's (first row, end row). The rows
    are in pool-id order (the snapshot's layout), so each pool's end is found by bisection: a search
    per pool instead of a step per row."""
    bounds: dict[str, tuple[int, int]] = {}
    start, n = 0, len(row_pools)
    if not all(map(le, row_pools, islice(row_pools, 1, None))):  # not grouped in order: step by row
        for i in range(1, n + 1):
            if i == n or row_pools[i] != row_pools[start]:
                bounds[row_pools[start]] = (start, i)
                start = i
        return tuple(bounds), bounds
    while start < n:
        pool = row_pools[start]
        end = bisect_right(row_pools, pool, start)
        bounds[pool] = (start, end)
        start = end
    return tuple(bounds), bounds


def _quantiles(hist: npt.NDArray[np.float64], q: float) -> list[float | None]:
    """:func:`quantile_from_bins` of every row: the same running sums (a cumulative sum adds left
    to right, as the loop does), the same first bin reaching ``q * total``."""
    if not len(hist):
        return []
    cum = np.cumsum(hist, axis=1)
    total = cum[:, -1]
    reached = cum >= (q * total)[:, None]
    first = np.where(reached.any(axis=1), reached.argmax(axis=1), hist.shape[1] - 1)
    values = _LAT_VALUES
    return [values[i] if t > 0 else None for i, t in zip(first.tolist(), total.tolist(), strict=True)]


_LAT_VALUES = tuple(lat_value(i) for i in range(N_LAT_BINS))


def snapshot(
    model: ModelState, now_ms: int, *, window_ms: int = 10_000, stale_after_ms: int = 5_000
) -> FleetSnapshot:
    """Freeze the model as policies see it at event time ``now_ms`` (see the module's docstring)."""
    kept = model._snapshots
    if not isinstance(kept, _Snapshots):
        kept = model._snapshots = _Snapshots()
    written, evicted = model._written_from, model._evicted_below
    node_written = model._node_written_from
    model._written_from = model._node_written_from = _NEVER
    table = _node_table(model, kept, node_written, evicted, now_ms, window_ms, stale_after_ms)
    return FleetSnapshot(
        now_ms=now_ms,
        window_ms=window_ms,
        nodes=table,
        pools=_pool_views(model, kept, table, written, evicted, now_ms, window_ms),
        tenants=_tenant_views(model, now_ms, window_ms),
        ledger=ledger_view(model),
    )


def _node_table(  # noqa: PLR0917
    model: ModelState,
    kept: _Snapshots,
    node_written: int,
    evicted: int,
    now_ms: int,
    window_ms: int,
    stale_after_ms: int,
) -> NodeTable:
    """The nodes' rows: the kept layout (laid out again when a node arrived, left or moved, keeping
    what was read for the nodes still here), their window totals, and the rows of the nodes whose
    newest telemetry is within ``forget_node_after_ms`` of ``now_ms``."""
    rows = kept.nodes
    if rows is not None:
        rows.windows.forget(node_written, evicted)
    if rows is None or rows.changed != model._nodes_changed or len(rows.ids) != len(model.nodes):
        before = rows
        rows = kept.nodes = _NodeRows(model, before)
        if before is not None:  # keep what was read for the nodes still here
            rows.windows.carry(before.windows, rows.wins, before.wins)
    tels = [n.telemetry for n in rows.nodes]
    numbers = rows.numbers_of(tels)  # the fold may write it on while policies read: a copy
    consecutive = [n.consecutive_failures for n in rows.nodes]
    ts = np.array([t.ts_ms for t in tels], dtype=np.int64)
    totals = rows.windows.totals(now_ms, window_ms)
    # ``now_ms - ts <= forget``, compared against a Python int: exact for any ``now_ms``.
    live = ts >= now_ms - model.config.forget_node_after_ms
    if live.all():
        return NodeTable(
            now_ms=now_ms,
            stale_after_ms=stale_after_ms,
            ids=rows.ids,
            tels=tels,
            consecutive=consecutive,
            totals=totals,
            ts=ts,
            pool_ids=rows.pool_ids,
            bounds=rows.bounds,
            index=rows.index,
            sorted_ids=rows.sorted_ids,
            numbers=None if numbers is None else numbers.copy(),
        )
    keep = np.flatnonzero(live).tolist()  # some nodes are past forget_node_after_ms: the others
    ids = [rows.ids[i] for i in keep]
    tels = [tels[i] for i in keep]
    row_pools, row_bounds = _pool_bounds([t.pool_id for t in tels])
    return NodeTable(
        now_ms=now_ms,
        stale_after_ms=stale_after_ms,
        ids=ids,
        tels=tels,
        consecutive=[consecutive[i] for i in keep],
        totals=totals[live],
        ts=ts[live],
        pool_ids=row_pools,
        bounds=row_bounds,
        numbers=None if numbers is None else np.ascontiguousarray(numbers[:, live]),
    )


def _pool_views(  # noqa: PLR0917
    model: ModelState,
    kept: _Snapshots,
    table: NodeTable,
    written: int,
    evicted: int,
    now_ms: int,
    window_ms: int,
) -> dict[str, PoolView]:
    """Every pool's view: its windows' totals for all pools at once (the kept bucket arrays while
    the model holds the same pool objects), its nodes the table's rows of it."""
    pool_ids = sorted(model.pools)
    pool_objs = [model.pools[p] for p in pool_ids]
    prows = kept.pools
    if prows is None or len(prows.pools) != len(pool_objs) or any(map(is_not, prows.pools, pool_objs)):
        prows = kept.pools = _PoolRows(pool_ids, pool_objs)
    else:
        for columns in prows.columns():
            columns.forget(written, evicted)
    w_all = prows.win.totals(now_ms, window_ms)
    hist = prows.ttft.totals(now_ms, window_ms)
    prio_all = prows.by_priority.totals(now_ms, window_ms).tolist()
    tasks_all = prows.tasks.totals(now_ms, window_ms).tolist()
    diverted_all = prows.diverted.totals(now_ms, window_ms).tolist()
    node_all = prows.node_tokens.totals(now_ms, window_ms).tolist()
    p50 = _quantiles(hist, 0.50)
    p99 = _quantiles(hist, 0.99)
    seconds = window_ms / 1000.0
    bounds = table.bounds
    ids_of = table.ids
    pools: dict[str, PoolView] = {}
    for k, (pool_id, w) in enumerate(zip(pool_ids, w_all.tolist(), strict=True)):
        pool = pool_objs[k]
        a, b = bounds.get(pool_id, (0, 0))
        first = table.tels[a] if b > a else None
        prio = prio_all[k]
        tasks = tasks_all[k]
        # The pool's token rates, each on its own: its routers' outcomes' tokens, or, when the
        # window has ok calls and not one such token among them (routers that log calls without
        # their lengths), the tokens its nodes report. Outcomes win whenever they carry any: they
        # are the calls the router saw end (docs/decisions/slo-predictive.md, "Shipped: token rates
        # from the nodes when outcomes carry none").
        prompt, out = w[_P_PROMPT], w[_P_OUT]
        node_prompt, node_out = node_all[k]
        ok_calls = w[_P_OK] > 0.0
        prompt_from_nodes = ok_calls and prompt == 0.0 and node_prompt > 0.0
        from_nodes = ok_calls and out == 0.0 and node_out > 0.0
        if prompt_from_nodes:
            prompt = node_prompt
        if from_nodes:
            out = node_out
        pools[pool_id] = PoolView(
            pool_id=pool_id,
            model=first.model if first else "",
            gpu_type=first.gpu_type if first else "",
            node_ids=tuple(ids_of[a:b]),
            requests_w=int(w[_P_REQ]),
            ok_w=int(w[_P_OK]),
            failures_w=int(w[_P_FAIL]),
            retries_w=int(w[_P_RETRY]),
            shed_w=int(w[_P_SHED]),
            request_rate_per_s=w[_P_REQ] / seconds,
            retry_rate_per_s=w[_P_RETRY] / seconds,
            ttft_p50_ms_w=p50[k],
            ttft_p99_ms_w=p99[k],
            prompt_tokens_rate_per_s=prompt / seconds,
            output_tokens_rate_per_s=out / seconds,
            requests_by_priority_w={p: int(n) for p, n in enumerate(prio) if n > 0},
            tasks_ended_w=int(tasks[0]),
            tasks_lost_w=int(tasks[1]),
            diverted_tokens_rate_per_s=diverted_all[k][0] / seconds,
            open_workflows=pool.wf_open,
            workflows_started=pool.wf_started,
            workflows_ended=pool.wf_ended,
            tasks_failed=pool.wf_failed,
            prompt_from_nodes=prompt_from_nodes,
            output_from_nodes=from_nodes,
        )
    return pools


def _tenant_views(model: ModelState, now_ms: int, window_ms: int) -> dict[str, TenantView]:
    tenants: dict[str, TenantView] = {}
    for tenant_id in sorted(model.tenants):
        tenant = model.tenants[tenant_id]
        tw = tenant.win.total(now_ms, window_ms)
        tenants[tenant_id] = TenantView(
            tenant_id, tenant.priority, int(tw[_T_REQ]), int(tw[_T_RETRY]), int(tw[_T_SHED])
        )
    return tenants
