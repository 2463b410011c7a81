"""The policy contract: what every algorithm sees (a frozen snapshot), what it returns, and how it
names itself. Pure: nothing here does I/O or reads a clock.

An algorithm is one module with one class, listed in the table of :mod:`fleetloop.policies.builtin`::

    class ConsecutiveErrors:
        name = "consecutive-errors"               # kebab-case, unique in its section
        section = "breaker"
        Params = ConsecutiveErrorsParams          # pydantic model, frozen, extra="forbid"
        State = ...                               # any immutable value
        def initial_state(self) -> State: ...
        def decide(self, snap, params, state, ctx) -> PolicyResult[State]: ...

``decide`` is a pure function of (snapshot, params, state, ctx). ``ctx.now_ms`` is the tick's event
time; randomness, if any, comes from ``ctx.rng`` (seeded by the engine from the tick).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from fleetloop.policies.slo import DEFAULT_BOOK, Slo, SloBook
from fleetloop.schemas.decisions import BreakerDecision, DecisionBody

S = TypeVar("S")
P = TypeVar("P", bound=BaseModel)


class Params(BaseModel):
    """Base for every algorithm's parameters: frozen, strict about unknown keys, finite numbers only
    (a YAML ``.inf`` or ``.nan`` is refused like any other out-of-range value)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as of ``now_ms``: its newest telemetry plus router-observed figures over the window.

    ``stale`` is true when the newest telemetry is older than the engine's stale threshold; the
    engine treats a stale node as saturated (the safety envelope).
    """

    node_id: str
    pool_id: str
    model: str
    gpu_type: str
    gpu_count: int
    weights_state: str
    draining: bool
    last_seen_ms: int
    age_ms: int
    stale: bool
    queue_depth: int
    running_requests: int
    queued_prompt_tokens: int
    kv_cache_used_frac: float
    hbm_free_gib: float
    gpu_util_frac: float
    prefix_cache_hit_frac: float
    hot_prefixes: tuple[str, ...]
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tbt_p50_ms: float | None
    tbt_p99_ms: float | None
    max_batch_tokens: int
    cost_rate_usd_per_h: float
    # Router-observed over the window (calls placed on this node):
    requests_w: int
    ok_w: int
    failures_w: int  # error + timeout + retry outcomes
    consecutive_failures: int
    ttft_mean_ms_w: float | None
    # Node-reported counters over the window:
    node_errors_w: int
    node_timeouts_w: int
    preemptions_w: int
    # The serving engine the node reports (``NodeTelemetry.engine``; None: not reported).
    engine: str | None = None

    @property
    def warm(self) -> bool:
        return self.weights_state == "warm" and not self.draining


@dataclass(frozen=True, slots=True)
class PoolView:
    """One pool as of ``now_ms``, over the window (router outcomes of calls routed to this pool)."""

    pool_id: str
    model: str
    gpu_type: str
    node_ids: tuple[str, ...]
    requests_w: int
    ok_w: int
    failures_w: int
    retries_w: int
    shed_w: int
    request_rate_per_s: float
    retry_rate_per_s: float
    ttft_p50_ms_w: float | None
    ttft_p99_ms_w: float | None
    prompt_tokens_rate_per_s: float
    output_tokens_rate_per_s: float
    # Calls routed to this pool over the window, by priority class (classes with calls only).
    requests_by_priority_w: Mapping[int, int] = field(default_factory=dict)
    # Tasks whose last call ended on this pool over the window, and those of them that failed for
    # a reason other than our own shedding (timeouts, errors, refused retries): tasks lost here.
    tasks_ended_w: int = 0
    tasks_lost_w: int = 0
    # Tokens per second of calls the router moved from this pool to a pool of another model the
    # caller accepts (its model spill): demand this pool's size should still carry.
    diverted_tokens_rate_per_s: float = 0.0
    # The workflow ledger split by pool, cumulative since the start: open tasks that have called
    # this pool, tasks that first called it, those of them that ended here or elsewhere (or were
    # let go as handed off), and tasks whose final call was here and failed (our sheds included).
    open_workflows: int = 0
    workflows_started: int = 0
    workflows_ended: int = 0
    tasks_failed: int = 0
    # ``prompt_tokens_rate_per_s`` / ``output_tokens_rate_per_s`` was taken from the nodes' own counts
    # (``NodeTelemetry.prompt_tokens`` / ``output_tokens``) because the window's ok outcomes carried
    # no such tokens (fleetloop.core.model.snapshot).
    prompt_from_nodes: bool = False
    output_from_nodes: bool = False


@dataclass(frozen=True, slots=True)
class TenantView:
    tenant_id: str
    priority: int
    requests_w: int
    retries_w: int
    shed_w: int


@dataclass(frozen=True, slots=True)
class LedgerView:
    """The workflow ledger behind cost per successful task, over the whole run so far."""

    tasks_started: int
    tasks_succeeded: int
    tasks_failed: int
    active_workflows: int
    fleet_cost_usd: float
    spend_on_failed_usd: float

    @property
    def cost_per_successful_task_usd(self) -> float | None:
        return self.fleet_cost_usd / self.tasks_succeeded if self.tasks_succeeded else None


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """The frozen decision input of one tick. Mappings iterate in sorted key order.

    ``nodes`` is any mapping of node id to :class:`NodeView`. The daemon's model hands a
    :class:`fleetloop.policies.columns.NodeTable`, which builds a view only when one is asked for;
    a policy that judges every node reads :func:`fleetloop.policies.columns.fleet_columns` instead
    (one array per field for the whole fleet, without a view per node)."""

    now_ms: int
    window_ms: int
    nodes: Mapping[str, NodeView]
    pools: Mapping[str, PoolView]
    tenants: Mapping[str, TenantView]
    ledger: LedgerView
    # Figures derived from this snapshot alone, computed once and shared by every pool's tick
    # (e.g. the pools' spill-over headroom). Only pure functions of the snapshot may fill it.
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    def pool_nodes(self, pool_id: str) -> tuple[NodeView, ...]:
        """The pool's nodes, sorted by node id (built once per pool and snapshot)."""
        key = ("pool_nodes", pool_id)
        found: tuple[NodeView, ...] | None = self.memo.get(key)
        if found is None:
            table_views = getattr(self.nodes, "pool_views", None)  # a NodeTable: its pool's rows
            if table_views is not None:
                found = self.memo[key] = table_views(pool_id)
                return found
            pool = self.pools.get(pool_id)
            ids = pool.node_ids if pool is not None else ()
            nodes = self.nodes
            found = self.memo[key] = tuple(nodes[i] for i in ids if i in nodes)
        return found


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """Everything a decision may depend on besides the snapshot, params and its own state."""

    now_ms: int
    tick_id: int
    tick_ms: int
    pool_id: str
    # The seed of this tick's generator (the engine uses (tick id, crc32 of the pool id)).
    seed: tuple[int, ...]
    # Breaker decisions already taken this tick (the engine runs the breaker first), by node id.
    breakers: Mapping[str, BreakerDecision] = field(default_factory=dict)
    # The policy's SLO classes (``spec.slo``): the only source of latency objectives.
    slo: SloBook = DEFAULT_BOOK
    # The pool's drain list as the engine holds it from its earlier ticks (every node asked to drain
    # that is not gone yet, nor taken back: ``fleetloop.core.decide.shaping.keep_draining``). An
    # autoscaler counts these as leaving, whatever their own telemetry says yet.
    draining: tuple[str, ...] = ()
    _rng: list[np.random.Generator] = field(default_factory=list, compare=False, repr=False)

    @property
    def rng(self) -> np.random.Generator:
        """The generator seeded by ``seed``, fresh for each context, built on first use: most
        algorithms draw nothing, and seeding one costs tens of microseconds per section and pool."""
        if not self._rng:
            self._rng.append(np.random.default_rng(list(self.seed)))
        return self._rng[0]

    def pool_slo(self, snap: FleetSnapshot, pool_id: str | None = None) -> Slo:
        """The SLO ``pool_id`` (this tick's pool by default) is judged by: the strictest among the
        classes of the calls it served in the window (:meth:`SloBook.served`)."""
        pid = self.pool_id if pool_id is None else pool_id
        # Five sections of a pool's tick ask: read once per snapshot, pool and book (the book is kept
        # beside the answer, so its id is not reused while the snapshot lives).
        key = ("pool_slo", pid, id(self.slo))
        found = snap.memo.get(key)
        if found is not None and found[0] is self.slo:
            return found[1]  # type: ignore[no-any-return]
        pool = snap.pools.get(pid)
        if pool is None:
            slo = self.slo.served({}, pool=pid)
        else:
            slo = self.slo.served(pool.requests_by_priority_w, model=pool.model, pool=pid)
        snap.memo[key] = (self.slo, slo)
        return slo


