"""latency-outlier stated over each pool's nodes one by one: the test oracle of
:mod:`fleetloop.policies.breaker.latency_outlier`, whose columnar forms compute the same verdicts as
array operations over the snapshot's columns. The same arithmetic on the same doubles, in the same
order where order matters (a family stops at its first flagged signal, so a later signal's ratio does
not enter the severity); it shares the rule's state machines and decisions."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from fleetloop.policies.base import FleetSnapshot, NodeView, PolicyContext, PolicyResult, r6
from fleetloop.policies.breaker.consecutive_errors import step
from fleetloop.policies.breaker.emission import change_only
from fleetloop.policies.breaker.latency_outlier.params import (
    MAD_SCALE,
    SIGNALS,
    TBT_SIGNALS,
    TTFT_SIGNALS,
    LatencyOutlierParams,
)
from fleetloop.policies.breaker.latency_outlier.rule import (
    NodeState,
    State,
    Verdict,
    _eject_within_cap,
    _latency_step,
    _with,
    failing_with_pool,
    failure_share,
    node_decision,
    serving,
)
from fleetloop.policies.memory import PoolMemory, median_sorted
from fleetloop.policies.slo import DEFAULT_BOOK, Slo
from fleetloop.schemas.base import MAX_FIGURE
from fleetloop.schemas.decisions import BreakerDecision
from tests.oracles.window import kept

Obs = tuple[tuple[int, float | None, float | None, float | None, float | None], ...]


def _value(node: NodeView, signal: str) -> float | None:
    v: float | None = getattr(node, signal)
    return v if v is not None and math.isfinite(v) and v >= 0 else None


def figures_now(node: NodeView) -> tuple[float | None, float | None, float | None, float | None] | None:
    """This tick's figures of a serving node, if it has any (what the memory adds)."""
    if node.weights_state == "warm" and not node.draining and not node.stale:
        vals = (
            _finite(node.tbt_p50_ms),
            _finite(node.tbt_p99_ms),
            _finite(node.ttft_mean_ms_w),
            _finite(node.ttft_p99_ms),
        )
        if vals != (None, None, None, None):
            return vals
    return None


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) and v >= 0 else None


def _remembered(obs: Obs, node: NodeView, now: int, memory_ms: int) -> Obs:
    """The memory kept (``0 < now - ts < memory_ms``, :func:`tests.oracles.window.kept`) plus this
    tick's figures, if any."""
    within = kept(obs, now, memory_ms)
    vals = figures_now(node)
    return (*within, (now, *vals)) if vals is not None else within


def aggregate(obs: Obs, min_samples: int) -> dict[str, float]:
    """Signal -> the median of the node's remembered figures, for signals with enough of them (the
    plain form of :func:`advance` and :func:`medians`, which the tests hold them to)."""
    out: dict[str, float] = {}
    if not obs or len(obs) < min_samples:
        return out
    columns = tuple(zip(*obs, strict=True))
    for i, s in enumerate(SIGNALS):
        col = columns[i + 1]
        xs = sorted([v for v in col if v is not None] if None in col else col)
        if xs and len(xs) >= min_samples:
            out[s] = median_sorted(xs)
    return out


def advance(mem: PoolMemory, pool: Sequence[NodeView], now: int, memory_ms: int) -> PoolMemory:
    """The pool's memory after this tick (:meth:`PoolMemory.advance`): what :func:`_remembered`
    keeps for each node, for the whole pool at once."""
    rows: list[int] = []
    figs: list[tuple[float | None, ...]] = []
    for r, n in enumerate(pool):
        f = figures_now(n)
        if f is not None:
            rows.append(r)
            figs.append(f)
    return mem.advance(tuple(n.node_id for n in pool), now, memory_ms, rows, figs)


def reference(values: list[float], min_hosts: int) -> tuple[float, float] | None:
    """``(median, MAD)`` over the pool's nodes, or None with fewer than ``min_hosts`` figures."""
    xs = sorted(values)
    if len(xs) < min_hosts:
        return None
    m = median_sorted(xs)
    return m, median_sorted(sorted(abs(x - m) for x in xs))


