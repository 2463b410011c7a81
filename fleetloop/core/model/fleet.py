"""The fleet model: a pure reducer over telemetry and request outcomes, keyed by event time.

``apply(model, events) -> model`` folds a batch; ``snapshot(model, now_ms, ...)`` freezes what the
policies see at a tick. No I/O, no clock: ``now_ms`` is the tick's event time.

The snapshot is built as columns (:func:`snapshot`): the nodes' window totals for the whole fleet in
array operations, re-reading only the buckets folded into since the previous snapshot (the fold
marks the lowest one), and the nodes as a :class:`~fleetloop.policies.columns.NodeTable` whose views
are built when a policy asks for one. :func:`snapshot_plain` is the same snapshot as a dict of views
(``tests/unit/test_fast_snapshot.py`` holds the two equal, bit for bit). What the snapshot keeps
between ticks is transient: it is not checkpointed (``FleetModel._TRANSIENT``).

What it keeps:
- per node: the newest telemetry (by ``ts_ms``), router-observed calls in event-time buckets
  (requests, ok, failures, TTFT sum and count), node-reported errors/timeouts/preemptions, and the
  run of consecutive failed calls (in the order the router reported them: one pool is one
  partition, so that order is the same in a replay). A shed call is not a node's: it counts in its
  pool's and tenant's windows only, even when its record names a node, so no breaker or ejection
  cap reads a router's own sheds (or HAProxy's 503 with no server left) as evidence against a node;
- per pool: calls, outcomes, tokens and a TTFT histogram in event-time buckets;
- per tenant: calls, retries, sheds;
- the workflow ledger: every task's calls, attempts and spend, its outcome when the last call
  says so, and the fleet's cost (each telemetry interval x the node's price), which together give
  cost per successful task.

Tasks spanning partitions. A task calls several pools, and pools live on different partitions, so
one task's calls reach several shards while its last call (the one carrying ``task_outcome``)
reaches exactly one. That shard counts the outcome, once fleet-wide, and takes the whole task's
spend from the call itself (``workflow_spend_usd`` is the router's running total), so a failed
task's spend is exact without the other shards. Every other shard holds the task open only as long
as it keeps calling there: quiet for ``abandon_workflow_after_ms`` (on the ledger's clock, the upper
median of the pools' newest outcome times, so telemetry read ahead of a backlog of outcomes does
not make that backlog's tasks look quiet, and with three pools or more one far-ahead record does
not either), it is let go as
*handed off* (``tasks_handed_off``): its outcome is another shard's to count, never a failure here.
A later call of it opens it again. The price of that rule: a task no shard ever sees end (its router
died mid-task) is counted by no shard, rather than as a failure by each shard it touched.

``apply`` takes ownership of the model it is given and returns it (updating in place keeps the hot
path free of copies); callers never keep a reference to the old one.

Order independence: the state after folding a set of records does not depend on how partitions
interleaved (only on each partition's own order), which is what exact replay relies on. So money is
summed in integer nano-dollars (float sums depend on order), a node leaves the snapshot when its own
telemetry is older than ``forget_node_after_ms`` at the snapshot's ``now_ms`` (not when a shared
watermark happens to pass), and memory is reclaimed only well behind the retention horizon.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from itertools import repeat
from operator import attrgetter, is_not
from types import MappingProxyType
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from fleetloop.core.model.windows import (
    BUCKET_MS,
    LAT_EDGES_MS,
    N_LAT_BINS,
    Window,
    WindowColumns,
    lat_value,
    quantile_from_bins,
)
from fleetloop.policies.base import FleetSnapshot, LedgerView, NodeView, PoolView, TenantView
from fleetloop.policies.columns import N_TEL, NodeTable, tel_numbers
from fleetloop.schemas.fast import Outcome, OutcomeRec, Telemetry, TelemetryRec
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.telemetry import NodeTelemetry

TELEMETRY_TYPES = (TelemetryRec, NodeTelemetry)
OUTCOME_TYPES = (OutcomeRec, RequestOutcome)

FAILED_OUTCOMES = frozenset({"error", "timeout", "retry"})

# Node window columns
_N_REQ, _N_OK, _N_FAIL, _N_TTFT_SUM, _N_TTFT_N, _N_ERR, _N_TO, _N_PRE = range(8)
# Pool window columns
_P_REQ, _P_OK, _P_FAIL, _P_RETRY, _P_SHED, _P_PROMPT, _P_OUT = range(7)
# Tenant window columns
_T_REQ, _T_RETRY, _T_SHED = range(3)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Retention and the caps that keep the model's memory bounded whatever arrives.

    The caps are sized for a 10,000-node fleet with room to spare: a real fleet that outgrows one
    sees it in the ``refused`` counters (and in the dead letters of records that named a pool or
    node beyond the cap), never as a slow or crashed daemon.
    """

    retention_ms: int = 300_000  # keep this much event time behind the pool's newest record
    forget_node_after_ms: int = 60_000  # a node silent this long leaves its pool
    finished_workflow_ttl_ms: int = 60_000  # remember finished tasks this long (late records)
    # A task with no call in this shard for this long is let go as handed off (not failed): its
    # other calls, and the one that ends it, went to other partitions. Memory is rate x this. Long
    # enough for the gaps of one live task (a long-context call, a tool run): the autoscaler reads
    # the open tasks as demand still ahead. 120 s leaves every scenario's decisions as they were
    # with the former 1 h (checked on research-long-context and autonomous-workflows); 30 s did not.
    abandon_workflow_after_ms: int = 120_000
    # The horizon learned from the gaps between one task's calls (``handoff_horizon_ms``) lies
    # between this and ``abandon_workflow_after_ms``.
    min_handoff_ms: int = 10_000
    max_pools: int = 256
    max_nodes_per_pool: int = 2_048
    max_nodes: int = 20_000  # across all pools
    max_tenants: int = 10_000
    max_open_workflows: int = 500_000  # beyond: the earliest opened is let go (handed off)
    max_finished_workflows: int = 200_000  # by count too, not only by ttl: ~100 B each
    max_unplaced_nodes: int = 16_384  # node ids seen in outcomes before any telemetry of theirs


@dataclass(slots=True)
class _Node:
    telemetry: Telemetry
    win: Window = field(default_factory=lambda: Window(8))
    consecutive_failures: int = 0


N_PRIORITIES = 10  # priority classes 0..9 (RequestOutcome.priority's bounds)


@dataclass(slots=True)
class _Pool:
    win: Window = field(default_factory=lambda: Window(7))
    ttft: Window = field(default_factory=lambda: Window(N_LAT_BINS))
    by_priority: Window = field(default_factory=lambda: Window(N_PRIORITIES))  # calls per class
    tasks: Window = field(default_factory=lambda: Window(2))  # tasks ended here, tasks lost here
    # Tokens of calls the router moved from this pool to another model's pool (its model spill):
    # demand this pool did not serve (the calls' copies keyed by this pool, RequestOutcome.diverted_to).
    diverted: Window = field(default_factory=lambda: Window(1))
    watermark_ms: int = -1  # newest event time of this pool's own records: its clock, nobody else's
    outcomes_ms: int = -1  # newest event time of its request outcomes alone (the ledger's clock)
    evicted_to: int = -(2**62)  # buckets at or before this are gone
    nodes: set[str] = field(default_factory=set)
    full_checked_bucket: int = -1  # the node cap's eviction scan runs at most once per bucket
    # The ledger's tasks as this pool sees them (cumulative): open ones that have called it, those
    # that first called it, those of them that ended or were let go, and tasks whose final call
    # (the one carrying the outcome) was here and failed, our own sheds included.
    wf_open: int = 0
    wf_started: int = 0
    wf_ended: int = 0
    wf_failed: int = 0


@dataclass(slots=True)
class _Tenant:
    priority: int
    win: Window = field(default_factory=lambda: Window(3))


_NEVER = 2**62  # ``_written_from`` when nothing was written since the last snapshot
_FAR_PAST = -(2**62)

