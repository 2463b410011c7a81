"""The fleet model's state: what it keeps, its clocks, its caps and what it evicts.

What it keeps:
- per node: the newest telemetry (by ``ts_ms``), router-observed calls in event-time buckets
  (requests, ok, failures, TTFT sum and count), node-reported errors/timeouts/preemptions, and the
  run of consecutive failed calls (in the order the router reported them: one pool is one
  partition, so that order is the same in a replay). A shed call is not a node's: it counts in its
  pool's and tenant's windows only, even when its record names a node, so no breaker or ejection
  cap reads a router's own sheds (or HAProxy's 503 with no server left) as evidence against a node;
- per pool: calls, outcomes, tokens and a TTFT histogram in event-time buckets, and the prompt
  and output tokens its nodes report (read when its routers' outcomes carry none);
- per tenant: calls, retries, sheds;
- the workflow ledger (:mod:`fleetloop.core.model.ledger`): every task's calls, attempts and spend,
  its outcome when the last call says so, and the fleet's cost (each telemetry interval x the
  node's price), which together give cost per successful task.

Order independence: the state after folding a set of records does not depend on how partitions
interleaved (only on each partition's own order), which is what exact replay relies on. So money is
summed in integer nano-dollars (float sums depend on order), a node leaves the snapshot when its own
telemetry is older than ``forget_node_after_ms`` at the snapshot's ``now_ms`` (not when a shared
watermark happens to pass), and memory is reclaimed only well behind the retention horizon.

Checkpoint names. The checkpoint codec names a state class by ``module:qualname``; the classes here
keep the module they were first checkpointed under (``fleetloop.core.model.fleet``, which re-exports
them), so a checkpoint restores across this module layout in either direction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Protocol

from fleetloop.core.model.windows import BUCKET_MS, N_LAT_BINS, Window
from fleetloop.schemas.fast import OutcomeRec, Telemetry, TelemetryRec
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

_CHECKPOINT_MODULE = "fleetloop.core.model.fleet"  # see "Checkpoint names" above


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
    # the open tasks as demand still ahead (docs/decisions/core.md: why 120 s).
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
    # Prompt and output tokens the pool's nodes report (``NodeTelemetry.prompt_tokens`` and
    # ``output_tokens``, counts per telemetry interval), in the bucket of the record's stamp: the
    # pool's token rates when its routers' outcomes carry none (a router that logs calls but not
    # their lengths).
    node_tokens: Window = field(default_factory=lambda: Window(2))
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
_MAX_USD = _MAX_NUSD / NANO  # nano_usd's clamp in dollars (the batch fold inlines it)

# Why an outcome was folded without a part of it (a partial cap): the record is dead-lettered all
# the same, so an operator sees which records met a full cap (the open-workflow cap refuses nothing:
# it lets the earliest-opened task go).
PARTIAL_TENANTS = "capacity-tenants: tenant cap reached; the record was folded without its tenant"
PARTIAL_UNPLACED = (
    "capacity-unplaced-nodes: cap on nodes without telemetry reached; its node window was not kept"
)
PARTIAL = frozenset({PARTIAL_TENANTS, PARTIAL_UNPLACED})


def nano_usd(usd: float) -> int:
    """Dollars as integer nano-dollars, clamped to [0, 1e9 USD] (never OverflowError, NaN is 0)."""
    if not usd > 0.0:  # also NaN
        return 0
    if usd >= _MAX_USD:
        return _MAX_NUSD
    return round(usd * NANO)


# How far apart one open task's consecutive calls in a shard were, in buckets with these upper
# edges (and one beyond them all): the ledger learns its handoff horizon from it.
GAP_EDGES_MS = (1_000, 2_000, 5_000, 10_000, 20_000, 30_000, 60_000, 120_000, 300_000, 600_000)


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


for _cls in (_Node, _Pool, _Tenant, _Workflow, _Ledger):
    _cls.__module__ = _CHECKPOINT_MODULE

CAPPED = ("pools", "nodes", "tenants", "workflows", "unplaced_nodes")


class KeptNodeRows(Protocol):
    """What the folds tell the snapshot's kept node rows (:mod:`fleetloop.core.model.snapshot`)."""

    def take(self, items: Sequence[object | None]) -> None: ...

    def refresh(self, ids: Sequence[str], buckets: Sequence[int]) -> bool: ...


class KeptSnapshots(Protocol):
    """What the snapshot keeps between ticks, as the folds see it."""

    @property
    def nodes(self) -> KeptNodeRows | None: ...


class ModelState:
    """The model's containers, its clocks and caps; the folds (:mod:`fleetloop.core.model.fold`)
    and the ledger (:mod:`fleetloop.core.model.ledger`) build on it, and
    :class:`fleetloop.core.model.fleet.FleetModel` is the three together.

    Clocks: each pool has its own event-time watermark (the newest ``ts_ms`` of its own records),
    which drives that pool's late-record rule and the eviction of its windows and nodes, so one
    record stamped far ahead moves one pool's clock at most, never another's. Fleet-wide state
    (tenants, the workflow ledger, outcomes on nodes without telemetry) follows the fleet clock,
    the upper median of the pools' watermarks: one pool running ahead cannot move it (with three
    pools or more), and one silent pool cannot stop it. A pool silent for the retention plus
    ``forget_node_after_ms`` on the fleet clock is evicted.

    Caps (:class:`ModelConfig`): a record that would add a pool or a node beyond its cap, when no
    silent one can make room, is refused: the fold returns the reason and nothing of it is
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
    # What the snapshot keeps between ticks (``_snapshots``) and the marks the fold leaves it,
    # derived from the rest and never checkpointed: ``_written_from`` the lowest bucket of a pool's
    # window folded into since the last snapshot, ``_node_written_from`` the same for the nodes'
    # windows (the batch folds re-read what they wrote into the snapshot's kept node columns
    # instead), ``_evicted_below`` the highest eviction horizon, ``_nodes_changed`` counts node
    # arrivals, departures and moves. A model decoded from a checkpoint gets these values (plain
    # data the decoder sets, no code of ours): everything written, nothing kept. (Not a
    # ``__getattr__`` fallback: a class with one loses Python's fast attribute access, which would
    # cost every ``self.`` in the fold.)
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
        self._snapshots: KeptSnapshots | None = None

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

    def _evict_pool(self, pool_id: str, pool: _Pool, horizon_bucket: int) -> None:
        """The pool's own clock moved on: drop its old buckets and its nodes silent too long."""
        pool.evicted_to = horizon_bucket
        self._evicted_below = max(self._evicted_below, horizon_bucket)
        pool.win.evict_before(horizon_bucket)
        pool.ttft.evict_before(horizon_bucket)
        pool.by_priority.evict_before(horizon_bucket)
        pool.tasks.evict_before(horizon_bucket)
        pool.diverted.evict_before(horizon_bucket)
        pool.node_tokens.evict_before(horizon_bucket)
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