def judge(
    node: NodeView,
    agg: Mapping[str, float],
    refs: Mapping[str, tuple[float, float] | None],
    params: LatencyOutlierParams,
    slo: Slo = DEFAULT_BOOK.default,
) -> Verdict:
    tbt_floor = params.tbt_floor_frac * slo.tbt_ms
    ttft_floor = params.ttft_floor_frac * slo.ttft_ms
    return _judge(node, agg, limits(refs, params), tbt_floor, ttft_floor)


Limits = Mapping[str, tuple[float, float, float]]


def limits(refs: Mapping[str, tuple[float, float] | None], params: LatencyOutlierParams) -> Limits:
    """Signal -> (median m, ``ratio * m``, ``m + k * 1.4826 * MAD``): the pool's bounds, once per tick."""
    out: dict[str, tuple[float, float, float]] = {}
    for s, ref in refs.items():
        if ref is not None:
            m, mad = ref
            out[s] = (m, params.ratio * m, m + params.k * MAD_SCALE * mad)
    return out


def _family(
    signals: tuple[str, ...], values: Mapping[str, float], lims: Limits, floor: float, severity: float
) -> tuple[str, float]:
    """A family's status (flagged, clear or nodata) and the severity seen so far."""
    status = "nodata"
    for s in signals:
        lim = lims.get(s)
        x = values.get(s)
        if lim is None or x is None:
            continue
        m, above_ratio, above_mad = lim
        if m > 0:
            severity = max(severity, x / m)
        if x >= above_ratio and x >= above_mad and x - m >= floor:
            return "flagged", severity
        status = "clear"
    return status, severity


def _judge(
    node: NodeView, agg: Mapping[str, float], lims: Limits, tbt_floor: float, ttft_floor: float
) -> Verdict:
    tbt, severity = _family(TBT_SIGNALS, agg, lims, tbt_floor, 0.0)
    if tbt == "flagged":
        # A fresh step time that is fine clears the node at once: the remembered median outlives
        # the episode (a long prefill) that raised it.
        now_figures = {sig: v for sig in TBT_SIGNALS if (v := _value(node, sig)) is not None}
        if now_figures:
            fresh, severity = _family(TBT_SIGNALS, now_figures, lims, tbt_floor, severity)
            if fresh == "clear":
                tbt = "clear"
    ttft, severity = _family(TTFT_SIGNALS, agg, lims, ttft_floor, severity)
    if ttft == "nodata" and node.ttft_mean_ms_w is None and node.node_timeouts_w > 0:
        ttft = "flagged"  # calls went in, no first token came out, the node timed them out
    # Capped at MAX_FIGURE: a node reporting a step time of 1e308 (the schema accepts it) made its
    # severity leave the decision's bounds and refused the pool's whole breaker tick. Only the order
    # among such nodes (then by node id) and the published figure change.
    return Verdict(tbt, ttft, min(severity, MAX_FIGURE))


def pool_failure_frac(pool: Sequence[NodeView], streak: int) -> float:
    """The pool's failure level: the median failure share over its serving nodes that took calls
    in the window and are not in a failure streak themselves (``consecutive_failures < streak``,
    the error machine's threshold); over every serving node that took calls when all are.

    The nodes in a streak are the candidates being judged, so they are not their own evidence: when
    three of a pool's six busy nodes crash, the window still holds their successes from before the
    crash and a median over all six reads the pool as failing with them (host-loss-mid-decode).
    The nodes whose latest calls succeed say whether the failures are everywhere."""
    xs: list[float] = []
    streaking: list[float] = []
    for n in pool:
        if serving(n) and n.requests_w > 0:
            (streaking if n.consecutive_failures >= streak else xs).append(failure_share(n))
    xs = xs or streaking
    if not xs:
        return 0.0
    xs.sort()
    return median_sorted(xs)