@dataclass(frozen=True, slots=True)
class PolicyResult(Generic[S]):
    """What one algorithm returns for one tick: decisions, its next state, and figures for logs."""

    decisions: tuple[DecisionBody, ...]
    state: S
    diagnostics: Mapping[str, float] = field(default_factory=dict)


class Algorithm(Protocol):
    """A registered algorithm. ``Params`` validates the document's ``params`` section."""

    name: ClassVar[str]
    section: ClassVar[str]
    Params: ClassVar[type[Params]]

    def initial_state(self) -> Any: ...

    def decide(
        self, snap: FleetSnapshot, params: Any, state: Any, ctx: PolicyContext
    ) -> PolicyResult[Any]: ...


class BatchAlgorithm(Algorithm, Protocol):
    """An algorithm that may also decide many pools in one call (optional: the engine calls
    ``decide_pools`` when an algorithm has it, else loops over ``decide``).

    ``decide_pools(snap, params, states, ctxs)`` returns one result per context, equal element for
    element and bit for bit (decisions, state, diagnostics) to
    ``[self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]``. The engine
    gives the contexts in pool-id order, one per pool (distinct pool ids), all with the same
    ``now_ms``, ``tick_id``, ``tick_ms`` and ``slo``, each with its own ``seed`` and ``breakers``.
    State stays per pool (the engine keeps and checkpoints it per pool). ``decide`` stays the
    statement of the rule; a test holds the two equal."""

    def decide_pools(
        self,
        snap: FleetSnapshot,
        params: Any,
        states: Sequence[Any],
        ctxs: Sequence[PolicyContext],
    ) -> list[PolicyResult[Any]]: ...


