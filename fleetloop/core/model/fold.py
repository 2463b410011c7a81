"""Folding records into the model: telemetry and request outcomes, a batch at a time.

:meth:`Folds.fold_telemetries` and :meth:`Folds.fold_outcomes` are the one statement of each
fold; the per-record forms (:meth:`Folds.fold_telemetry`, :meth:`Folds.fold_outcome`) fold a batch
of one. A batch is folded in order. Telemetry is one loop with the model's containers held in
locals; an outcome is one call of :meth:`Folds._fold_outcome` with its steps named (the ledger's
part in :meth:`LedgerBook._fold_task`, the node's in :meth:`Folds._fold_node`): measured on one
second of a 10,000-node fleet's outcomes, the calls cost within the noise of the inlined loop,
and a step per method reads better than one loop of 200 lines. Window rows are updated in place,
column by column, rather than through :meth:`Window.add` (the same sums: adding 0.0 to a count
column is skipped, which changes nothing, since those columns hold sums of non-negative
integers), and a row made lowers its window's ``low`` as :meth:`Window.add` does (eviction pops
the buckets from there: :mod:`fleetloop.core.model.windows`).

What one outcome changes, in order: the ledger's task (opened, continued, or ended, with its spend),
the pool's clocks (a record behind the pool's retention stops there), the pool's windows (calls,
outcomes, tokens, TTFT histogram, served priority classes, tasks ended or lost), the tenant's
window, and, unless the call was shed (a shed call never reached a node: no evidence about one),
the node's window and its run of consecutive failures. A moved call's copy (``diverted_to`` set)
counts as its source pool's diverted demand and nothing else.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from fleetloop.core.model.ledger import LedgerBook
from fleetloop.core.model.state import (
    _MAX_NUSD,
    _MAX_USD,
    _N_ERR,
    _N_FAIL,
    _N_OK,
    _N_PRE,
    _N_REQ,
    _N_TO,
    _N_TTFT_N,
    _N_TTFT_SUM,
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
    FAILED_OUTCOMES,
    N_PRIORITIES,
    NANO,
    PARTIAL,
    PARTIAL_TENANTS,
    PARTIAL_UNPLACED,
    TELEMETRY_TYPES,
    ModelConfig,
    _Node,
    _Tenant,
)
from fleetloop.core.model.windows import BUCKET_MS, LAT_EDGES_MS, N_LAT_BINS, Window
from fleetloop.schemas.fast import Outcome, Telemetry

# A batch smaller than this (one record: ``fold_telemetry``, ``fold_outcome``) leaves the snapshot's
# kept node rows alone, and the snapshot reads what it wrote at the tick: re-reading them costs
# array writes per batch, which records folded one at a time would pay per record. Either way the
# snapshot is the same.
_FEW = 2


def _no_pool(cfg: ModelConfig) -> str:
    return f"capacity-pools: pool cap {cfg.max_pools} reached, no silent pool to evict"


_TOP_PRIORITY = N_PRIORITIES - 1


def _fold_error(exc: Exception) -> str:
    return f"fold-error: {type(exc).__name__}: {exc}"[:500]


class Folds(LedgerBook):
    """The folds on the model (a part of :class:`fleetloop.core.model.fleet.FleetModel`)."""

    __slots__ = ()

    def fold(self, e: Telemetry | Outcome) -> str | None:
        """Fold one record of either kind (a wire model or its twin); returns why it was refused."""
        if isinstance(e, TELEMETRY_TYPES):
            return self.fold_telemetry(e)
        return self.fold_outcome(e)

    def fold_telemetry(self, t: Telemetry) -> str | None:
        """Fold one telemetry record (:meth:`fold_telemetries` of a batch of one); returns why it
        was refused (a cap), or None. Raises what the fold raises."""
        for _, why in self.fold_telemetries((t,), catch=False):
            return why
        return None

    def fold_outcome(self, o: Outcome) -> str | None:
        """Fold one request outcome (:meth:`fold_outcomes` of a batch of one); returns why it was
        refused (a cap), or None (also when it was folded without a part of it: ``refused`` counts
        that). Raises what the fold raises."""
        for _, why in self.fold_outcomes((o,), catch=False):
            return None if why in PARTIAL else why
        return None

    def fold_telemetries(
        self, items: Sequence[Telemetry | None], *, catch: bool = True
    ) -> list[tuple[int, str]]:
        """Fold telemetry records in order (``None`` items skipped); returns why records were
        refused, as ``(index, reason)``. A record whose fold raises leaves what it changed before
        raising; with ``catch`` it is reported as ``fold-error: <type>: <message>`` and the batch
        goes on, without, the exception propagates.

        A record is refused when it would add a pool or a node beyond a cap that no silent one can
        make room under. Otherwise its interval's cost (``cost_rate_usd_per_h x interval_ms``) is
        added to the fleet's, the pool's clock moves (a record behind the pool's retention stops
        there), it becomes its node's newest telemetry unless an newer one is held (a node that
        changed pools moves), its prompt and output tokens go into its pool's ``node_tokens`` window, and its
        errors, timeouts and preemptions go into the node's window."""
        out: list[tuple[int, str]] = []
        pools = self.pools
        nodes = self.nodes
        ledger = self.ledger
        refused = self.refused
        cfg = self.config
        max_per_pool, max_nodes = cfg.max_nodes_per_pool, cfg.max_nodes
        bucket_ms = BUCKET_MS
        no_pool = _no_pool(cfg)
        wrote_ids: list[str] = []  # the node windows written, and their buckets
        wrote_at: list[int] = []
        low = _NEVER  # the lowest pool-window bucket written (``_written_from``), set once at the end
        try:
            for i, t in enumerate(items):
                if t is None:
                    continue
                try:
                    pool_id, node_id, ts = t.pool_id, t.node_id, t.ts_ms
                    pool = pools.get(pool_id)
                    if pool is None:
                        pool = self._pool(pool_id, ts)
                        if pool is None:
                            out.append((i, no_pool))
                            continue
                    node = nodes.get(node_id)
                    if node is None:
                        if len(pool.nodes) >= max_per_pool and not self._make_room(pool, t):
                            refused["nodes"] += 1
                            out.append(
                                (i, f"capacity-nodes: node cap {max_per_pool} of pool {pool_id} reached")
                            )
                            continue
                        if len(nodes) >= max_nodes:
                            refused["nodes"] += 1
                            out.append((i, f"capacity-nodes: fleet node cap {max_nodes} reached"))
                            continue
                    cost = t.cost_rate_usd_per_h * t.interval_ms / 3_600_000.0
                    if cost > 0.0:  # nano_usd(cost), inlined
                        ledger.fleet_cost_nusd += round(cost * NANO) if cost < _MAX_USD else _MAX_NUSD
                    # The pool's clock (``_admit``), whose common case (not newer, not late) changes nothing.
                    if ts > pool.watermark_ms or ts // bucket_ms <= pool.evicted_to:
                        if not self._admit(pool_id, pool, ts):
                            continue
                        node = nodes.get(node_id)  # the pool's clock moved: this node may have been evicted
                    if node is None:
                        win = self.node_wins.pop(node_id, None) or Window(8)
                        node = nodes[node_id] = _Node(telemetry=t, win=win)
                        pool.nodes.add(node_id)
                        self._nodes_changed += 1
                    elif ts >= node.telemetry.ts_ms:
                        if node.telemetry.pool_id != pool_id:
                            old = pools.get(node.telemetry.pool_id)
                            if old is not None:
                                old.nodes.discard(node_id)
                            pool.nodes.add(node_id)
                            self._nodes_changed += 1
                        node.telemetry = t
                    if t.prompt_tokens or t.output_tokens:  # the pool's node_tokens row, in place
                        b = ts // bucket_ms
                        if b < low:  # noqa: PLR1730 (a compare, not a call, per record)
                            low = b
                        w = pool.node_tokens
                        row = w.buckets.get(b)
                        if row is None:
                            row = w.buckets[b] = [0.0, 0.0]
                            if b < w.low:  # noqa: PLR1730
                                w.low = b
                        row[0] += t.prompt_tokens
                        row[1] += t.output_tokens
                    if t.errors or t.timeouts or t.preemptions:
                        b = ts // bucket_ms
                        wrote_ids.append(node_id)  # re-read below (_wrote_nodes)
                        wrote_at.append(b)
                        win = node.win
                        win.add_at(b, _N_ERR, t.errors)
                        win.add_at(b, _N_TO, t.timeouts)
                        win.add_at(b, _N_PRE, t.preemptions)
                except Exception as exc:  # a record the model cannot take must not stop the batch
                    if not catch:
                        raise
                    out.append((i, _fold_error(exc)))
        finally:
            if low < self._written_from:  # noqa: PLR1730
                self._written_from = low
            # The snapshot's numbers of the records this batch made newest, read here rather than
            # at the tick, into the rows of the last snapshot's layout (carried by node id when the
            # next one lays its rows out again; a node new since is read there). The snapshot
            # checks every row by identity, so nothing here can make it read a wrong value.
            kept = self._snapshots
            if kept is not None and kept.nodes is not None and len(items) >= _FEW:
                kept.nodes.take(items)
            if wrote_ids:
                self._wrote_nodes(wrote_ids, wrote_at, len(items))
        return out

    def fold_outcomes(self, items: Sequence[Outcome | None], *, catch: bool = True) -> list[tuple[int, str]]:
        """Fold request outcomes in order (``None`` items skipped); returns why records were
        refused or folded in part, as ``(index, reason)``: a refusal (the pool cap), a record
        folded without a part of it (the tenant or unplaced-node caps: the shard dead-letters it
        all the same), or, with ``catch``, ``fold-error: <type>: <message>`` for a record whose
        fold raised (what it changed before raising stays; the batch goes on; without ``catch``
        the exception propagates). One record's steps: :meth:`_fold_outcome`."""
        out: list[tuple[int, str]] = []
        self._ledger_fifo()
        wrote_ids: list[str] = []  # the node windows written, and their buckets (_wrote_nodes)
        wrote_at: list[int] = []
        fold = self._fold_outcome
        try:
            for i, o in enumerate(items):
                if o is None:
                    continue
                try:
                    why = fold(o, wrote_ids, wrote_at)
                except Exception as exc:  # a record the model cannot take must not stop the batch
                    if not catch:
                        raise
                    why = _fold_error(exc)
                if why is not None:
                    out.append((i, why))
        finally:
            if wrote_ids:
                self._wrote_nodes(wrote_ids, wrote_at, len(items))
        return out

    def _fold_outcome(self, o: Outcome, wrote_ids: list[str], wrote_at: list[int]) -> str | None:
        """One outcome (see the module's docstring); the node window it wrote is appended to
        ``wrote_ids``, its bucket to ``wrote_at``. Returns why it was refused or folded in part."""
        if o.diverted_to is not None:
            self._fold_copy(o)
            return None
        pool_id, ts = o.pool_id, o.ts_ms
        pool = self.pools.get(pool_id)
        if pool is None:
            pool = self._pool(pool_id, ts)
            if pool is None:
                return _no_pool(self.config)
        self._fold_task(o, pool_id, ts)
        # The pool's clocks.
        late_or_newer = ts > pool.watermark_ms or ts // BUCKET_MS <= pool.evicted_to
        if late_or_newer and not self._admit(pool_id, pool, ts):
            return None
        if ts > pool.outcomes_ms:
            new_bucket = ts // BUCKET_MS > pool.outcomes_ms // BUCKET_MS
            pool.outcomes_ms = ts
            if new_bucket:
                self._advance_ledger_clock()  # at most once per bucket per pool
        b = ts // BUCKET_MS
        if b < self._written_from:  # noqa: PLR1730 (a compare, not a call, per record)
            self._written_from = b
        outcome = o.outcome
        ok = outcome == "ok"
        failed = outcome in FAILED_OUTCOMES
        shed = outcome == "shed"
        retry = o.attempt > 0
        # The pool's windows: its call, outcome and tokens, its TTFT histogram, the priority class
        # it served (not one it turned away), and a task it ended (lost unless ok or our own shed).
        # A bucket made lowers its window's ``low`` to it (eviction pops from there).
        w = pool.win
        rows = w.buckets
        row = rows.get(b)
        if row is None:
            rows[b] = [1.0, float(ok), float(failed), float(retry), float(shed),
                       float(o.prompt_tokens), float(o.output_tokens)]  # fmt: skip
            if b < w.low:  # noqa: PLR1730 (a compare, not a call, per new bucket)
                w.low = b
        else:
            row[_P_REQ] += 1.0
            if ok:
                row[_P_OK] += 1.0
            if failed:
                row[_P_FAIL] += 1.0
            if retry:
                row[_P_RETRY] += 1.0
            if shed:
                row[_P_SHED] += 1.0
            row[_P_PROMPT] += o.prompt_tokens
            row[_P_OUT] += o.output_tokens
        ttft_ms = o.ttft_ms
        if ttft_ms is not None:  # pool.ttft.add_at(b, lat_bin(ttft_ms), 1.0), inlined
            w = pool.ttft
            rows = w.buckets
            row = rows.get(b)
            if row is None:
                row = rows[b] = [0.0] * N_LAT_BINS
                if b < w.low:  # noqa: PLR1730
                    w.low = b
            row[bisect_right(LAT_EDGES_MS, ttft_ms)] += 1.0
        if not shed:
            w = pool.by_priority
            rows = w.buckets
            row = rows.get(b)
            if row is None:
                row = rows[b] = [0.0] * N_PRIORITIES
                if b < w.low:  # noqa: PLR1730
                    w.low = b
            priority = o.priority  # min(max(priority, 0), 9), its common case first
            in_range = type(priority) is int and 0 <= priority <= _TOP_PRIORITY
            row[priority if in_range else min(max(priority, 0), _TOP_PRIORITY)] += 1.0
        if o.task_outcome is not None:
            pool.tasks.add(b, (1.0, float(o.task_outcome == "failed" and not shed)))
        # The tenant's window.
        why: str | None = None
        tenants = self.tenants
        tenant_id = o.tenant_id
        tenant = tenants.get(tenant_id)
        if tenant is None:
            if len(tenants) >= self.config.max_tenants:
                self.refused["tenants"] += 1
                why = PARTIAL_TENANTS
            else:
                tenant = tenants[tenant_id] = _Tenant(priority=o.priority)
        elif o.priority < tenant.priority:
            tenant.priority = o.priority  # its most important class seen: order-independent
        if tenant is not None:
            w = tenant.win
            rows = w.buckets
            row = rows.get(b)
            if row is None:
                rows[b] = [1.0, float(retry), float(shed)]
                if b < w.low:  # noqa: PLR1730
                    w.low = b
            else:
                row[_T_REQ] += 1.0
                if retry:
                    row[_T_RETRY] += 1.0
                if shed:
                    row[_T_SHED] += 1.0
        node_id = o.node_id
        if node_id is not None and not shed:  # a shed call never reached a node: no evidence
            why_node = self._fold_node(node_id, o.ttft_ms, b, ok, failed, wrote_ids, wrote_at)
            if why is None:
                why = why_node
        return why

    def _fold_node(  # noqa: PLR0917
        self,
        node_id: str,
        ttft_ms: float | None,
        b: int,
        ok: bool,
        failed: bool,
        wrote_ids: list[str],
        wrote_at: list[int],
    ) -> str | None:
        """The node's window (a node without telemetry yet keeps one aside, up to its cap; the
        window written is noted in ``wrote_ids`` and ``wrote_at`` before it is written) and its run
        of consecutive failures; the partial reason when the unplaced-node cap left the window out."""
        node = self.nodes.get(node_id)
        if node is not None:
            win = node.win
        else:
            node_wins = self.node_wins
            found = node_wins.get(node_id)
            if found is None:
                if len(node_wins) >= self.config.max_unplaced_nodes:
                    self.refused["unplaced_nodes"] += 1
                    return PARTIAL_UNPLACED
                found = node_wins[node_id] = Window(8)
            win = found
        wrote_ids.append(node_id)
        wrote_at.append(b)
        rows = win.buckets
        row = rows.get(b)
        ttft = ttft_ms if ttft_ms is not None else 0.0
        if row is None:
            rows[b] = [1.0, float(ok), float(failed), ttft, float(ttft_ms is not None), 0.0, 0.0, 0.0]
            if b < win.low:  # noqa: PLR1730 (the window's ``low``: eviction pops from there)
                win.low = b
        else:
            row[_N_REQ] += 1.0
            if ok:
                row[_N_OK] += 1.0
            if failed:
                row[_N_FAIL] += 1.0
            row[_N_TTFT_SUM] += ttft  # always added: keeps a -0.0 sum's sign
            if ttft_ms is not None:
                row[_N_TTFT_N] += 1.0
        if node is not None:
            if ok:
                node.consecutive_failures = 0
            elif failed:
                node.consecutive_failures += 1
        return None

    def _fold_copy(self, o: Outcome) -> None:
        """A moved call's copy (``diverted_to`` set; :func:`fleetloop.schemas.requests.diverted_copy`),
        keyed by the pool the router moved it from (``pool_id``): its tokens count as that pool's
        diverted demand, in the bucket of its stamp, and nothing else (no request, no ledger entry,
        no node, no clock moved). Only a pool this model already holds (a copy names no new pool),
        only a bucket within the pool's own retention (not evicted, and not further ahead of its
        clock than its retention: a far-future stamp cannot pin buckets the pool's eviction never
        reaches)."""
        pool = self.pools.get(o.pool_id)
        if pool is None:
            return
        b = o.ts_ms // BUCKET_MS
        if b <= pool.evicted_to or b * BUCKET_MS > pool.watermark_ms + self.config.retention_ms:
            return
        if b < self._written_from:  # noqa: PLR1730 (a compare, not a call)
            self._written_from = b
        pool.diverted.add_at(b, 0, float(o.prompt_tokens + o.output_tokens))

    def _wrote_nodes(self, ids: list[str], buckets: list[int], batch: int) -> None:
        """After a batch fold of ``batch`` records wrote bucket ``buckets[k]`` of node ``ids[k]``'s
        window: re-read those rows into the snapshot's kept columns here (rather than all of every
        such bucket at the tick); with no kept columns, a value they cannot take, or a batch of
        one record, mark them written, and the snapshot reads those buckets
        again."""
        kept = self._snapshots
        if kept is None or kept.nodes is None or batch < _FEW or not kept.nodes.refresh(ids, buckets):
            low = min(buckets)
            if low < self._node_written_from:  # noqa: PLR1730
                self._node_written_from = low