NANO = 1_000_000_000  # money is summed in integer nano-dollars: exact, so order-independent
_MAX_NUSD = 10**18  # one record's money is bounded by the schema far below this; clamp anyway
_MAX_USD = _MAX_NUSD / NANO  # nano_usd's clamp in dollars (the batch folds inline it)

# Why an outcome was folded without a part of it (a partial cap): the record is dead-lettered all
# the same, so an operator sees which records met a full cap (the open-workflow cap refuses nothing:
# it lets the earliest-opened task go).
PARTIAL_TENANTS = "capacity-tenants: tenant cap reached; the record was folded without its tenant"
PARTIAL_UNPLACED = (
    "capacity-unplaced-nodes: cap on nodes without telemetry reached; its node window was not kept"
)


def nano_usd(usd: float) -> int:
    """Dollars as integer nano-dollars, clamped to [0, 1e9 USD] (never OverflowError, NaN is 0)."""
    if not usd > 0.0:  # also NaN
        return 0
    if usd >= _MAX_NUSD / NANO:
        return _MAX_NUSD
    return round(usd * NANO)


GAP_EDGES_MS = (1_000, 2_000, 5_000, 10_000, 20_000, 30_000, 60_000, 120_000, 300_000, 600_000)
GAP_QUANTILE = 0.999
GAP_MIN_SAMPLES = 1_000


def handoff_horizon_ms(gaps: list[int], config: ModelConfig) -> int:
    """How long a task may go without a call in a shard before it is let go as handed off: twice
    the gap between one task's consecutive calls here that 99.9% of gaps stay within (the upper
    edge of its bucket), at least ``min_handoff_ms``, at most ``abandon_workflow_after_ms``, and
    that ceiling until ``GAP_MIN_SAMPLES`` gaps were seen. Learned like a retransmission timeout
    from round trips: a shard whose tasks call again within a second (their other calls went to
    other partitions) lets them go after seconds, one whose tasks wait on long calls or tools keeps
    them for minutes. A few long gaps (a hostile task) cannot move the quantile; many can raise it
    to the ceiling at most."""
    total = sum(gaps)
    ceiling = config.abandon_workflow_after_ms
    if total < GAP_MIN_SAMPLES:
        return ceiling
    need = GAP_QUANTILE * total
    seen = 0
    for i, n in enumerate(gaps):
        seen += n
        if seen >= need:
            if i == len(GAP_EDGES_MS):
                return ceiling
            return min(ceiling, max(config.min_handoff_ms, 2 * GAP_EDGES_MS[i]))
    return ceiling


@dataclass(slots=True)
class _Workflow:
    tenant_id: str
    priority: int
    first_ms: int
    last_ms: int
    calls: int = 0
    attempts: int = 0
    spend_nusd: int = 0
    pools: tuple[str, ...] = ()  # the pools this open task has called, in first-call order


@dataclass(slots=True)
class _Ledger:
    tasks_started: int = 0
    tasks_succeeded: int = 0
    tasks_failed: int = 0
    fleet_cost_nusd: int = 0
    spend_on_failed_nusd: int = 0
    # Open here: in the order they were opened (a task still calling when it reaches the front is
    # moved to the back, so the front is always the quietest candidate to let go).
    active: dict[str, _Workflow] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=dict)  # workflow id -> finish ts_ms, in finish order
    tasks_handed_off: int = 0  # let go after going quiet here, their outcome another shard's to count
    clock_ms: int = -1  # the upper median of the pools' outcome clocks: when a task went quiet
    # How far apart one open task's consecutive calls here were: counts per GAP_EDGES_MS bucket (the
    # last one: beyond them all). The handoff horizon is learned from it.
    gaps: list[int] = field(default_factory=lambda: [0] * (len(GAP_EDGES_MS) + 1))


CAPPED = ("pools", "nodes", "tenants", "workflows", "unplaced_nodes")