def r6(x: float) -> float:
    """Round for the wire: decisions are compared byte for byte across replays."""
    return round(float(x), 6)


# Below 2**30 an ulp of x * 1e6 is at most 2**-22, far inside the margin R6_MARGIN.
_R6_LIMIT = float(2**30)
R6_MARGIN = 1e-6


def r6_array(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """:func:`r6` of every element, the same doubles (``round`` is correctly rounded; ``np.round``
    is not). ``round(x, 6)`` is the double nearest the decimal ``k / 10**6``, ``k`` the integer
    nearest ``x * 10**6`` (ties to even). ``y = x * 1e6`` is within half an ulp of that product, so
    ``np.rint(y)`` is that ``k`` wherever ``y`` is not within ``R6_MARGIN`` of a half-integer (and
    small enough for an ulp to be far below it), and ``k / 1e6`` (both exact, the quotient correctly
    rounded) is the double nearest ``k / 10**6``. (Strictly, ``rint`` can only be wrong where ``y`` is
    exactly a half-integer, since ``y`` is the double nearest the product; the margin is wider on
    purpose.) Every other element (near a tie, huge, NaN, inf)
    goes through ``round`` itself. ``tests/unit/test_r6_array.py`` holds it to ``round`` on hostile
    values, near ties included."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = x * 1e6
        out: npt.NDArray[np.float64] = np.rint(y) / 1e6
        sure = (np.abs(y) < _R6_LIMIT) & (np.abs(y - np.floor(y) - 0.5) > R6_MARGIN)
    if not sure.all():
        for i in np.flatnonzero(~sure).tolist():
            out[i] = round(float(x[i]), 6)
    return out
