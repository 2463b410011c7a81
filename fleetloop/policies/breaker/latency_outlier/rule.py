"""latency-outlier's rule, node by node: the two state machines (latency, and the consecutive-errors
one run alongside), the caps, the panic threshold, the pool-wide failure rule, and the decision each
node gets (README.md beside this file: "Formula"). :func:`pool_tick` is one pool's tick over the
figures :mod:`fleetloop.policies.breaker.latency_outlier.signals` computed for its rows; both columnar
forms (:mod:`fleetloop.policies.breaker.latency_outlier.batch`) call it; :func:`quiet_tick` is what it
gives a pool whose rows have nothing to step, the batch form's shortcut. Pure: no I/O, no clock."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from fleetloop.policies.base import NodeView, r6
from fleetloop.policies.breaker.consecutive_errors import ConsecutiveErrorsParams, NodeBreaker, step
from fleetloop.policies.breaker.emission import (
    KEYFRAME_TICKS,
    Emitted,
    Fields,
    emits,
    fields_of,
    keyframe_residue,
    phase,
)
from fleetloop.policies.breaker.latency_outlier.params import (
    POOL_WIDE_SHARE,
    SIGNALS,
    LatencyOutlierParams,
)
from fleetloop.policies.breaker.latency_outlier.signals import STATUS
from fleetloop.policies.memory import PoolMemory
from fleetloop.schemas.base import MAX_COUNT, MAX_EPOCH_MS, MAX_FIGURE, assemble
from fleetloop.schemas.decisions import BreakerDecision, BreakerStateName


@dataclass(frozen=True, slots=True)
class NodeState:
    err: NodeBreaker = field(default_factory=NodeBreaker)
    lat: BreakerStateName = "closed"
    lat_since_ms: int = 0
    lat_ejections: int = 0
    flagged_ticks: int = 0
    ramp_from_ms: int | None = None
    was_warm: bool = False


def _with(ns: NodeState, **kw: Any) -> NodeState:
    """``dataclasses.replace`` for the hot path (it runs for every node on every tick)."""
    return NodeState(
        kw.get("err", ns.err),
        kw.get("lat", ns.lat),
        kw.get("lat_since_ms", ns.lat_since_ms),
        kw.get("lat_ejections", ns.lat_ejections),
        kw.get("flagged_ticks", ns.flagged_ticks),
        kw.get("ramp_from_ms", ns.ramp_from_ms),
        kw.get("was_warm", ns.was_warm),
    )


def _eject_within_cap(
    params: LatencyOutlierParams,
    pool_size: int,
    *,
    wants: list[tuple[float, str]],
    stepped: dict[str, NodeState],
    reasons: dict[str, str],
    open_now: int,
    now: int,
) -> set[str]:
    """Cap on the share ejected for latency, most severe first: opens the nodes of ``wants``
    (``(-severity, node)``) in ``stepped`` while ``open_now`` stays within
    ``floor(max_ejected_frac x pool_size)``; the rest are named ``:max-ejected`` in ``reasons`` and
    returned."""
    cap = math.floor(params.max_ejected_frac * pool_size + 1e-9)
    over_cap: set[str] = set()
    for _, node_id in sorted(wants):
        ns = stepped[node_id]
        if open_now + 1 <= cap:
            stepped[node_id] = _with(
                ns, lat="open", lat_since_ms=now, lat_ejections=ns.lat_ejections + 1, flagged_ticks=0
            )
            open_now += 1 if ns.err.state != "open" else 0
        else:
            over_cap.add(node_id)
            reasons[node_id] = f"{reasons[node_id]}:max-ejected"
    return over_cap


def _empty_memory() -> PoolMemory:
    return PoolMemory.empty(len(SIGNALS))


@dataclass(frozen=True, slots=True, eq=False)
class RowCache:
    """What :func:`fleetloop.policies.breaker.latency_outlier.batch.decide_pools` reads of ``nodes`` and
    ``emitted`` as arrays, per row of ``ids`` (the pool's nodes at the tick that built it): derived
    data only, rebuilt from the dicts whenever it is missing or for other ids (:func:`row_cache`)."""

    ids: tuple[str, ...]
    quiet: npt.NDArray[np.bool_]  # :func:`quiet`: nothing to step but for its inputs
    was_warm: npt.NDArray[np.bool_]
    steady: npt.NDArray[np.bool_]  # its last record was closed, healthy, no ejections (HEALTHY)
    since: npt.NDArray[np.int64]  # its last record's tick
    phase: npt.NDArray[np.int64]  # :func:`fleetloop.policies.breaker.emission.phase`

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RowCache):
            return NotImplemented
        return self.ids == other.ids and all(
            np.array_equal(getattr(self, f), getattr(other, f))
            for f in ("quiet", "was_warm", "steady", "since", "phase")
        )

    __hash__ = None  # type: ignore[assignment]


HEALTHY: Fields = ("closed", True, 0.0, None, "healthy", 0)  # a quiet node's record's state fields


def quiet(ns: NodeState) -> bool:
    """Both machines closed with no streak, no ejection on record and no ramp: the node's tick has
    nothing to step unless it fails, turns outlier or changes warmth (``decide_columns``' test)."""
    e = ns.err
    return (
        e.state == "closed"
        and not e.ejections
        and ns.lat == "closed"
        and not ns.flagged_ticks
        and not ns.lat_ejections
        and ns.ramp_from_ms is None
    )


def row_cache(
    ids: tuple[str, ...], nodes: Mapping[str, NodeState], emitted: Mapping[str, Emitted]
) -> RowCache:
    """:class:`RowCache` read from the dicts (every id of ``ids`` must be in both)."""
    ns = [nodes[i] for i in ids]
    em = [emitted[i] for i in ids]
    return RowCache(
        ids,
        np.array([quiet(x) for x in ns], dtype=np.bool_),
        np.array([x.was_warm for x in ns], dtype=np.bool_),
        np.array([e[0] == HEALTHY for e in em], dtype=np.bool_),
        np.array([e[1] for e in em], dtype=np.int64),
        np.array([phase(i) for i in ids], dtype=np.int64),
    )


@dataclass(frozen=True, slots=True, weakref_slot=True)
class State:
    started: bool = False
    nodes: Mapping[str, NodeState] = field(default_factory=dict)
    memory: PoolMemory = field(default_factory=_empty_memory)
    # Node -> its last emitted record's state fields and tick (:mod:`fleetloop.policies.breaker.emission`).
    emitted: Mapping[str, Emitted] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Verdict:
    """A node's latency against its pool: each family flagged, clear or without data."""

    tbt: str  # "flagged" | "clear" | "nodata"
    ttft: str
    severity: float  # the largest ratio of a signal to its pool median (0 without data)

    @property
    def outlier(self) -> bool:
        return self.tbt == "flagged" and self.ttft != "clear"

    @property
    def relapse(self) -> bool:
        """Slow while probing: an outlier, or first tokens far slower with no step figures."""
        return self.outlier or (self.ttft == "flagged" and self.tbt == "nodata")

    @property
    def clean(self) -> bool:
        fams = (self.tbt, self.ttft)
        return "flagged" not in fams and "clear" in fams


def serving(node: NodeView) -> bool:
    return node.warm and not node.stale


def failure_share(n: NodeView) -> float:
    return n.failures_w / n.requests_w if n.requests_w > 0 else 0.0


def failing_with_pool(n: NodeView, pool_failing: float) -> bool:
    """The node's failures are the pool's: the median serving node fails at least half as often.

    A node that fails alone (a black hole, a bad GPU) sits far above a median near zero; when the
    whole pool times out together (every node slowed, or overloaded), the median node fails about
    as often as this one, and ejecting it would only move its calls onto nodes failing the same way.
    """
    return serving(n) and n.requests_w > 0 and pool_failing >= POOL_WIDE_SHARE * failure_share(n) > 0


def queueing(n: NodeView, v: Verdict) -> bool:
    """The node's failure streak is its queue's, not the node's: it is serving (warm, fresh), it
    completed calls in the window, the only failures it reports itself are callers that gave up
    waiting (timeouts, no errors), and its step time was read and is clear against its peers'
    (a node with no step figure, or a flagged one, is not shielded).

    A survivor of a capacity loss (half a pool reclaimed) takes the lost nodes' calls; the calls
    queued behind its full batch time out together a client timeout later, a burst of consecutive
    failures, while its batch goes on completing calls at its peers' speed. Ejecting it piles its
    calls onto the other survivors, whose queues then time out in turn (README.md beside this
    file: "Timeouts of a node that serves")."""
    return serving(n) and n.ok_w > 0 and n.node_timeouts_w > 0 and n.node_errors_w == 0 and v.tbt == "clear"


def backoff_ms(params: LatencyOutlierParams, ejections: int) -> int:
    return int(min(params.base_ejection_ms * 2 ** max(0, ejections - 1), params.max_ejection_ms))


def _latency_step(
    ns: NodeState, v: Verdict, now: int, params: LatencyOutlierParams
) -> tuple[NodeState, str, bool]:
    """One transition of the latency machine. Returns (state, reason, wants_to_open)."""
    if ns.lat == "open":
        if now - ns.lat_since_ms >= backoff_ms(params, ns.lat_ejections):
            return _with(ns, lat="half_open", lat_since_ms=now, flagged_ticks=0), "latency-probe", False
        return ns, "latency-ejected", False
    if ns.lat == "half_open":
        if v.relapse:
            return ns, "latency-probe-failed", True
        elapsed = now - ns.lat_since_ms
        if (v.clean and elapsed >= params.probe_min_ms) or elapsed >= params.probe_max_ms:
            back = _with(ns, lat="closed", lat_since_ms=now, flagged_ticks=0, ramp_from_ms=now)
            return back, "latency-probe-succeeded", False
        return ns, "latency-probing", False
    # closed
    flagged = ns.flagged_ticks + 1 if v.outlier else 0
    if flagged != ns.flagged_ticks:
        ns = _with(ns, flagged_ticks=flagged)
    if flagged >= params.detect_ticks:
        return ns, "latency-outlier", True
    if ns.lat_ejections and now - ns.lat_since_ms >= params.forgive_after_ms:
        return _with(ns, lat_ejections=0), "forgiven", False
    return ns, ("latency-suspect" if flagged else "healthy"), False


def node_decision(
    n: NodeView,
    ns: NodeState,
    v: Verdict,
    reason: str,
    params: LatencyOutlierParams,
    *,
    now: int,
    share: float,
    over_cap: bool,
    panic: bool,
    pool_id: str,
    shared: bool = False,
) -> BreakerDecision:
    inputs = {
        "consecutive_failures": float(n.consecutive_failures),
        "severity": r6(v.severity),
        "latency_ejections": float(ns.lat_ejections),
    }
    ejections = ns.lat_ejections + ns.err.ejections
    node_id = n.node_id
    err_open = ns.err.state == "open"
    lat_open = ns.lat == "open"
    if err_open or lat_open:
        untils = []
        if err_open:
            untils.append(ns.err.since_ms + backoff_ms(params, ns.err.ejections))
        if lat_open:
            untils.append(ns.lat_since_ms + backoff_ms(params, ns.lat_ejections))
        # Judged afresh every tick. An ejection published enforced that these rules would now
        # withhold is proposed detected only; the engine holds it to its end (``keep_held`` in
        # fleetloop.core.decide.shaping, for every breaker), so it is not released early.
        queued = err_open and not shared and queueing(n, v)
        enforced = (err_open and not shared and not queued) or (lat_open and not panic)
        why = "pool-wide" if err_open and shared else "queueing" if queued else "panic"
        return breaker_decision(
            pool_id, node_id, "open", reason if enforced else f"{reason}:{why}",
            inputs=inputs, ejections=ejections, enforced=enforced, until_ms=max(untils),
        )  # fmt: skip
    if over_cap:
        return breaker_decision(
            pool_id, node_id, "open", reason, inputs=inputs, ejections=ejections, enforced=False
        )
    if ns.err.state == "half_open" or ns.lat == "half_open":
        return breaker_decision(
            pool_id,
            node_id,
            "half_open",
            reason,
            inputs=inputs,
            ejections=ejections,
            probe_frac=r6(params.probe_frac),
        )
    if ns.ramp_from_ms is not None and n.warm:
        elapsed = max(0, now - ns.ramp_from_ms)
        frac = params.slow_start_min_frac + (1.0 - params.slow_start_min_frac) * (
            elapsed / max(1, params.slow_start_ms)
        )
        inputs["slow_start_frac"] = r6(frac)
        return breaker_decision(
            pool_id, node_id, "half_open", "slow-start",
            inputs=inputs, ejections=ejections, probe_frac=r6(min(0.5, share * frac)),
        )  # fmt: skip
    return breaker_decision(pool_id, node_id, "closed", reason, inputs=inputs, ejections=ejections)


_BREAKER_FIELDS = (
    "entity", "reason", "inputs", "kind", "pool_id", "node_id", "state", "enforced", "probe_frac", "until_ms",
    "ejections",
)  # fmt: skip
assert tuple(BreakerDecision.model_fields) == _BREAKER_FIELDS  # ``breaker_decision`` lists them in order


def breaker_decision(
    pool_id: str,
    node_id: str,
    state: BreakerStateName,
    reason: str,
    *,
    inputs: dict[str, float],
    ejections: int,
    enforced: bool | None = None,
    probe_frac: float | None = None,
    until_ms: int | None = None,
) -> BreakerDecision:
    """``BreakerDecision(entity=..., ...)`` with the fields given (the others at their defaults),
    assembled without validation when every part is valid by construction: the ids come from
    validated telemetry and ticks, and the figures are checked here against the schema's bounds.
    Anything else (a figure out of bounds, an empty reason) goes through validation and fails there,
    exactly as before."""
    given: dict[str, Any] = {
        "entity": f"node/{node_id}",
        "reason": reason,
        "inputs": inputs,
        "pool_id": pool_id,
        "node_id": node_id,
        "state": state,
        "ejections": ejections,
    }
    if enforced is not None:
        given["enforced"] = enforced
    if probe_frac is not None:
        given["probe_frac"] = probe_frac
    if until_ms is not None:
        given["until_ms"] = until_ms
    if (
        reason
        and 0 <= ejections <= MAX_COUNT
        and (until_ms is None or 0 <= until_ms <= MAX_EPOCH_MS)
        and (probe_frac is None or 0.0 <= probe_frac <= 1.0)
        and all(-MAX_FIGURE <= x <= MAX_FIGURE for x in inputs.values())  # False for NaN
    ):
        values = {
            "entity": given["entity"],
            "reason": reason,
            "inputs": inputs,
            "kind": "breaker",
            "pool_id": pool_id,
            "node_id": node_id,
            "state": state,
            "enforced": True if enforced is None else enforced,
            "probe_frac": 0.0 if probe_frac is None else probe_frac,
            "until_ms": until_ms,
            "ejections": ejections,
        }
        return assemble(BreakerDecision, values, set(given))
    return BreakerDecision(**given)


# One fields set shared by every closed decision assembled here (a 10,000-node tick makes hundreds):
# a frozen model never changes its fields set in place (``model_copy`` and ``updated`` copy it first),
# as the ratio retry budget's tenant decisions and the engine's decision wrappers share theirs.
_CLOSED_FIELDS: set[str] = {"entity", "reason", "inputs", "pool_id", "node_id", "state", "ejections"}


def closed_decision(  # noqa: PLR0917 - the decision's fields
    pool_id: str,
    node_id: str,
    reason: str,
    streak: float,
    severity: float,
    lat_ejections: int,
    ejections: int,
) -> BreakerDecision:
    """A closed node's decision, what :func:`node_decision` gives it, assembled directly: the caller
    has checked its figures (``streak``, ``severity``, rounded) and ``ejections`` against the
    schema's bounds, and ``reason`` is not empty."""
    return assemble(
        BreakerDecision,
        {
            "entity": f"node/{node_id}",
            "reason": reason,
            "inputs": {
                "consecutive_failures": streak,
                "severity": severity,
                "latency_ejections": float(lat_ejections),
            },
            "kind": "breaker",
            "pool_id": pool_id,
            "node_id": node_id,
            "state": "closed",
            "enforced": True,
            "probe_frac": 0.0,
            "until_ms": None,
            "ejections": ejections,
        },
        _CLOSED_FIELDS,
    )


def step_node(  # noqa: PLR0917 - the node's state and figures, then the tick and the params
    ns: NodeState,
    streak: int,
    warm: bool,
    started: bool,
    v: Verdict,
    now: int,
    params: LatencyOutlierParams,
    err_params: ConsecutiveErrorsParams,
) -> tuple[NodeState, str, bool]:
    """One node's tick: the error machine on its failure streak, the slow-start ramp when its weights
    just loaded (after the breaker's first tick), then the latency machine on its verdict. Returns
    (state, reason, wants to open for latency)."""
    e = ns.err
    err, err_reason = step(e, streak, now, err_params)
    ramp = now if started and warm and not ns.was_warm else ns.ramp_from_ms
    if err is not e or ramp != ns.ramp_from_ms or warm != ns.was_warm:
        ns = _with(ns, err=err, ramp_from_ms=ramp, was_warm=warm)
    ns, lat_reason, want = _latency_step(ns, v, now, params)
    return ns, (err_reason if err.state != "closed" or err_reason != "healthy" else lat_reason), want


@dataclass(frozen=True, slots=True)
class PoolRows:
    """One pool's tick as :func:`pool_tick` reads it. ``rows`` are the rows it handles (indices into
    ``ids``, ascending), and each list below has one entry per handled row. A row left out is quiet,
    healthy and not due a record (the batch form's shortcut; the per-pool form handles every row)."""

    pool_id: str
    ids: tuple[str, ...]  # the pool's nodes, in row order
    rows: list[int]
    at: list[int]  # its row in the snapshot's columns (its view, for a decision that is not closed)
    trivial: list[bool]  # nothing to step: quiet, no failure streak, warmth unchanged, no outlier
    warm: list[bool]
    serve: list[bool]
    streak: list[int]
    streak_f: list[float]  # the streak as a figure
    tbt: list[int]  # status codes (:data:`STATUS`)
    ttft: list[int]
    severity: list[float]
    severity_r: list[float]  # rounded for the wire
    outlier: list[bool]
    phase: list[int]  # :func:`fleetloop.policies.breaker.emission.phase`
    live: int  # the pool's serving nodes
    healthy_trivial: int  # of them, those trivial (handled or not)
    failing: float  # the pool's failure level
    figures_ok: bool  # every closed decision's figures are within the schema's bounds


class PoolOutcome(NamedTuple):
    decisions: list[BreakerDecision]
    nodes: dict[str, NodeState]  # the nodes whose state is another object than before
    emitted: dict[str, Emitted]  # the records emitted this tick
    latency_open: int
    error_open: int
    panic: bool


def pool_tick(
    pr: PoolRows,
    known: Mapping[str, NodeState],
    before: Mapping[str, Emitted],
    views: Sequence[NodeView],
    *,
    started: bool,
    now: int,
    tick_id: int,
    params: LatencyOutlierParams,
) -> PoolOutcome:
    """One pool's tick: ``known`` holds a state for every node of ``pr.ids``; ``before`` the records
    emitted last; ``views[pr.at[q]]`` the view of handled row ``q``."""
    stepped, reasons, over_cap, panic = _step_rows(pr, known, started=started, now=now, params=params)
    return _records(
        pr, known, before, views, stepped=stepped, reasons=reasons, over_cap=over_cap, panic=panic,
        now=now, tick_id=tick_id, params=params,
    )  # fmt: skip


def _step_rows(
    pr: PoolRows, known: Mapping[str, NodeState], *, started: bool, now: int, params: LatencyOutlierParams
) -> tuple[dict[str, NodeState], dict[str, str], set[str], bool]:
    """The machines stepped for the rows with something to step, the latency cap, and the panic
    threshold: (stepped states, their reasons, the nodes over the cap, panic)."""
    err_params = params.errors()
    stepped: dict[str, NodeState] = {}
    reasons: dict[str, str] = {}
    wants: list[tuple[float, str]] = []
    open_now = 0
    for q, r in enumerate(pr.rows):
        if pr.trivial[q]:
            continue
        node_id = pr.ids[r]
        v = Verdict(STATUS[pr.tbt[q]], STATUS[pr.ttft[q]], pr.severity[q])
        ns, reason, want = step_node(
            known[node_id], pr.streak[q], pr.warm[q], started, v, now, params, err_params
        )
        if want:
            wants.append((-v.severity, node_id))
        stepped[node_id] = ns
        reasons[node_id] = reason
        if ns.lat == "open" or ns.err.state == "open":
            open_now += 1
    over_cap = (
        _eject_within_cap(
            params, len(pr.ids), wants=wants, stepped=stepped, reasons=reasons, open_now=open_now, now=now
        )
        if wants
        else set()
    )
    # Panic threshold (:func:`panicking`): the serving nodes neither open, over the cap nor outliers.
    healthy = pr.healthy_trivial
    for q, r in enumerate(pr.rows):
        if pr.serve[q] and not pr.trivial[q]:
            node_id = pr.ids[r]
            ns = stepped[node_id]
            if ns.lat != "open" and ns.err.state != "open" and node_id not in over_cap and not pr.outlier[q]:
                healthy += 1
    return stepped, reasons, over_cap, panicking(pr.live, healthy, params)


def panicking(live: int, healthy: int, params: LatencyOutlierParams) -> bool:
    """Panic threshold: fewer than ``panic_threshold`` of the pool's ``live`` (serving) nodes are
    ``healthy`` (neither open, over the cap, nor outliers): the slowness is the pool's, not a node's."""
    return bool(live) and healthy < params.panic_threshold * live


def _records(
    pr: PoolRows,
    known: Mapping[str, NodeState],
    before: Mapping[str, Emitted],
    views: Sequence[NodeView],
    *,
    stepped: Mapping[str, NodeState],
    reasons: Mapping[str, str],
    over_cap: set[str],
    panic: bool,
    now: int,
    tick_id: int,
    params: LatencyOutlierParams,
) -> PoolOutcome:
    """Each handled row's decision, and the records emitted (change-only,
    :mod:`fleetloop.policies.breaker.emission`). A closed node's decision is assembled directly; a
    node's view is read only for a decision that is not closed (open, probing or ramping)."""
    share = 1.0 / max(1, pr.live)
    residue = keyframe_residue(tick_id)
    decisions: list[BreakerDecision] = []
    nodes: dict[str, NodeState] = {}
    emitted: dict[str, Emitted] = {}
    latency_open = error_open = 0
    for q, r in enumerate(pr.rows):
        node_id = pr.ids[r]
        trivial = pr.trivial[q]
        ns = known[node_id] if trivial else stepped[node_id]
        reason = "healthy" if trivial else reasons[node_id]
        ramp_from = ns.ramp_from_ms
        if ramp_from is not None and now - ramp_from >= params.slow_start_ms:
            ns = _with(ns, ramp_from_ms=None)
            ramp_from = None
        if ns is not known[node_id]:
            nodes[node_id] = ns
        lat, e = ns.lat, ns.err
        if lat == "closed" and e.state == "closed":
            ejections = ns.lat_ejections + e.ejections
            if (
                (ramp_from is None or not pr.warm[q])
                and node_id not in over_cap
                and pr.figures_ok
                and 0 <= ejections <= MAX_COUNT
                and reason
            ):
                f: Fields = ("closed", True, 0.0, None, reason, ejections)
                b = before.get(node_id)
                if (
                    b is not None
                    and b[0] == f
                    and pr.phase[q] != residue
                    and 0 <= tick_id - b[1] < KEYFRAME_TICKS
                ):
                    continue  # unchanged, not its keyframe, not too old: not emitted (emission.emits)
                emitted[node_id] = (f, tick_id)
                decisions.append(
                    closed_decision(
                        pr.pool_id,
                        node_id,
                        reason,
                        pr.streak_f[q],
                        pr.severity_r[q],
                        ns.lat_ejections,
                        ejections,
                    )
                )
                continue
        else:
            latency_open += lat == "open"
            error_open += e.state == "open"
        n = views[pr.at[q]]
        d = node_decision(
            n, ns, Verdict(STATUS[pr.tbt[q]], STATUS[pr.ttft[q]], pr.severity[q]), reason, params,
            now=now, share=share, over_cap=node_id in over_cap, panic=panic, pool_id=pr.pool_id,
            shared=failing_with_pool(n, pr.failing),
        )  # fmt: skip
        fd = fields_of(d)
        b = before.get(node_id)
        if b is None or emits(node_id, fd, b, tick_id):
            decisions.append(d)
            emitted[node_id] = (fd, tick_id)
    return PoolOutcome(decisions, nodes, emitted, latency_open, error_open, panic)


def quiet_tick(  # noqa: PLR0917 - the pool's handled rows and their figures, then its counts and the tick
    pool_id: str,
    ids: tuple[str, ...],
    rows: Sequence[int],
    streak_f: Sequence[float],
    severity_r: Sequence[float],
    live: int,
    healthy_trivial: int,
    tick_id: int,
    params: LatencyOutlierParams,
) -> PoolOutcome:
    """:func:`pool_tick` of a pool whose handled ``rows`` are all trivial (``PoolRows.trivial``) and
    each due a record, with every figure within the schema's bounds: the batch form's shortcut for a
    quiet pool, most pools on most ticks. A trivial row steps nothing and keeps its state (quiet: both
    machines closed, no ejection, no ramp), so its decision is closed and ``healthy`` with no
    ejections, emitted (:data:`HEALTHY`, this tick); nothing opens, nothing is capped, and the panic
    threshold counts the pool's trivial serving nodes alone. ``tests/unit/test_breaker_batch.py``
    holds it to :func:`pool_tick` on such rows."""
    decisions: list[BreakerDecision] = []
    emitted: dict[str, Emitted] = {}
    reason = "healthy"
    for r, streak, severity in zip(rows, streak_f, severity_r, strict=True):
        node_id = ids[r]
        emitted[node_id] = (("closed", True, 0.0, None, reason, 0), tick_id)  # one tuple per record
        decisions.append(closed_decision(pool_id, node_id, reason, streak, severity, 0, 0))
    return PoolOutcome(decisions, {}, emitted, 0, 0, panicking(live, healthy_trivial, params))


def phases(ids: Sequence[str]) -> npt.NDArray[np.int64]:
    """:func:`fleetloop.policies.breaker.emission.phase` of each node."""
    return np.array([phase(i) for i in ids], dtype=np.int64)