def decide(
    snap: FleetSnapshot, params: LatencyOutlierParams, state: State, ctx: PolicyContext
) -> PolicyResult[State]:
    """The rule over the pool's nodes one by one.

    One function of ~100 lines on purpose: the statement the columnar forms are held to, read top
    to bottom in the formula's order (README.md beside the policy)."""
    now = ctx.now_ms
    pool = snap.pool_nodes(ctx.pool_id)
    err_params = params.errors()
    remembered: dict[str, NodeState] = {}
    aggs: dict[str, dict[str, float]] = {}
    memory_ms, min_samples = params.memory_ms, params.min_samples
    known = state.nodes
    memory = advance(state.memory, pool, now, memory_ms)
    meds, oks = memory.medians(min_samples)
    for n, med, ok in zip(pool, meds, oks, strict=True):
        prev = known.get(n.node_id)
        remembered[n.node_id] = prev if prev is not None else NodeState(was_warm=n.warm and not state.started)
        aggs[n.node_id] = {s: m for s, m, y in zip(SIGNALS, med, ok, strict=True) if y} if serving(n) else {}
    refs = {s: reference([a[s] for a in aggs.values() if s in a], params.min_hosts) for s in SIGNALS}
    slo = ctx.pool_slo(snap)
    lims = limits(refs, params)
    tbt_floor = params.tbt_floor_frac * slo.tbt_ms
    ttft_floor = params.ttft_floor_frac * slo.ttft_ms

    stepped: dict[str, NodeState] = {}
    reasons: dict[str, str] = {}
    verdicts: dict[str, Verdict] = {}
    wants: list[tuple[float, str]] = []
    started = state.started
    for n in pool:
        ns = remembered[n.node_id]
        err, err_reason = step(ns.err, n.consecutive_failures, now, err_params)
        # weights just loaded: slow start
        warm = n.warm
        ramp = now if started and warm and not ns.was_warm else ns.ramp_from_ms
        if err is not ns.err or ramp != ns.ramp_from_ms or warm != ns.was_warm:
            ns = _with(ns, err=err, ramp_from_ms=ramp, was_warm=warm)
        v = (
            _judge(n, aggs[n.node_id], lims, tbt_floor, ttft_floor)
            if serving(n)
            else Verdict("nodata", "nodata", 0.0)
        )
        verdicts[n.node_id] = v
        ns, lat_reason, want = _latency_step(ns, v, now, params)
        if want:
            wants.append((-v.severity, n.node_id))
        stepped[n.node_id] = ns
        reasons[n.node_id] = err_reason if err.state != "closed" or err_reason != "healthy" else lat_reason

    open_now = sum(1 for ns in stepped.values() if ns.lat == "open" or ns.err.state == "open")
    over_cap = _eject_within_cap(
        params, len(pool), wants=wants, stepped=stepped, reasons=reasons, open_now=open_now, now=now
    )

    # Panic threshold: too few healthy nodes left means the slowness is the pool's, not a node's.
    live = [n.node_id for n in pool if serving(n)]
    healthy = [
        i
        for i in live
        if stepped[i].lat != "open"
        and stepped[i].err.state != "open"
        and i not in over_cap
        and not verdicts[i].outlier
    ]
    panic = bool(live) and len(healthy) < params.panic_threshold * len(live)
    share = 1.0 / max(1, len(live))
    pool_failing = pool_failure_frac(pool, params.error_threshold)

    decisions: list[BreakerDecision] = []
    new_nodes: dict[str, NodeState] = {}
    for n in pool:
        ns = stepped[n.node_id]
        if ns.ramp_from_ms is not None and now - ns.ramp_from_ms >= params.slow_start_ms:
            ns = _with(ns, ramp_from_ms=None)
        new_nodes[n.node_id] = ns
        decisions.append(
            node_decision(
                n, ns, verdicts[n.node_id], reasons[n.node_id], params,
                now=now, share=share, over_cap=n.node_id in over_cap, panic=panic, pool_id=ctx.pool_id,
                shared=failing_with_pool(n, pool_failing),
            )
        )  # fmt: skip
    diagnostics = {
        "latency_open": float(sum(1 for ns in new_nodes.values() if ns.lat == "open")),
        "error_open": float(sum(1 for ns in new_nodes.values() if ns.err.state == "open")),
        "outliers": float(sum(1 for v in verdicts.values() if v.outlier)),
        "panic": float(panic),
        "pool_failure_frac": r6(pool_failing),
    }
    # Nodes of other pools keep their state (the engine keys state by pool, so there are none).
    emitted, fields = change_only(decisions, state.emitted, ctx.tick_id)
    return PolicyResult(
        decisions=emitted,
        state=State(started=True, nodes=new_nodes, memory=memory, emitted=fields),
        diagnostics=diagnostics,
    )