class FleetModel:
    """Mutable state behind :func:`apply`; read it only through :func:`snapshot`.

    Clocks: each pool has its own event-time watermark (the newest ``ts_ms`` of its own records),
    which drives that pool's late-record rule and the eviction of its windows and nodes, so one
    record stamped far ahead moves one pool's clock at most, never another's. Fleet-wide state
    (tenants, the workflow ledger, outcomes on nodes without telemetry) follows the fleet clock,
    the upper median of the pools' watermarks: one pool running ahead cannot move it (with three
    pools or more), and one silent pool cannot stop it. A pool silent for the retention plus
    ``forget_node_after_ms`` on the fleet clock is evicted.

    Caps (:class:`ModelConfig`): a record that would add a pool or a node beyond its cap, when no
    silent one can make room, is refused: ``fold_*`` returns the reason and nothing of it is
    folded; beyond the tenant or unplaced-node caps the record is folded without that part. At the
    open-workflow cap the earliest-opened task is let go as handed off instead (never a refusal:
    an outcome is always counted). ``refused`` and ``evicted`` count both, by kind.
    """

    __slots__ = (
        "_evicted_below",
        "_fleet_evicted_to",
        "_node_written_from",
        "_nodes_changed",
        "_pools_full_checked_bucket",
        "_snapshots",
        "_written_from",
        "config",
        "evicted",
        "late_dropped",
        "ledger",
        "node_wins",
        "nodes",
        "pools",
        "refused",
        "tenants",
        "watermark_ms",
    )
    # What the snapshot keeps between ticks (:class:`_Snapshots`) and the marks the fold leaves it,
    # derived from the rest and never checkpointed: ``_written_from`` the lowest bucket of a pool's
    # window folded into since the last snapshot, ``_node_written_from`` the same for the nodes'
    # windows (the batch folds re-read what they wrote into the snapshot's kept node columns
    # instead, :meth:`_NodeRows.refresh`), ``_evicted_below`` the highest eviction horizon, ``_nodes_changed``
    # counts node arrivals, departures and moves. A model decoded from a checkpoint gets these values
    # (plain data the decoder sets, no code of ours): everything written, nothing kept. (Not a
    # ``__getattr__`` fallback: a class with one loses Python's fast attribute access, which tripled
    # the cost of every ``self.`` in the fold.)
    _TRANSIENT: ClassVar[Mapping[str, int | None]] = MappingProxyType(
        {
            "_evicted_below": _FAR_PAST,
            "_node_written_from": _FAR_PAST,
            "_nodes_changed": 0,
            "_snapshots": None,
            "_written_from": _FAR_PAST,
        }
    )

    def __init__(self, config: ModelConfig | None = None) -> None:
        self.config = config or ModelConfig()
        self.nodes: dict[str, _Node] = {}
        self.node_wins: dict[str, Window] = {}
        self.pools: dict[str, _Pool] = {}
        self.tenants: dict[str, _Tenant] = {}
        self.ledger = _Ledger()
        self.watermark_ms = 0  # the fleet clock
        self.late_dropped = 0
        self.refused: dict[str, int] = dict.fromkeys(CAPPED, 0)
        self.evicted: dict[str, int] = dict.fromkeys((*CAPPED, "finished_workflows"), 0)
        self._fleet_evicted_to = 0
        self._pools_full_checked_bucket = -1
        self._written_from = _NEVER
        self._node_written_from = _NEVER
        self._evicted_below = _FAR_PAST
        self._nodes_changed = 0
        self._snapshots: _Snapshots | None = None

    # -- folding --------------------------------------------------------------------------------

    def _pool(self, pool_id: str, ts_ms: int) -> _Pool | None:
        """The pool's state, created if there is room (evicting the silentest pool if one is silent)."""
        pool = self.pools.get(pool_id)
        if pool is not None:
            return pool
        cfg = self.config
        if len(self.pools) >= cfg.max_pools:
            bucket = ts_ms // BUCKET_MS
            if bucket <= self._pools_full_checked_bucket:
                self.refused["pools"] += 1
                return None
            self._pools_full_checked_bucket = bucket
            oldest = min(self.pools, key=lambda p: (self.pools[p].watermark_ms, p))
            if ts_ms - self.pools[oldest].watermark_ms <= cfg.forget_node_after_ms:
                self.refused["pools"] += 1
                return None
            self._drop_pool(oldest)
        pool = self.pools[pool_id] = _Pool()
        return pool

    def _drop_pool(self, pool_id: str) -> None:
        pool = self.pools.pop(pool_id)
        self._nodes_changed += 1
        for node_id in sorted(pool.nodes):
            self.nodes.pop(node_id, None)
        self.evicted["pools"] += 1
        self.evicted["nodes"] += len(pool.nodes)

    def _admit(self, pool_id: str, pool: _Pool, ts_ms: int) -> bool:
        """Advance the pool's clock; False when the record is older than the pool's retention."""
        if ts_ms > pool.watermark_ms:
            new_bucket = ts_ms // BUCKET_MS > pool.watermark_ms // BUCKET_MS
            pool.watermark_ms = ts_ms
            horizon = (ts_ms - self.config.retention_ms) // BUCKET_MS
            if horizon > pool.evicted_to + 10:  # evict in steps of 10 buckets, not per record
                self._evict_pool(pool_id, pool, horizon)
            if new_bucket:
                self._advance_fleet_clock()  # at most once per bucket per pool
        elif ts_ms // BUCKET_MS <= pool.evicted_to:
            self.late_dropped += 1
            return False
        return True

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
        if b < self._written_from:  # noqa: PLR1730 (a compare, not a call, per record)
            self._written_from = b
        pool.diverted.add_at(b, 0, float(o.prompt_tokens + o.output_tokens))

    def _ledger_fifo(self) -> None:
        """Hold a ledger dict that has filled to half its cap as an ``OrderedDict``: same entries,
        same order, same checkpoint bytes (a mapping is written as its keys and values in order),
        and the cap's "let go of the earliest" reads its front in O(1).

        A plain dict does not close the holes deletions leave until it is resized, so
        ``next(iter(d))`` steps over every entry deleted from the front since: at the cap every new
        task deletes one, and folding a new task's outcome cost 77 us at the default 500,000 open
        tasks against 10 us below the cap (``bench/results/ledger-s13.md``): a flood of new
        workflow ids, which the schema accepts, would hold a shard to ~13,000 outcomes a second.
        An ``OrderedDict`` keeps its order in a linked list, so its front is one step away; it
        costs ~50 ns more per lookup and ~50 bytes more per entry, which is why a ledger below
        half its cap stays a plain dict. Called before a fold takes its local names for the
        dicts (a dict replaced mid-batch would leave them on the old one); a checkpoint restores
        plain dicts, and the first fold after it converts them again."""
        ledger, cfg = self.ledger, self.config
        if type(ledger.active) is dict and 2 * len(ledger.active) >= cfg.max_open_workflows:
            ledger.active = OrderedDict(ledger.active)
        if type(ledger.finished) is dict and 2 * len(ledger.finished) >= cfg.max_finished_workflows:
            ledger.finished = OrderedDict(ledger.finished)

    def fold(self, e: Telemetry | Outcome) -> str | None:
        """Fold one record of either kind (a wire model or its twin); returns why it was refused."""
        if isinstance(e, TELEMETRY_TYPES):
            return self.fold_telemetry(e)
        return self.fold_outcome(e)

    def fold_telemetry(self, t: Telemetry) -> str | None:
        """Fold one telemetry record; returns why it was refused (a cap), or None."""
        pool_id, node_id, ts = t.pool_id, t.node_id, t.ts_ms
        pool = self.pools.get(pool_id)
        if pool is None:
            pool = self._pool(pool_id, ts)
            if pool is None:
                return f"capacity-pools: pool cap {self.config.max_pools} reached, no silent pool to evict"
        nodes = self.nodes
        node = nodes.get(node_id)
        if node is None:
            if len(pool.nodes) >= self.config.max_nodes_per_pool and not self._make_room(pool, t):
                self.refused["nodes"] += 1
                return f"capacity-nodes: node cap {self.config.max_nodes_per_pool} of pool {pool_id} reached"
            if len(nodes) >= self.config.max_nodes:
                self.refused["nodes"] += 1
                return f"capacity-nodes: fleet node cap {self.config.max_nodes} reached"
        cost = t.cost_rate_usd_per_h * t.interval_ms / 3_600_000.0
        if cost > 0.0:
            self.ledger.fleet_cost_nusd += nano_usd(cost)
        # The pool's clock (``_admit``), whose common case (not newer, not late) changes nothing.
        if ts > pool.watermark_ms or ts // BUCKET_MS <= pool.evicted_to:
            if not self._admit(pool_id, pool, ts):
                return None
            node = nodes.get(node_id)  # the pool's clock moved: this node may have been evicted
        if node is None:
            win = self.node_wins.pop(node_id, None) or Window(8)
            node = nodes[node_id] = _Node(telemetry=t, win=win)
            pool.nodes.add(node_id)
            self._nodes_changed += 1
        elif ts >= node.telemetry.ts_ms:
            if node.telemetry.pool_id != pool_id:
                old = self.pools.get(node.telemetry.pool_id)
                if old is not None:
                    old.nodes.discard(node_id)
                pool.nodes.add(node_id)
                self._nodes_changed += 1
            node.telemetry = t
        if t.errors or t.timeouts or t.preemptions:
            b = ts // BUCKET_MS
            if b < self._node_written_from:  # noqa: PLR1730 (a compare, not a call, per record)
                self._node_written_from = b
            node.win.add_at(b, _N_ERR, t.errors)
            node.win.add_at(b, _N_TO, t.timeouts)
            node.win.add_at(b, _N_PRE, t.preemptions)
        return None

    def _make_room(self, pool: _Pool, t: Telemetry) -> bool:
        """Evict the pool's silentest node if it has been silent past ``forget_node_after_ms``."""
        bucket = t.ts_ms // BUCKET_MS
        if bucket <= pool.full_checked_bucket:
            return False
        pool.full_checked_bucket = bucket
        nodes = self.nodes
        oldest = min(
            (n for n in pool.nodes if n in nodes), key=lambda n: (nodes[n].telemetry.ts_ms, n), default=None
        )
        if oldest is None or t.ts_ms - nodes[oldest].telemetry.ts_ms <= self.config.forget_node_after_ms:
            return False
        del nodes[oldest]
        pool.nodes.discard(oldest)
        self.evicted["nodes"] += 1
        self._nodes_changed += 1
        return True

    def fold_outcome(self, o: Outcome) -> str | None:
        """Fold one request outcome; returns why it was refused (a cap), or None.

        The hot path of ingest: window rows are updated in place, column by column, rather than
        through :meth:`Window.add` (the same sums: adding 0.0 to a count column is skipped, which
        changes nothing, since those columns hold sums of non-negative integers)."""
        if o.diverted_to is not None:
            self._fold_copy(o)
            return None
        pool_id, ts = o.pool_id, o.ts_ms
        pool = self.pools.get(pool_id)
        if pool is None:
            pool = self._pool(pool_id, ts)
            if pool is None:
                return f"capacity-pools: pool cap {self.config.max_pools} reached, no silent pool to evict"
        self._fold_ledger(o)
        if (ts > pool.watermark_ms or ts // BUCKET_MS <= pool.evicted_to) and not self._admit(
            pool_id, pool, ts
        ):
            return None
        if ts > pool.outcomes_ms:
            new_bucket = ts // BUCKET_MS > pool.outcomes_ms // BUCKET_MS
            pool.outcomes_ms = ts
            if new_bucket:
                self._advance_ledger_clock()  # at most once per bucket per pool
        b = ts // BUCKET_MS
        if b < self._written_from:  # noqa: PLR1730 (a compare, not a call, per record)
            self._written_from = b
        if b < self._node_written_from:  # noqa: PLR1730 (a compare, not a call, per record)
            self._node_written_from = b
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
            rows = pool.ttft.buckets
            row = rows.get(b)
            if row is None:
                row = rows[b] = [0.0] * N_LAT_BINS
            row[bisect_right(LAT_EDGES_MS, ttft_ms)] += 1.0
        if not shed:  # the classes the pool served, not those it turned away (add_at, inlined)
            rows = pool.by_priority.buckets
            row = rows.get(b)
            if row is None:
                row = rows[b] = [0.0] * N_PRIORITIES
            row[min(max(o.priority, 0), N_PRIORITIES - 1)] += 1.0
        if o.task_outcome is not None:  # a task ended on this call; lost unless ok or our own shed
            pool.tasks.add(b, (1.0, float(o.task_outcome == "failed" and not shed)))
        tenant = self.tenants.get(o.tenant_id)
        if tenant is None:
            if len(self.tenants) < self.config.max_tenants:
                tenant = self.tenants[o.tenant_id] = _Tenant(priority=o.priority)
            else:
                self.refused["tenants"] += 1
        elif o.priority < tenant.priority:
            tenant.priority = o.priority  # the tenant's most important class seen: order-independent
        if tenant is not None:
            rows = tenant.win.buckets
            row = rows.get(b)
            if row is None:
                rows[b] = [1.0, float(retry), float(shed)]
            else:
                row[_T_REQ] += 1.0
                if retry:
                    row[_T_RETRY] += 1.0
                if shed:
                    row[_T_SHED] += 1.0
        node_id = o.node_id
        if node_id is None or shed:  # a shed call never reached a node: no evidence about one
            return None
        node = self.nodes.get(node_id)
        if node is not None:
            win: Window | None = node.win
        else:
            win = self.node_wins.get(node_id)
            if win is None:
                if len(self.node_wins) < self.config.max_unplaced_nodes:
                    win = self.node_wins[node_id] = Window(8)
                else:
                    self.refused["unplaced_nodes"] += 1
        if win is not None:
            rows = win.buckets
            row = rows.get(b)
            ttft = ttft_ms if ttft_ms is not None else 0.0
            if row is None:
                rows[b] = [1.0, float(ok), float(failed), ttft, float(ttft_ms is not None), 0.0, 0.0, 0.0]
            else:
                row[_N_REQ] += 1.0
                if ok:
                    row[_N_OK] += 1.0
                if failed:
                    row[_N_FAIL] += 1.0
                row[_N_TTFT_SUM] += ttft  # always added: keeps a -0.0 sum's sign as Window.add did
                if ttft_ms is not None:
                    row[_N_TTFT_N] += 1.0
        if node is not None:
            if ok:
                node.consecutive_failures = 0
            elif failed:
                node.consecutive_failures += 1
        return None

    def _fold_ledger(self, o: Outcome) -> None:
        self._ledger_fifo()
        ledger = self.ledger
        wf_id = o.workflow_id
        wf = ledger.active.get(wf_id)
        if wf is None:
            if wf_id in ledger.finished:
                return  # a late or duplicate record of a finished task
            if len(ledger.active) >= self.config.max_open_workflows:
                # Full: the earliest opened is let go as handed off (by count, as by age), so a new
                # task, and the outcome of one that ends on its first call here, is never refused.
                self._close_workflow(ledger.active.pop(next(iter(ledger.active))))
                ledger.tasks_handed_off += 1
                self.evicted["workflows"] += 1
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
            pool = self.pools.get(o.pool_id)
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
            self._close_workflow(wf)
            self._finish(wf_id, o.ts_ms)
            if o.task_outcome == "succeeded":
                ledger.tasks_succeeded += 1
            else:
                ledger.tasks_failed += 1
                pool = self.pools.get(o.pool_id)
                if pool is not None:
                    pool.wf_failed += 1
                # The router's running total covers the calls other shards saw; this shard's own sum
                # covers attempts a router reported without it. The task spent at least both.
                carried = nano_usd(o.workflow_spend_usd) + (nano_usd(cost) if cost > 0.0 else 0)
                ledger.spend_on_failed_nusd += max(wf.spend_nusd, min(carried, _MAX_NUSD))

    def _close_workflow(self, wf: _Workflow) -> None:
        """An open task left the ledger (ended, or let go): it is no longer open on its pools."""
        for pool_id in wf.pools:
            pool = self.pools.get(pool_id)
            if pool is not None:
                pool.wf_open = max(0, pool.wf_open - 1)  # a pool dropped and re-made starts at 0
                pool.wf_ended += 1

    # -- folding a batch (the daemon's path) ----------------------------------------------------

    def fold_telemetries(self, items: Sequence[Telemetry | None]) -> list[tuple[int, str]]:
        """:meth:`fold_telemetry` over a batch, in order (``None`` items skipped): the same state
        after it, bit for bit, and the same reasons, as ``(index, reason)``. A record whose fold
        raises leaves what it changed before raising (as the per-record fold does) and is reported
        as ``fold-error: <type>: <message>``; the batch goes on.

        The daemon's hot path: one loop with the model's containers and settings held in locals
        instead of a method call and a dozen attribute look-ups per record. ``fold_telemetry``
        stays the plain statement of the rule; ``tests/unit/test_fold_batch.py`` holds this to it
        (checkpoint bytes and reasons equal, on generated and hostile records)."""
        out: list[tuple[int, str]] = []
        pools = self.pools
        nodes = self.nodes
        ledger = self.ledger
        refused = self.refused
        cfg = self.config
        max_per_pool, max_nodes = cfg.max_nodes_per_pool, cfg.max_nodes
        bucket_ms = BUCKET_MS
        wrote_ids: list[str] = []  # the node windows written, and their buckets
        wrote_at: list[int] = []
        for i, t in enumerate(items):
            if t is None:
                continue
            try:
                pool_id, node_id, ts = t.pool_id, t.node_id, t.ts_ms
                pool = pools.get(pool_id)
                if pool is None:
                    pool = self._pool(pool_id, ts)
                    if pool is None:
                        out.append(
                            (i, f"capacity-pools: pool cap {cfg.max_pools} reached, no silent pool to evict")
                        )
                        continue
                node = nodes.get(node_id)
                if node is None:
                    if len(pool.nodes) >= max_per_pool and not self._make_room(pool, t):
                        refused["nodes"] += 1
                        out.append((i, f"capacity-nodes: node cap {max_per_pool} of pool {pool_id} reached"))
                        continue
                    if len(nodes) >= max_nodes:
                        refused["nodes"] += 1
                        out.append((i, f"capacity-nodes: fleet node cap {max_nodes} reached"))
                        continue
                cost = t.cost_rate_usd_per_h * t.interval_ms / 3_600_000.0
                if cost > 0.0:  # nano_usd(cost), inlined
                    ledger.fleet_cost_nusd += round(cost * NANO) if cost < _MAX_USD else _MAX_NUSD
                if ts > pool.watermark_ms or ts // bucket_ms <= pool.evicted_to:
                    if not self._admit(pool_id, pool, ts):
                        continue
                    node = nodes.get(node_id)
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
                if t.errors or t.timeouts or t.preemptions:
                    b = ts // bucket_ms
                    wrote_ids.append(node_id)  # re-read below (_NodeRows.refresh)
                    wrote_at.append(b)
                    win = node.win
                    win.add_at(b, _N_ERR, t.errors)
                    win.add_at(b, _N_TO, t.timeouts)
                    win.add_at(b, _N_PRE, t.preemptions)
            except Exception as exc:  # a record the model cannot take must not stop the batch
                out.append((i, f"fold-error: {type(exc).__name__}: {exc}"[:500]))
        # The snapshot's numbers of the records this batch made newest, read here rather than at
        # the tick, into the rows of the last snapshot's layout (carried by node id when the next
        # one lays its rows out again; a node new since is read there). The snapshot checks every
        # row by identity, so nothing here can make it read a wrong value.
        kept = self._snapshots
        if kept is not None and kept.nodes is not None:
            kept.nodes.take(items)
        if wrote_ids:
            self._wrote_nodes(wrote_ids, wrote_at)
        return out

    def fold_outcomes(self, items: Sequence[Outcome | None]) -> list[tuple[int, str]]:
        """:meth:`fold_outcome` (with the ledger, :meth:`_fold_ledger`) over a batch, in order
        (``None`` items skipped): the same state after it, bit for bit. Reasons as ``(index,
        reason)``: a refusal, a record folded without a part of it (the tenant or unplaced-node
        caps; the shard dead-letters it all the same, and these are the reasons it words from the
        ``refused`` counters after a per-record fold), or ``fold-error: <type>: <message>`` for a
        record whose fold raised (what it changed before raising stays; the batch goes on).

        The daemon's hot path (see :meth:`fold_telemetries`); ``tests/unit/test_fold_batch.py``
        holds it to the per-record fold."""
        out: list[tuple[int, str]] = []
        pools = self.pools
        nodes = self.nodes
        node_wins = self.node_wins
        tenants = self.tenants
        self._ledger_fifo()
        ledger = self.ledger
        active, finished, gaps = ledger.active, ledger.finished, ledger.gaps
        refused = self.refused
        evicted = self.evicted
        cfg = self.config
        max_open, max_tenants, max_unplaced = cfg.max_open_workflows, cfg.max_tenants, cfg.max_unplaced_nodes
        bucket_ms = BUCKET_MS
        edge0 = GAP_EDGES_MS[0]
        failed_outcomes = FAILED_OUTCOMES
        lat_edges = LAT_EDGES_MS
        top_priority = N_PRIORITIES - 1
        wrote_ids: list[str] = []  # the node windows written, and their buckets (_NodeRows.refresh)
        wrote_at: list[int] = []
        for i, o in enumerate(items):
            if o is None:
                continue
            try:
                if o.diverted_to is not None:
                    self._fold_copy(o)
                    continue
                pool_id, ts = o.pool_id, o.ts_ms
                pool = pools.get(pool_id)
                if pool is None:
                    pool = self._pool(pool_id, ts)
                    if pool is None:
                        out.append(
                            (i, f"capacity-pools: pool cap {cfg.max_pools} reached, no silent pool to evict")
                        )
                        continue
                # The ledger (_fold_ledger, inlined).
                cost = o.cost_usd
                wf_id = o.workflow_id
                wf = active.get(wf_id)
                if wf is None and wf_id not in finished:
                    if len(active) >= max_open:
                        self._close_workflow(active.pop(next(iter(active))))
                        ledger.tasks_handed_off += 1
                        evicted["workflows"] += 1
                    wf = active[wf_id] = _Workflow(o.tenant_id, o.priority, ts, ts)
                    ledger.tasks_started += 1
                elif wf is not None:
                    gap = ts - wf.last_ms
                    if gap <= edge0:
                        gaps[0] += 1
                    else:
                        gaps[bisect_left(GAP_EDGES_MS, gap)] += 1
                    if gap > 0:
                        wf.last_ms = ts
                if wf is not None:
                    if pool_id not in wf.pools:
                        wf.pools = (*wf.pools, pool_id)
                        held = pools.get(pool_id)
                        if held is not None:
                            held.wf_open += 1
                            held.wf_started += 1
                    wf.attempts += 1
                    if o.attempt == 0:
                        wf.calls += 1
                    spent = (round(cost * NANO) if cost < _MAX_USD else _MAX_NUSD) if cost > 0.0 else 0
                    if spent:
                        wf.spend_nusd += spent
                    task_outcome = o.task_outcome
                    if task_outcome is not None:
                        del active[wf_id]
                        self._close_workflow(wf)
                        self._finish(wf_id, ts)
                        if task_outcome == "succeeded":
                            ledger.tasks_succeeded += 1
                        else:
                            ledger.tasks_failed += 1
                            held = pools.get(pool_id)
                            if held is not None:
                                held.wf_failed += 1
                            carried = nano_usd(o.workflow_spend_usd) + spent
                            ledger.spend_on_failed_nusd += max(wf.spend_nusd, min(carried, _MAX_NUSD))
                # The pool's clocks.
                if (ts > pool.watermark_ms or ts // bucket_ms <= pool.evicted_to) and not self._admit(
                    pool_id, pool, ts
                ):
                    continue
                if ts > pool.outcomes_ms:
                    new_bucket = ts // bucket_ms > pool.outcomes_ms // bucket_ms
                    pool.outcomes_ms = ts
                    if new_bucket:
                        self._advance_ledger_clock()
                b = ts // bucket_ms
                if b < self._written_from:  # noqa: PLR1730 (a compare, not a call, per record)
                    self._written_from = b
                outcome = o.outcome
                ok = outcome == "ok"
                failed = outcome in failed_outcomes
                shed = outcome == "shed"
                retry = o.attempt > 0
                rows = pool.win.buckets
                row = rows.get(b)
                if row is None:
                    rows[b] = [1.0, float(ok), float(failed), float(retry), float(shed),
                               float(o.prompt_tokens), float(o.output_tokens)]  # fmt: skip
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
                if ttft_ms is not None:
                    rows = pool.ttft.buckets
                    row = rows.get(b)
                    if row is None:
                        row = rows[b] = [0.0] * N_LAT_BINS
                    row[bisect_right(lat_edges, ttft_ms)] += 1.0
                if not shed:
                    rows = pool.by_priority.buckets
                    row = rows.get(b)
                    if row is None:
                        row = rows[b] = [0.0] * N_PRIORITIES
                    priority = o.priority  # min(max(priority, 0), 9), its common case first
                    in_range = type(priority) is int and 0 <= priority <= top_priority
                    row[priority if in_range else min(max(priority, 0), top_priority)] += 1.0
                if o.task_outcome is not None:
                    pool.tasks.add(b, (1.0, float(o.task_outcome == "failed" and not shed)))
                why: str | None = None
                tenant_id = o.tenant_id
                tenant = tenants.get(tenant_id)
                if tenant is None:
                    if len(tenants) < max_tenants:
                        tenant = tenants[tenant_id] = _Tenant(priority=o.priority)
                    else:
                        refused["tenants"] += 1
                        why = PARTIAL_TENANTS
                elif o.priority < tenant.priority:
                    tenant.priority = o.priority
                if tenant is not None:
                    rows = tenant.win.buckets
                    row = rows.get(b)
                    if row is None:
                        rows[b] = [1.0, float(retry), float(shed)]
                    else:
                        row[_T_REQ] += 1.0
                        if retry:
                            row[_T_RETRY] += 1.0
                        if shed:
                            row[_T_SHED] += 1.0
                node_id = o.node_id
                if node_id is not None and not shed:  # as fold_outcome: a shed is no node's doing
                    node = nodes.get(node_id)
                    if node is not None:
                        win: Window | None = node.win
                    else:
                        win = node_wins.get(node_id)
                        if win is None:
                            if len(node_wins) < max_unplaced:
                                win = node_wins[node_id] = Window(8)
                            else:
                                refused["unplaced_nodes"] += 1
                                if why is None:
                                    why = PARTIAL_UNPLACED
                    if win is not None:
                        wrote_ids.append(node_id)
                        wrote_at.append(b)
                        rows = win.buckets
                        row = rows.get(b)
                        ttft = ttft_ms if ttft_ms is not None else 0.0
                        if row is None:
                            rows[b] = [
                                1.0,
                                float(ok),
                                float(failed),
                                ttft,
                                float(ttft_ms is not None),
                                0.0,
                                0.0,
                                0.0,
                            ]
                        else:
                            row[_N_REQ] += 1.0
                            if ok:
                                row[_N_OK] += 1.0
                            if failed:
                                row[_N_FAIL] += 1.0
                            row[_N_TTFT_SUM] += ttft
                            if ttft_ms is not None:
                                row[_N_TTFT_N] += 1.0
                    if node is not None:
                        if ok:
                            node.consecutive_failures = 0
                        elif failed:
                            node.consecutive_failures += 1
                if why is not None:
                    out.append((i, why))
            except Exception as exc:  # a record the model cannot take must not stop the batch
                out.append((i, f"fold-error: {type(exc).__name__}: {exc}"[:500]))
        if wrote_ids:
            self._wrote_nodes(wrote_ids, wrote_at)
        return out

    def _wrote_nodes(self, ids: list[str], buckets: list[int]) -> None:
        """After a batch fold wrote bucket ``buckets[k]`` of node ``ids[k]``'s window: re-read those
        rows into the snapshot's kept columns here (rather than all of every such bucket at the
        tick); with no kept columns, or a value they cannot take, mark them written, and the
        snapshot reads those buckets again, as before."""
        kept = self._snapshots
        if kept is None or kept.nodes is None or not kept.nodes.refresh(ids, buckets):
            low = min(buckets)
            if low < self._node_written_from:  # noqa: PLR1730
                self._node_written_from = low

    def _finish(self, wf_id: str, ts_ms: int) -> None:
        finished = self.ledger.finished
        finished[wf_id] = ts_ms
        if len(finished) > self.config.max_finished_workflows:
            del finished[next(iter(finished))]  # the longest-remembered one
            self.evicted["finished_workflows"] += 1

    def _evict_pool(self, pool_id: str, pool: _Pool, horizon_bucket: int) -> None:
        """The pool's own clock moved on: drop its old buckets and its nodes silent too long."""
        pool.evicted_to = horizon_bucket
        self._evicted_below = max(self._evicted_below, horizon_bucket)
        pool.win.evict_before(horizon_bucket)
        pool.ttft.evict_before(horizon_bucket)
        pool.by_priority.evict_before(horizon_bucket)
        pool.tasks.evict_before(horizon_bucket)
        pool.diverted.evict_before(horizon_bucket)
        now = pool.watermark_ms
        forget = self.config.forget_node_after_ms
        nodes = self.nodes
        for node_id in sorted(pool.nodes):
            node = nodes.get(node_id)
            if node is None:
                pool.nodes.discard(node_id)
            elif now - node.telemetry.ts_ms > forget:
                del nodes[node_id]
                pool.nodes.discard(node_id)
                self.evicted["nodes"] += 1
                self._nodes_changed += 1
            else:
                node.win.evict_before(horizon_bucket)

    def _advance_fleet_clock(self) -> None:
        """Move the fleet clock to the upper median of the pools' clocks; evict fleet state behind it."""
        pools = self.pools
        if not pools:
            return
        marks = sorted(p.watermark_ms for p in pools.values())
        now = marks[len(marks) // 2]
        if now <= self.watermark_ms:
            return
        self.watermark_ms = now
        horizon = (now - self.config.retention_ms) // BUCKET_MS
        if horizon > self._fleet_evicted_to + 10:
            self._evict_fleet(horizon)

    def _advance_ledger_clock(self) -> None:
        """Move the ledger's clock to the upper median of the pools' outcome clocks and let go of
        what went quiet behind it. Outcomes alone: telemetry read ahead of a backlog of outcomes
        must not make the tasks in that backlog look quiet."""
        calls = sorted(p.outcomes_ms for p in self.pools.values() if p.outcomes_ms >= 0)
        if calls and calls[len(calls) // 2] > self.ledger.clock_ms:
            self.ledger.clock_ms = calls[len(calls) // 2]
            self._let_go_workflows(self.ledger.clock_ms)

    def _evict_fleet(self, horizon_bucket: int) -> None:
        self._fleet_evicted_to = horizon_bucket
        for node_id in [n for n, win in self.node_wins.items() if not win.evict_before(horizon_bucket)]:
            del self.node_wins[node_id]
            self.evicted["unplaced_nodes"] += 1
        for tenant_id in [t for t, v in self.tenants.items() if not v.win.evict_before(horizon_bucket)]:
            del self.tenants[tenant_id]
            self.evicted["tenants"] += 1
        now = self.watermark_ms
        cfg = self.config
        # Pools silent for the retention plus the node horizon on the fleet clock: nothing of theirs
        # is left in any window or snapshot, so their state goes.
        silent_after = cfg.retention_ms + cfg.forget_node_after_ms
        for pool_id in sorted(p for p, v in self.pools.items() if now - v.watermark_ms > silent_after):
            self._drop_pool(pool_id)

    def _let_go_workflows(self, now: int) -> None:
        """:meth:`_let_go_workflows_plain` (the rule's statement) in one pass over each dict.

        The statement reads the front with ``next(iter(d))`` once per entry that leaves. A dict
        does not close the holes its deletions leave until it is resized, so each of those reads
        steps again over every entry deleted from the front since: a pass that lets ``k`` tasks go
        costs ``k`` times the holes, which was 6.5% of a 3,000-node daemon's CPU (session 10's
        sizing profile). Here one iterator per dict finds how far the front goes (each entry and
        hole read once), and then what leaves is deleted and what moves is moved in the
        statement's order, so the dicts hold the same entries in the same order and every counter
        gets the same additions. Only when every open task is older than the horizon (the whole
        dict was read without a stop) does the statement's loop go on from that state, with the
        moves it has left. ``tests/unit/test_let_go.py`` holds the two equal."""
        cfg = self.config
        ledger = self.ledger
        finished = ledger.finished
        ttl = cfg.finished_workflow_ttl_ms
        expired: list[str] = []
        for wf_id, finished_ms in finished.items():
            if now - finished_ms <= ttl:
                break
            expired.append(wf_id)
        if expired:
            for wf_id in expired:
                del finished[wf_id]
            self.evicted["finished_workflows"] += len(expired)
        active = ledger.active
        quiet = handoff_horizon_ms(ledger.gaps, cfg)
        gone: list[tuple[str, _Workflow]] = []
        moved: list[tuple[str, _Workflow]] = []
        stopped = False
        # In the statement's first pass over the entries there at its start, ``moves > 0`` always
        # holds (it starts at their count and drops by one per entry moved), so it is not read here.
        for wf_id, wf in active.items():
            if now - wf.last_ms > quiet:
                gone.append((wf_id, wf))
            elif now - wf.first_ms > quiet:
                moved.append((wf_id, wf))
            else:
                stopped = True
                break
        if not gone and not moved:
            return
        moves = len(active) - len(moved)
        close = self._close_workflow
        for wf_id, wf in gone:
            del active[wf_id]
            close(wf)
        if gone:
            ledger.tasks_handed_off += len(gone)
            self.evicted["workflows"] += len(gone)
        for wf_id, wf in moved:
            del active[wf_id]
            active[wf_id] = wf
        if not stopped:
            self._let_go_active(now, quiet, moves)

    def _let_go_workflows_plain(self, now: int) -> None:
        """Forget finished tasks past their ttl and let go of open ones quiet past
        ``abandon_workflow_after_ms`` (handed off), both from the front of their insertion-ordered
        dicts: the work is what leaves, not what stays, so it runs at every move of the fleet clock.
        Event times are not monotonic (the door allows 30 s of skew), so an entry can leave up to
        that much late; never early. (The rule's statement; :meth:`_let_go_workflows` is the same
        in one pass over each dict, and is what the fold runs.)"""
        cfg = self.config
        ledger = self.ledger
        finished = ledger.finished
        ttl = cfg.finished_workflow_ttl_ms
        while finished:
            wf_id = next(iter(finished))
            if now - finished[wf_id] <= ttl:
                break
            del finished[wf_id]
            self.evicted["finished_workflows"] += 1
        quiet = handoff_horizon_ms(ledger.gaps, cfg)
        self._let_go_active(now, quiet, len(ledger.active))

    def _let_go_active(self, now: int, quiet: int, moves: int) -> None:
        """The open tasks' part of :meth:`_let_go_workflows_plain`: from the front, let go of the
        quiet ones and move to the back those opened long ago but still calling here, each entry
        at most once per pass (``moves``), until one opened within the horizon is at the front."""
        ledger = self.ledger
        active = ledger.active
        while active:
            wf_id = next(iter(active))
            wf = active[wf_id]
            if now - wf.last_ms > quiet:
                del active[wf_id]
                self._close_workflow(wf)
                ledger.tasks_handed_off += 1
                self.evicted["workflows"] += 1
            elif now - wf.first_ms > quiet and moves > 0:
                moves -= 1
                del active[wf_id]  # opened long ago but still calling here: to the back
                active[wf_id] = wf
            else:
                break  # opened within the horizon, like (nearly) everything behind it


def apply(model: FleetModel, events: Iterable[Telemetry | Outcome]) -> FleetModel:
    """Fold a batch of events into the model and return it (records refused by a cap are counted
    in ``model.refused``). Events are pydantic wire models or their msgspec twins, alike."""
    for e in events:
        model.fold(e)
    return model


def fold_plain(
    model: FleetModel, items: Sequence[Telemetry | Outcome | None], *, outcomes: bool
) -> list[tuple[int, str]]:
    """:meth:`FleetModel.fold_telemetries` / :meth:`FleetModel.fold_outcomes` as their plain
    statement: one :meth:`FleetModel.fold_telemetry` / :meth:`FleetModel.fold_outcome` call per
    record, a part left out by a partial cap read from the ``refused`` counters before and after
    it, an exception caught per record. What the tests hold the batch folds to (byte for byte)."""
    fold = model.fold_outcome if outcomes else model.fold_telemetry
    refused = model.refused
    out: list[tuple[int, str]] = []
    for i, item in enumerate(items):
        if item is None:
            continue
        try:
            rt, ru = refused["tenants"], refused["unplaced_nodes"]
            why = fold(item)  # type: ignore[arg-type]
            if why is None and refused["tenants"] != rt:
                why = PARTIAL_TENANTS
            elif why is None and refused["unplaced_nodes"] != ru:
                why = PARTIAL_UNPLACED
        except Exception as exc:
            why = f"fold-error: {type(exc).__name__}: {exc}"[:500]
        if why is not None:
            out.append((i, why))
    return out


_NODE_VIEW_FIELDS = tuple(f.name for f in fields(NodeView))
# Each slot's setter, in field order: a view is built by setting its slots on a bare instance, which
# is what the frozen dataclass's ``__init__`` does, without its per-field ``object.__setattr__`` call
# and keyword matching (a snapshot builds one view per node: 10,000 per tick at fleet scale).
_NODE_VIEW_SETTERS = tuple(getattr(NodeView, name).__set__ for name in _NODE_VIEW_FIELDS)
_new = object.__new__


def node_totals(win: Window, now_ms: int, window_ms: int) -> list[float]:
    """``win.total(now_ms, window_ms)`` for a node's 8-column window, unrolled: the same additions
    in the same order (bucket by ascending bucket, from 0.0), so the same doubles, at about a third
    of the cost (a snapshot sums one window per node)."""
    hi = now_ms // BUCKET_MS
    lo = hi - max(1, window_ms // BUCKET_MS)
    get = win.buckets.get
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    for b in range(lo + 1, hi + 1) if hi - lo <= len(win.buckets) else sorted(win.buckets):
        r = get(b)
        if r is not None and lo < b <= hi:
            x0, x1, x2, x3, x4, x5, x6, x7 = r
            a0 += x0
            a1 += x1
            a2 += x2
            a3 += x3
            a4 += x4
            a5 += x5
            a6 += x6
            a7 += x7
    return [a0, a1, a2, a3, a4, a5, a6, a7]


def _node_view(node: _Node, now_ms: int, window_ms: int, stale_after_ms: int) -> NodeView:
    """The node as policies see it at ``now_ms``; equal, field for field, to ``NodeView(...)`` built
    with keywords (``tests/unit/test_model.py`` checks it)."""
    t = node.telemetry
    w = node_totals(node.win, now_ms, window_ms)
    age = max(0, now_ms - t.ts_ms)
    values = (
        t.node_id,
        t.pool_id,
        t.model,
        t.gpu_type,
        t.gpu_count,
        t.weights_state,
        t.draining,
        t.ts_ms,
        age,
        age > stale_after_ms,
        t.queue_depth,
        t.running_requests,
        t.queued_prompt_tokens,
        t.kv_cache_used_frac,
        t.hbm_free_gib,
        t.gpu_util_frac,
        t.prefix_cache_hit_frac,
        t.hot_prefixes,
        t.ttft_p50_ms,
        t.ttft_p99_ms,
        t.tbt_p50_ms,
        t.tbt_p99_ms,
        t.max_batch_tokens,
        t.cost_rate_usd_per_h,
        int(w[_N_REQ]),
        int(w[_N_OK]),
        int(w[_N_FAIL]),
        node.consecutive_failures,
        (w[_N_TTFT_SUM] / w[_N_TTFT_N]) if w[_N_TTFT_N] else None,
        int(w[_N_ERR]),
        int(w[_N_TO]),
        int(w[_N_PRE]),
    )
    view = _new(NodeView)
    for setter, value in zip(_NODE_VIEW_SETTERS, values, strict=True):
        setter(view, value)
    return view


def node_view_plain(node: _Node, now_ms: int, window_ms: int, stale_after_ms: int) -> NodeView:
    """:func:`_node_view` as a plain keyword construction (what the tests hold the fast one to)."""
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
        requests_w=int(w[_N_REQ]),
        ok_w=int(w[_N_OK]),
        failures_w=int(w[_N_FAIL]),
        consecutive_failures=node.consecutive_failures,
        ttft_mean_ms_w=(w[_N_TTFT_SUM] / w[_N_TTFT_N]) if w[_N_TTFT_N] else None,
        node_errors_w=int(w[_N_ERR]),
        node_timeouts_w=int(w[_N_TO]),
        preemptions_w=int(w[_N_PRE]),
    )


def snapshot_plain(
    model: FleetModel, now_ms: int, *, window_ms: int = 10_000, stale_after_ms: int = 5_000
) -> FleetSnapshot:
    """:func:`snapshot` as its plain statement: one :class:`NodeView` per node in a dict, every
    window summed on its own (what the tests hold the columnar snapshot to, bit for bit)."""
    forget = model.config.forget_node_after_ms
    nodes = {
        node_id: _node_view(model.nodes[node_id], now_ms, window_ms, stale_after_ms)
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
        ids = tuple(by_pool.get(pool_id, ()))
        first = nodes[ids[0]] if ids else None
        pools[pool_id] = PoolView(
            pool_id=pool_id,
            model=first.model if first else "",
            gpu_type=first.gpu_type if first else "",
            node_ids=ids,
            requests_w=int(w[_P_REQ]),
            ok_w=int(w[_P_OK]),
            failures_w=int(w[_P_FAIL]),
            retries_w=int(w[_P_RETRY]),
            shed_w=int(w[_P_SHED]),
            request_rate_per_s=w[_P_REQ] / seconds,
            retry_rate_per_s=w[_P_RETRY] / seconds,
            ttft_p50_ms_w=quantile_from_bins(hist, 0.50),
            ttft_p99_ms_w=quantile_from_bins(hist, 0.99),
            prompt_tokens_rate_per_s=w[_P_PROMPT] / seconds,
            output_tokens_rate_per_s=w[_P_OUT] / seconds,
            requests_by_priority_w={p: int(n) for p, n in enumerate(prio) if n > 0},
            tasks_ended_w=int(tasks[0]),
            tasks_lost_w=int(tasks[1]),
            diverted_tokens_rate_per_s=diverted[0] / seconds,
            open_workflows=pool.wf_open,
            workflows_started=pool.wf_started,
            workflows_ended=pool.wf_ended,
            tasks_failed=pool.wf_failed,
        )
    tenants: dict[str, TenantView] = {}
    for tenant_id in sorted(model.tenants):
        tenant = model.tenants[tenant_id]
        w = tenant.win.total(now_ms, window_ms)
        tenants[tenant_id] = TenantView(
            tenant_id, tenant.priority, int(w[_T_REQ]), int(w[_T_RETRY]), int(w[_T_SHED])
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
            fleet_cost_usd=ledger.fleet_cost_nusd / NANO,
            spend_on_failed_usd=ledger.spend_on_failed_nusd / NANO,
        ),
    )


def _ledger_view(model: FleetModel) -> LedgerView:
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
    their newest telemetry's numbers; valid while ``FleetModel._nodes_changed`` stays at ``changed``.

    ``numbers[r]`` is :func:`~fleetloop.policies.columns.tel_numbers` of ``held[r]``, the record
    it was read from (None: not read). The batch fold reads the records it makes a node's newest
    (:meth:`take`, one array write per batch), so the snapshot reads only the rows whose newest
    record is not the one held (:meth:`numbers_of`): the check is by identity, so a record folded
    any other way (one at a time, a restore) is read there, and nothing else is trusted."""

    __slots__ = (
        "bounds",
        "changed",
        "held",
        "ids",
        "index",
        "nodes",
        "numbers",
        "pool_ids",
        "sorted_ids",
        "windows",
    )

    def __init__(self, model: FleetModel, before: _NodeRows | None = None) -> None:
        self.changed = model._nodes_changed
        items = sorted(model.nodes.items(), key=lambda kv: (kv[1].telemetry.pool_id, kv[0]))
        self.ids = [k for k, _ in items]
        self.nodes = [v for _, v in items]
        self.index = {k: i for i, k in enumerate(self.ids)}
        self.sorted_ids = sorted(self.ids)
        self.pool_ids, self.bounds = _pool_bounds([n.telemetry.pool_id for n in self.nodes])
        self.windows = WindowColumns([n.win for n in self.nodes], 8)
        n = len(self.ids)
        # Row ``n`` is spare: what :meth:`take` reads for a node not in these rows lands there. One
        # row per node (a fold writes whole rows; the snapshot hands the table its transpose).
        self.numbers: npt.NDArray[np.float64] = np.zeros((n + 1, N_TEL), dtype=np.float64)
        self.held: list[object] = [None] * (n + 1)
        if before is not None:  # keep the rows already read of the nodes still here
            was = before.index
            pairs = [(r, i) for r, k in enumerate(self.ids) if (i := was.get(k)) is not None]
            if pairs:
                to, fro = zip(*pairs, strict=True)
                self.numbers[list(to)] = before.numbers[list(fro)]
                held, old = self.held, before.held
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
    """The model's pools in id order and their five windows' columns, valid while the model holds
    these same pool objects."""

    __slots__ = ("by_priority", "diverted", "ids", "pools", "tasks", "ttft", "win")

    def __init__(self, ids: list[str], pools: list[_Pool]) -> None:
        self.ids = ids
        self.pools = pools
        self.win = WindowColumns([p.win for p in pools], 7)
        self.ttft = WindowColumns([p.ttft for p in pools], N_LAT_BINS)
        self.by_priority = WindowColumns([p.by_priority for p in pools], N_PRIORITIES)
        self.tasks = WindowColumns([p.tasks for p in pools], 2)
        self.diverted = WindowColumns([p.diverted for p in pools], 1)

    def columns(self) -> tuple[WindowColumns, ...]:
        return (self.win, self.ttft, self.by_priority, self.tasks, self.diverted)


class _Snapshots:
    """What :func:`snapshot` keeps between ticks: the row layouts and the windows' bucket arrays."""

    __slots__ = ("nodes", "pools")

    def __init__(self) -> None:
        self.nodes: _NodeRows | None = None
        self.pools: _PoolRows | None = None


_NODE_ID = attrgetter("node_id")


def _pool_bounds(row_pools: Sequence[str]) -> tuple[tuple[str, ...], dict[str, tuple[int, int]]]:
    """The pools of rows grouped by pool (in order), and each one's (first row, end row)."""
    bounds: dict[str, tuple[int, int]] = {}
    start = 0
    for i in range(1, len(row_pools) + 1):
        if i == len(row_pools) or row_pools[i] != row_pools[start]:
            bounds[row_pools[start]] = (start, i)
            start = i
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
    model: FleetModel, now_ms: int, *, window_ms: int = 10_000, stale_after_ms: int = 5_000
) -> FleetSnapshot:
    """Freeze the model as policies see it at event time ``now_ms``.

    The same snapshot as :func:`snapshot_plain`, value for value and bit for bit, built as columns:
    ``nodes`` is a :class:`~fleetloop.policies.columns.NodeTable` (views built when asked for),
    every node's and every pool's window totals are summed for all of them at once
    (:class:`~fleetloop.core.model.windows.WindowColumns`, re-reading only the buckets folded
    into since the last snapshot), and the row order is kept until a node arrives, leaves or moves.
    """
    if not -_NEVER < now_ms < _NEVER:
        return snapshot_plain(model, now_ms, window_ms=window_ms, stale_after_ms=stale_after_ms)
    kept = model._snapshots
    if kept is None:
        kept = model._snapshots = _Snapshots()
    written, evicted = model._written_from, model._evicted_below
    node_written = model._node_written_from
    model._written_from = model._node_written_from = _NEVER
    # Nodes.
    rows = kept.nodes
    if rows is not None:
        rows.windows.forget(node_written, evicted)
    if rows is None or rows.changed != model._nodes_changed or len(rows.ids) != len(model.nodes):
        before = rows
        rows = kept.nodes = _NodeRows(model, before)
        if before is not None:  # keep what was read for the nodes still here
            rows.windows.carry(before.windows, [n.win for n in rows.nodes], [n.win for n in before.nodes])
    tels = [n.telemetry for n in rows.nodes]
    numbers = rows.numbers_of(tels)  # the fold may write it on while policies read: a copy
    consecutive = [n.consecutive_failures for n in rows.nodes]
    ts = np.array([t.ts_ms for t in tels], dtype=np.int64)
    totals = rows.windows.totals(now_ms, window_ms)
    live = (now_ms - ts) <= model.config.forget_node_after_ms
    if live.all():
        table = NodeTable(
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
    else:  # some nodes are past forget_node_after_ms at this now: the rows of the others
        keep = np.flatnonzero(live).tolist()
        ids = [rows.ids[i] for i in keep]
        tels = [tels[i] for i in keep]
        row_pools, row_bounds = _pool_bounds([t.pool_id for t in tels])
        table = NodeTable(
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
    # Pools.
    pool_ids = sorted(model.pools)
    pool_objs = [model.pools[p] for p in pool_ids]
    prows = kept.pools
    if prows is None or len(prows.pools) != len(pool_objs) or any(map(_differ, prows.pools, pool_objs)):
        prows = kept.pools = _PoolRows(pool_ids, pool_objs)
    else:
        for columns in prows.columns():
            columns.forget(written, evicted)
    w_all = prows.win.totals(now_ms, window_ms)
    hist = prows.ttft.totals(now_ms, window_ms)
    prio_all = prows.by_priority.totals(now_ms, window_ms).tolist()
    tasks_all = prows.tasks.totals(now_ms, window_ms).tolist()
    diverted_all = prows.diverted.totals(now_ms, window_ms).tolist()
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
            prompt_tokens_rate_per_s=w[_P_PROMPT] / seconds,
            output_tokens_rate_per_s=w[_P_OUT] / seconds,
            requests_by_priority_w={p: int(n) for p, n in enumerate(prio) if n > 0},
            tasks_ended_w=int(tasks[0]),
            tasks_lost_w=int(tasks[1]),
            diverted_tokens_rate_per_s=diverted_all[k][0] / seconds,
            open_workflows=pool.wf_open,
            workflows_started=pool.wf_started,
            workflows_ended=pool.wf_ended,
            tasks_failed=pool.wf_failed,
        )
    tenants: dict[str, TenantView] = {}
    for tenant_id in sorted(model.tenants):
        tenant = model.tenants[tenant_id]
        tw = tenant.win.total(now_ms, window_ms)
        tenants[tenant_id] = TenantView(
            tenant_id, tenant.priority, int(tw[_T_REQ]), int(tw[_T_RETRY]), int(tw[_T_SHED])
        )
    return FleetSnapshot(
        now_ms=now_ms,
        window_ms=window_ms,
        nodes=table,
        pools=pools,
        tenants=tenants,
        ledger=_ledger_view(model),
    )


def _differ(a: object, b: object) -> bool:
    return a is not b
