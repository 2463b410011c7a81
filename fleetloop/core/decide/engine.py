"""The decision engine: one frozen input per tick, one result out (docs/architecture.md, Decide).

``decide(snapshot, policy, state, tick, input_offsets) -> TickResult`` runs the policy's
algorithms for the tick's pool in a fixed order (breaker, routing, admission, retry budget,
autoscale, batching), applies the safety envelope (:mod:`fleetloop.policies.envelope`) and stamps
every decision with the policy, the tick and the input offsets. It is pure: the same inputs give
the same decisions, byte for byte, which is what replay checks. Randomness, were an algorithm to
need it, comes from a generator seeded by (tick id, pool id).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, cast

import numpy as np
from pydantic import TypeAdapter

from fleetloop.policies.base import FleetSnapshot, NodeView, PolicyContext, r6, r6_array
from fleetloop.policies.columns import fleet_columns
from fleetloop.policies.envelope import Envelope
from fleetloop.policies.pool_figures import pool_figures, row_ids
from fleetloop.policies.registry import CompiledPolicy
from fleetloop.schemas.base import assemble, updated
from fleetloop.schemas.control import Tick
from fleetloop.schemas.decisions import (
    AdmissionDecision,
    AutoscaleDecision,
    BreakerDecision,
    Decision,
    DecisionBody,
    Offset,
    PolicyStamp,
    RoutingDecision,
)
from fleetloop.schemas.policy import SECTIONS, Mode

ORDER: tuple[str, ...] = ("breaker", "routing", "admission", "retry_budget", "autoscale", "batching")
assert sorted(ORDER) == sorted(SECTIONS)


@dataclass(frozen=True, slots=True)
class EngineState:
    """Each algorithm's state, per section and pool. Keyed also by algorithm name, so a policy
    change that swaps an algorithm starts it fresh while unchanged sections keep their state."""

    algorithms: Mapping[tuple[str, str, str], Any] = field(default_factory=dict)  # (section, name, pool)
    # The last autoscale target the engine let out, per pool: what a silent pool is frozen at.
    autoscale_held: Mapping[str, int] = field(default_factory=dict)
    # Per pool, the ejections the engine let out enforced at the pool's last tick (node -> until_ms):
    # held to their end, not judged again (``_cap_ejections_plain``, rule 3: no flapping).
    ejections_held: Mapping[str, Mapping[str, int | None]] = field(default_factory=dict)


_EMPTY = EngineState()
_DECISION_FIELDS = ("ts_ms", "tick_id", "policy", "input_offsets", "body")
assert tuple(Decision.model_fields) == _DECISION_FIELDS
_OFFSETS: TypeAdapter[dict[str, int]] = TypeAdapter(dict[str, Offset])


@dataclass(frozen=True, slots=True)
class TickResult:
    decisions: tuple[Decision, ...]
    state: EngineState
    diagnostics: Mapping[str, float]


_ENVELOPES: dict[str, Envelope] = {}


def envelope_of(policy: CompiledPolicy) -> Envelope:
    """The policy's envelope, validated once per document (keyed by its content hash)."""
    env = _ENVELOPES.get(policy.stamp.hash)
    if env is None:
        env = Envelope.model_validate(policy.document.spec.envelope)
        if len(_ENVELOPES) >= 64:
            _ENVELOPES.clear()
        _ENVELOPES[policy.stamp.hash] = env
    return env


def share_cap(max_ejected_frac: float, pool_size: int) -> int:
    """How many of a pool's ``pool_size`` nodes may be ejected at once: ``floor(max_ejected_frac x
    pool_size)``, but at least one unless ``max_ejected_frac`` is 0 (Envoy's ``always_eject_one_host``:
    a small pool can still lose its one failing node; 0 means never eject, the ``none`` baseline)."""
    if max_ejected_frac <= 0:
        return 0
    return max(1, math.floor(max_ejected_frac * pool_size + 1e-9))


def _is_held(d: BreakerDecision, held: Mapping[str, int | None], now_ms: int) -> bool:
    """``d`` (open, enforced by its breaker) continues an ejection the engine let out enforced at the
    pool's last tick, whose end (``until_ms``; None: none given) is still ahead."""
    if d.node_id not in held:
        return False
    until = held[d.node_id]
    return until is None or now_ms < until


def held_after(decisions: Sequence[BreakerDecision]) -> dict[str, int | None]:
    """The ejections a pool's tick let out enforced (node -> ``until_ms``): what its next tick holds."""
    return {d.node_id: d.until_ms for d in decisions if d.state == "open" and d.enforced}


def _hold(
    ejected: dict[str, Mapping[str, int | None]], pool_id: str, shaped: Sequence[BreakerDecision]
) -> None:
    """Set the pool's held ejections in ``ejected`` to those of its tick's shaped breaker decisions
    (none: the pool's entry is dropped, so a pool with no ejection keeps no entry)."""
    now = held_after(shaped)
    if now:
        ejected[pool_id] = now
    else:
        ejected.pop(pool_id, None)


def _cap_ejections(
    decisions: list[BreakerDecision],
    snap: FleetSnapshot,
    pool_id: str,
    env: Envelope,
    held: Mapping[str, int | None] | None = None,
) -> list[BreakerDecision]:
    """:func:`_cap_ejections_plain` (the rule, stated there) reading the pool's nodes from the
    snapshot's columns instead of building their views: the same figures, sums in the same order."""
    open_ = [d for d in decisions if d.state == "open" and d.enforced]
    if not open_:
        return decisions
    cols = fleet_columns(snap)
    lo, hi = cols.bounds.get(pool_id, (0, 0))
    ids = row_ids(snap)[lo:hi]
    row = {node_id: r for r, node_id in enumerate(ids)}
    cap = share_cap(env.max_ejected_frac, len(ids))
    streak = cols.ints("consecutive_failures")[lo:hi].tolist()
    live = (cols.warm[lo:hi] & ~cols.stale[lo:hi]).tolist()
    # A missing step time (NaN in the column) reads as the view's None: speed 1.
    tbt = [None if math.isnan(x) else x for x in cols.floats("tbt_p50_ms")[lo:hi].tolist()]
    queue = cols.ints("queue_depth")[lo:hi].tolist()
    kv = cols.floats("kv_cache_used_frac")[lo:hi].tolist()
    ok_w = cols.ints("ok_w")[lo:hi].tolist()
    requests_w = cols.ints("requests_w")[lo:hi].tolist()

    def severity(d: BreakerDecision) -> tuple[float, str]:
        r = row.get(d.node_id)
        return (-(streak[r] if r is not None else 0.0), d.node_id)

    serving = [r for r in range(len(ids)) if live[r]]
    steps = sorted(x for r in serving if (x := tbt[r]) is not None and x > 0)
    ref = steps[len(steps) // 2] if steps else None
    candidates = {d.node_id for d in open_}
    others = [r for r in serving if ids[r] not in candidates]
    took = sum(requests_w[r] for r in others)
    pool_ok = sum(ok_w[r] for r in others) / took if took > 0 else None

    def speed(r: int) -> float:
        t = tbt[r]
        return min(1.0, ref / t) if ref is not None and t else 1.0

    def busy(r: int) -> float:
        return 1.0 if queue[r] > 0 else min(1.0, max(0.0, kv[r]))

    def useful(r: int) -> float:
        return speed(r) * busy(r) * _ok_share(streak[r], ok_w[r], requests_w[r], pool_ok)

    def moves(node_id: str) -> float | None:
        r = row.get(node_id)
        return useful(r) if r is not None and live[r] else None

    spare = sum(speed(r) * (1.0 - busy(r)) for r in others)
    ordered = sorted(open_, key=severity)
    return _unenforce(
        decisions, _choose(ordered, held or {}, now_ms=snap.now_ms, cap=cap, spare=spare, moves=moves)
    )


def _choose(
    ordered: Sequence[BreakerDecision],
    held: Mapping[str, int | None],
    *,
    now_ms: int,
    cap: int,
    spare: float,
    moves: Callable[[str], float | None],
) -> dict[str, str]:
    """Rules (1)-(3) of :func:`_cap_ejections_plain` over the candidates, worst first: the held
    ones within the share cap, then the new ones within it whose useful work (``moves``: None for a
    node not serving) fits in what is left of ``spare``. Returns the capped nodes and why."""
    keep: set[str] = set()
    why: dict[str, str] = {}
    for d in ordered:
        if _is_held(d, held, now_ms):
            if len(keep) >= cap:
                why[d.node_id] = "max-ejected-cap"
            else:
                keep.add(d.node_id)
    for d in ordered:
        if d.node_id in keep or d.node_id in why:
            continue
        if len(keep) >= cap:
            why[d.node_id] = "max-ejected-cap"
            continue
        moved = moves(d.node_id)
        if moved is not None:
            if moved > spare + 1e-9:
                why[d.node_id] = "capacity-cap"
                continue
            spare -= moved
        keep.add(d.node_id)
    return why


def _ok_share(streak: int, ok_w: int, requests_w: int, pool_ok: float | None) -> float:
    """The share of a candidate's calls that would succeed: see :func:`_cap_ejections_plain`."""
    if streak > 0:
        return 0.0
    if requests_w > 0:
        return ok_w / requests_w
    return pool_ok if pool_ok is not None else 1.0


def _unenforce(decisions: list[BreakerDecision], why: Mapping[str, str]) -> list[BreakerDecision]:
    """The enforced open decisions named in ``why`` kept but not enforced, the cap's reason appended."""
    if not why:
        return decisions
    return [
        d.model_copy(update={"enforced": False, "reason": f"{d.reason}:{why[d.node_id]}"})
        if d.state == "open" and d.enforced and d.node_id in why
        else d
        for d in decisions
    ]


def _cap_ejections_plain(
    decisions: list[BreakerDecision],
    snap: FleetSnapshot,
    pool_id: str,
    env: Envelope,
    held: Mapping[str, int | None] | None = None,
) -> list[BreakerDecision]:
    """Enforce an ejection only while (1) the pool's open nodes stay within its share cap and (2) the
    nodes left serving can carry the useful work the newly ejected ones were doing; the rest are
    'detected', not enforced (reason ``:max-ejected-cap``, ``:capacity-cap``). An ejection let out
    enforced at the pool's last tick is held: it is not judged again until its end (3).

    (1) Share cap, :func:`share_cap`: at most ``max(1, floor(max_ejected_frac x nodes))`` of the
    pool's nodes (all of them, serving or not) open and enforced at once, none when
    ``max_ejected_frac`` is 0 (the ``none`` baseline). Held ejections count first, then the new ones,
    worst offenders (most consecutive failures, then node id) first.

    (2) Capacity, in healthy-node units over the pool's serving nodes (warm, fresh)::

        speed_i  = min(1, median_j(tbt_p50_j) / tbt_p50_i)        (1 without a step time)
        busy_i   = 1 if queue_depth_i > 0 else kv_cache_used_frac_i  (a queue means full)
        ok_i     = 0                              if consecutive_failures_i > 0  (in a failure streak)
                   ok_w_i / requests_w_i          elif requests_w_i > 0
                   sum ok_w_j / sum requests_w_j  elif some other serving node j took calls
                   1                              else (no call in the whole pool: telemetry only)
        useful_i = speed_i * busy_i * ok_i                           (work that succeeds there)
        spare    = sum over serving nodes not ejected of speed_j * (1 - busy_j)

    A new candidate is enforced when its ``useful_i`` fits in what is left of ``spare``; a node that
    is not serving (stale, cold, draining) carries nothing and only counts against the share cap.

    ``ok_i`` is the share of the calls routed to the node from now on that would succeed, read from
    what the router saw *since its current failure streak began*, never before: every call since
    then failed (an ok call ends a streak), so a node in a streak carries no useful work, whatever
    it served earlier in the window and however loaded its pool. It is ejected at once into a busy
    pool, as Envoy's consecutive-5xx ejection does (the breaker names the streak; its pool-wide rule
    still shields a failure the whole pool shares). A node with no call in the window has no success
    share of its own; an empty window is not "all ok" (ejecting a node the routers stopped sending
    to would read as moving its whole load): it is read as its pool's, the other serving nodes'
    success share. Only when no serving node of the pool took a call (a deployment without router
    outcomes, scrape only) does the node's telemetry alone say what it carries.

    A slow node carries little useful work (its ``speed_i``), so it too may be ejected into a busy
    pool; a pool-wide slowdown leaves no spare anywhere and no node slow against the median, so
    nothing is ejected for it (ejecting would pile the same load on fewer, equally slow nodes).

    (3) Held ejections: ``held`` is what :func:`held_after` took from the pool's last tick (node ->
    ``until_ms``). A candidate in it whose end is still ahead (``now < until_ms``, or no end given)
    stays enforced without being judged again by (2): its work already moved to the others (their
    telemetry shows it), and its window empties once routers stop sending to it, so a fresh
    judgement would release it for one tick and take it back the next (a flap). It comes back
    through its breaker: half-open at the end of its backoff, a probe share, then closed or open
    again. Only (1) can release a held ejection early, when the pool shrank under it (the envelope's
    bound comes first).

    Inputs: the breaker decisions of the pool's tick (open and enforced ones are the candidates),
    per node ``consecutive_failures``, ``ok_w``, ``requests_w``, ``queue_depth``,
    ``kv_cache_used_frac``, ``tbt_p50_ms``, ``warm``, ``stale``; ``envelope.max_ejected_frac``
    (default 0.5); ``held``. Failure modes: a node that answers but fails (a streak) in a pool-wide
    outage is ejected up to the share cap; the breaker's pool-wide rule, not this cap, keeps such
    ejections detected only. A pool without router outcomes judges a latency ejection by speed and
    load alone. A held ejection of a node that recovered during its backoff stays out until then."""
    open_ = [d for d in decisions if d.state == "open" and d.enforced]
    if not open_:
        return decisions
    nodes = {n.node_id: n for n in snap.pool_nodes(pool_id)}
    cap = share_cap(env.max_ejected_frac, len(nodes))

    def severity(d: BreakerDecision) -> tuple[float, str]:
        node = nodes.get(d.node_id)
        return (-(node.consecutive_failures if node else 0.0), d.node_id)

    serving = {i: n for i, n in nodes.items() if n.warm and not n.stale}
    steps = sorted(n.tbt_p50_ms for n in serving.values() if n.tbt_p50_ms is not None and n.tbt_p50_ms > 0)
    ref = steps[len(steps) // 2] if steps else None
    candidates = {d.node_id for d in open_}
    others = [n for i, n in serving.items() if i not in candidates]
    took = sum(n.requests_w for n in others)
    pool_ok = sum(n.ok_w for n in others) / took if took > 0 else None

    def speed(n: NodeView) -> float:
        return min(1.0, ref / n.tbt_p50_ms) if ref is not None and n.tbt_p50_ms else 1.0

    def busy(n: NodeView) -> float:
        return 1.0 if n.queue_depth > 0 else min(1.0, max(0.0, n.kv_cache_used_frac))

    def useful(n: NodeView) -> float:
        return speed(n) * busy(n) * _ok_share(n.consecutive_failures, n.ok_w, n.requests_w, pool_ok)

    def moves(node_id: str) -> float | None:
        node = serving.get(node_id)
        return useful(node) if node is not None else None

    spare = sum(speed(n) * (1.0 - busy(n)) for n in others)
    ordered = sorted(open_, key=severity)
    return _unenforce(
        decisions, _choose(ordered, held or {}, now_ms=snap.now_ms, cap=cap, spare=spare, moves=moves)
    )


def _shape_routing(
    d: RoutingDecision, snap: FleetSnapshot, breakers: Mapping[str, BreakerDecision], env: Envelope
) -> RoutingDecision | None:
    """Zero stale and ejected nodes, give probing nodes their probe share, fail open if all zero;
    None when no node is left to route to even then (:data:`NO_NODE`: the pool gets no routing
    decision this tick).

    The pool's nodes are read from the snapshot's columns (ids, stale, warm, draining), in node-id
    order, as ``snap.pool_nodes`` lists them, without their views."""
    cols = fleet_columns(snap)
    lo, hi = cols.bounds.get(d.pool_id, (0, 0))
    weights, probes, zeroed, total, reason = _unscaled(
        d,
        breakers,
        row_ids(snap)[lo:hi],
        stale=cols.stale[lo:hi].tolist(),
        warm=cols.warm[lo:hi].tolist(),
        draining=lambda: cols.draining[lo:hi].tolist(),  # noqa: PLW0108 (read only on fail-open)
    )
    if reason == NO_NODE:
        return None
    # Probing nodes share at most half of the traffic, however many are half-open at once.
    asked = sum(probes.values())
    probe_scale = min(1.0, 0.5 / asked) if asked > 0 else 0.0
    probe_total = asked * probe_scale
    scale = (1.0 - probe_total) / total if total > 0 else 0.0
    out = _scaled(weights, scale)
    for n, p in probes.items():
        out[n] = r6(p * probe_scale)
    inputs = dict(d.inputs)
    inputs["stale_nodes"] = float(zeroed)
    inputs["probing_nodes"] = float(len(probes))
    by_priority = {
        cls: _renormalize({n: w for n, w in ws.items() if out.get(n, 0.0) > 0})
        for cls, ws in d.by_priority.items()
    }
    return _shaped(d, env, weights=out, reason=reason, inputs=inputs, by_priority=by_priority)


def _shaped(
    d: RoutingDecision,
    env: Envelope,
    *,
    weights: dict[str, float],
    reason: str,
    inputs: dict[str, Any],
    by_priority: dict[Any, dict[str, float]],
) -> RoutingDecision:
    """``d`` with its shaped weights and per-priority tables, reason, inputs and spill list cut to
    the envelope: the last step of both routing shaping forms."""
    return updated(
        d,
        {
            "weights": weights,
            "reason": reason,
            "inputs": inputs,
            "by_priority": by_priority,
            "spill_to": d.spill_to[: env.max_spill_pools],
        },
    )


# The reason ``_unscaled`` gives when not even failing open leaves a node to route to.
NO_NODE = "no-node"


def _unscaled(
    d: RoutingDecision,
    breakers: Mapping[str, BreakerDecision],
    in_rows: Sequence[str],
    *,
    stale: Sequence[bool],
    warm: Sequence[bool],
    draining: Callable[[], Sequence[bool]],
) -> tuple[dict[str, float], dict[str, float], int, float, str]:
    """Routing shaping's first step, shared by :func:`_shape_routing` and
    :func:`_shape_routing_many`: a pool's weights before scaling (stale, unknown and ejected nodes
    zeroed, half-open nodes moved to probes), its probes, how many nodes were zeroed as stale, the
    weights' total and the reason; fail open (spread evenly over warm nodes, ignoring breakers and
    staleness) when nothing is left. ``in_rows`` are the pool's rows with their ``stale`` and
    ``warm`` flags; ``draining`` gives theirs, read only on fail-open.

    When even failing open leaves nothing (reason :data:`NO_NODE`) the shapers publish **no
    routing decision** for the pool that tick: a decision naming no node to route to would tell
    every router to empty the pool. That happens when the daemon sees no node of the pool at all
    (a pool with outcomes but no telemetry yet: a new pool, a scraper not yet running or down; or a
    known pool after a quiet period, once its nodes' last telemetry is older than the model's
    ``forget_node_after_ms``), or only cold draining ones. None of that is evidence that the
    pool's nodes are gone: silence means unknown, never "no members". Without a decision the
    routers keep the last one they hold until it goes stale (their fail-static TTL), then balance
    over the nodes they know themselves, as without fleetloop; when the pool's nodes report again,
    its decisions resume. Holding the last membership instead would keep re-publishing, as fresh,
    what the daemon no longer knows, and hold routers off their own fail-static view for as long
    as the silence lasts. A pool whose nodes the daemon saw stop is routed as before: stale nodes
    are zeroed while any node reports, and fail open (evenly over them) once none does."""
    ids = sorted(in_rows)  # node-id order already: a pass over sorted input
    stale_of = dict(zip(in_rows, stale, strict=True))
    warm_of = dict(zip(in_rows, warm, strict=True))
    weights: dict[str, float] = {}
    probes: dict[str, float] = {}
    zeroed = 0
    given = d.weights
    # The union of the decision's nodes and the pool's, sorted: the pool's own ids when they match.
    for node_id in ids if list(given) == ids else sorted(set(given) | set(ids)):
        w = given.get(node_id, 0.0)
        is_stale = stale_of.get(node_id)
        b = breakers.get(node_id)
        if is_stale is None or is_stale:
            w = 0.0
            zeroed += 1
        elif b is not None and b.enforced and b.state == "open":
            w = 0.0
        elif b is not None and b.enforced and b.state == "half_open":
            probes[node_id] = b.probe_frac if warm_of[node_id] else 0.0
            w = 0.0
        weights[node_id] = w
    total = sum(weights.values())
    reason = d.reason
    if total <= 0:
        # Fail open (panic threshold): spread evenly over warm nodes, ignoring breakers and staleness.
        draining_of = dict(zip(in_rows, draining(), strict=True))
        candidates = [n for n in ids if warm_of[n]] or [n for n in ids if not draining_of[n]]
        weights = {n: (1.0 if n in candidates else 0.0) for n in weights}
        total = float(len(candidates))
        probes = {}
        reason = "fail-open" if candidates else NO_NODE
    return weights, probes, zeroed, total, reason


def _shape_routing_many(
    items: Sequence[tuple[RoutingDecision, Mapping[str, BreakerDecision]]],
    snap: FleetSnapshot,
    env: Envelope,
) -> list[RoutingDecision | None]:
    """``[_shape_routing(d, snap, breakers, env) for d, breakers in items]``, the same decisions bit
    for bit (:func:`_shape_routing` is the statement; ``tests/unit/test_shape_many.py`` holds the two
    equal): the same steps decision by decision, but the rows' flags are read once for the batch
    and every rounding (each weight's ``r6(w * scale)``, each class's ``r6(w / total)``) is done in
    two :func:`r6_array` calls for the whole batch, instead of two or more array pipelines (or a
    loop of ``r6``, the same doubles) per pool. Each element is the same one IEEE product or
    quotient either way, rounded by ``r6`` or the bit-identical ``r6_array``.

    No Python step per node where a decision's weights name exactly its pool's rows, in the rows'
    (node-id) order, as cache-aware routing gives them (:func:`_unscaled_rows`): the weights are
    taken as they are, stale rows zeroed by their flags, and only the pool's enforced open and
    half-open breakers looked at; a class table with the same keys is cut to the nodes left
    serving by one mask. Any other decision, and one that fails open, goes through
    :func:`_unscaled` as :func:`_shape_routing` does."""
    if not items:
        return []
    cols = fleet_columns(snap)
    bounds = cols.bounds
    all_ids = row_ids(snap)
    stale_all: list[bool] = cols.stale.tolist()
    warm_all: list[bool] = cols.warm.tolist()
    # Step 1, per decision: the weights before scaling, the probes, the reason (as _shape_routing).
    staged: list[tuple[Sequence[str], dict[str, float], float, int, str]] = []
    values: list[float] = []
    scales: list[float] = []
    counts: list[int] = []
    for d, breakers in items:
        lo, hi = bounds.get(d.pool_id, (0, 0))
        in_rows = all_ids[lo:hi]
        fast = _unscaled_rows(d, breakers, in_rows, lo, stale_all, warm_all)
        if fast is not None:
            keys: Sequence[str] = in_rows
            vals, probes, zeroed, total, reason = fast
        else:
            weights, probes, zeroed, total, reason = _unscaled(
                d,
                breakers,
                in_rows,
                stale=stale_all[lo:hi],
                warm=warm_all[lo:hi],
                draining=lambda: cols.draining[lo:hi].tolist(),  # noqa: B023, PLW0108 (called before lo, hi move)
            )
            keys = list(weights)
            vals = list(weights.values())
        asked = sum(probes.values())
        probe_scale = min(1.0, 0.5 / asked) if asked > 0 else 0.0
        probe_total = asked * probe_scale
        scales.append((1.0 - probe_total) / total if total > 0 else 0.0)
        counts.append(len(keys))
        values.extend(vals)
        staged.append((keys, probes, probe_scale, zeroed, reason))
    # Step 2: every weight's r6(w * scale) at once.
    with np.errstate(over="ignore", invalid="ignore"):
        products = np.array(values, dtype=np.float64) * np.repeat(np.array(scales, dtype=np.float64), counts)
    rounded: list[float] = r6_array(products).tolist()
    # Step 3, per decision: the shaped weights; each class's weights over the nodes left serving.
    outs: list[dict[str, float]] = []
    class_keys: list[list[str]] = []
    class_values: list[float] = []
    class_totals: list[float] = []
    class_counts: list[int] = []
    positive = _ZERO.__lt__  # 0.0 < w: w > 0, False for NaN, as ``out.get(n, 0.0) > 0``
    at = 0
    for (d, _), (keys, probes, probe_scale, _, _) in zip(items, staged, strict=True):
        k = len(keys)
        out = dict(zip(keys, rounded[at : at + k], strict=True))
        at += k
        for n, p in probes.items():
            out[n] = r6(p * probe_scale)
        outs.append(out)
        if not d.by_priority:
            continue
        out_keys = list(out)
        serving = list(map(positive, out.values()))
        for ws in d.by_priority.values():
            if list(ws) == out_keys:
                # The class names the shaped weights' nodes, in their (sorted) order: the nodes kept
                # are those the mask keeps, already sorted, their weights in that order.
                kept_keys = list(compress(out_keys, serving))
                kept_values = list(compress(ws.values(), serving))
                total = sum(kept_values)
            else:
                kept = {n: w for n, w in ws.items() if out.get(n, 0.0) > 0}
                total = sum(kept.values())
                kept_keys = sorted(kept)
                kept_values = [kept[n] for n in kept_keys]
            if not total > 0:
                class_keys.append([])
                continue
            class_keys.append(kept_keys)
            class_values.extend(kept_values)
            class_totals.append(total)
            class_counts.append(len(kept_keys))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        quotients = np.array(class_values, dtype=np.float64) / np.repeat(
            np.array(class_totals, dtype=np.float64), class_counts
        )
    shares: list[float] = r6_array(quotients).tolist()
    # Step 4: the decisions.
    shaped: list[RoutingDecision | None] = []
    at = c = 0
    for (d, _), (_, probes, _, zeroed, reason), out in zip(items, staged, outs, strict=True):
        if reason == NO_NODE:  # nothing to route to: no decision (_unscaled, and _shape_routing)
            for _ in d.by_priority:
                at += len(class_keys[c])
                c += 1
            shaped.append(None)
            continue
        inputs = dict(d.inputs)
        inputs["stale_nodes"] = float(zeroed)
        inputs["probing_nodes"] = float(len(probes))
        by_priority: dict[str, dict[str, float]] = {}
        for cls in d.by_priority:
            keys = class_keys[c]
            c += 1
            by_priority[cls] = dict(zip(keys, shares[at : at + len(keys)], strict=True))
            at += len(keys)
        shaped.append(_shaped(d, env, weights=out, reason=reason, inputs=inputs, by_priority=by_priority))
    return shaped


_ZERO = 0.0
_MOVED = frozenset(("open", "half_open"))  # the breaker states shaping zeroes a node for


def _unscaled_rows(  # noqa: PLR0917
    d: RoutingDecision,
    breakers: Mapping[str, BreakerDecision],
    in_rows: list[str],
    lo: int,
    stale_all: list[bool],
    warm_all: list[bool],
) -> tuple[list[float], dict[str, float], int, float, str] | None:
    """:func:`_unscaled` of a decision whose weights name exactly its pool's rows ``in_rows`` (from
    row ``lo`` of the columns), in that order, the rows sorted: the weights as a list in that
    order, without a step per node. None for any other decision, and for one that fails open
    (nothing left: :func:`_unscaled` spreads it over the warm nodes).

    The statement's loop visits the pool's ids in order; a stale node gets 0.0 (and counts as
    zeroed), an enforced open breaker's node 0.0, an enforced half-open one's 0.0 and a probe (its
    ``probe_frac`` when warm, else 0.0); every other node keeps its weight. Here: the weights list,
    stale rows overwritten with 0.0, then the breakers that can change a node (enforced, open or
    half-open, on a node of the pool that is not stale) applied in row order, so the probes are
    listed in the order the loop meets them; the total is Python's ``sum`` of the same list."""
    given = d.weights
    n = len(in_rows)
    if not n or len(given) != n or list(given) != in_rows or in_rows != sorted(in_rows):
        return None
    vals = list(given.values())
    hi = lo + n
    stale = stale_all[lo:hi]
    zeroed = stale.count(True)
    if zeroed:
        vals = [0.0 if s else w for w, s in zip(vals, stale, strict=True)]
    probes: dict[str, float] = {}
    hits: list[tuple[int, str, BreakerDecision]] | None = None
    where: dict[str, int] | None = None
    for node_id, b in breakers.items():
        if b.enforced and b.state in _MOVED:
            if where is None:
                where = dict(zip(in_rows, range(n), strict=True))
                hits = []
            r = where.get(node_id)
            if r is not None and not stale[r]:
                assert hits is not None
                hits.append((r, node_id, b))
    if hits:
        hits.sort(key=_first)
        for r, node_id, b in hits:
            vals[r] = 0.0
            if b.state == "half_open":
                probes[node_id] = b.probe_frac if warm_all[lo + r] else 0.0
    total = sum(vals)
    if total <= 0:
        return None
    return vals, probes, zeroed, total, d.reason


def _first(hit: tuple[int, str, BreakerDecision]) -> int:
    return hit[0]


def _renormalize(ws: Mapping[str, float]) -> dict[str, float]:
    total = sum(ws.values())
    if not total > 0:
        return {}
    keys = sorted(ws)
    if len(keys) < _ARRAY_FROM:
        return {n: r6(ws[n] / total) for n in keys}
    values = np.array([ws[n] for n in keys], dtype=np.float64) / total
    return dict(zip(keys, r6_array(values).tolist(), strict=True))


# Below this many weights a loop of ``r6`` costs less than the array calls (either gives the same
# doubles: one IEEE product or quotient each, rounded by ``r6`` or the bit-identical ``r6_array``).
_ARRAY_FROM = 8


def _scaled(weights: dict[str, float], scale: float) -> dict[str, float]:
    """``{n: r6(w * scale)}`` in the weights' order."""
    if len(weights) < _ARRAY_FROM:
        return {n: r6(w * scale) for n, w in weights.items()}
    values = np.array(list(weights.values()), dtype=np.float64) * scale
    return dict(zip(weights, r6_array(values).tolist(), strict=True))


def _shape_admission(d: AdmissionDecision, env: Envelope) -> AdmissionDecision:
    def floor(table: Mapping[str, int]) -> dict[str, int]:
        return {
            p: (max(v, env.min_queue_threshold) if int(p) <= env.protected_priority else max(v, 0))
            for p, v in sorted(table.items(), key=lambda kv: int(kv[0]))
        }

    return d.model_copy(
        update={
            "max_queue_depth": floor(d.max_queue_depth),
            "new_task_max_queue_depth": floor(d.new_task_max_queue_depth),
            "max_outstanding": floor(d.max_outstanding),
            "new_task_max_outstanding": floor(d.new_task_max_outstanding),
            "budget_protected_priority": env.protected_priority,
        }
    )


# Floored tables by (protected priority, queue floor, the table's items): a pool's admission tables
# take a handful of shapes across a fleet, and a tick floors four per pool.
_FLOORED: dict[tuple[int, int, tuple[tuple[str, int], ...]], tuple[tuple[str, int], ...]] = {}


def _shape_admission_fast(d: AdmissionDecision, env: Envelope) -> AdmissionDecision:
    """:func:`_shape_admission` (the statement; ``tests/unit/test_engine.py`` holds the two equal),
    each table floored once per distinct table and envelope (its items, every value an ``int``
    exactly, so a ``True`` or a ``1.0`` equal to ``1`` never reads another's entry) and the decision
    copied by :func:`updated`: the same dicts, in the same order, the same fields set."""
    protected, least = env.protected_priority, env.min_queue_threshold

    def floor(table: Mapping[str, int]) -> dict[str, int]:
        items = tuple(table.items())
        if not all(type(v) is int for _, v in items):
            return {
                p: (max(v, least) if int(p) <= protected else max(v, 0))
                for p, v in sorted(items, key=lambda kv: int(kv[0]))
            }
        key = (protected, least, items)
        found = _FLOORED.get(key)
        if found is None:
            if len(_FLOORED) >= 4096:  # bounded, whatever the tables
                _FLOORED.clear()
            found = _FLOORED[key] = tuple(
                (p, max(v, least) if int(p) <= protected else max(v, 0))
                for p, v in sorted(items, key=lambda kv: int(kv[0]))
            )
        return dict(found)

    return updated(
        d,
        {
            "max_queue_depth": floor(d.max_queue_depth),
            "new_task_max_queue_depth": floor(d.new_task_max_queue_depth),
            "max_outstanding": floor(d.max_outstanding),
            "new_task_max_outstanding": floor(d.new_task_max_outstanding),
            "budget_protected_priority": protected,
        },
    )


def pool_is_silent(snap: FleetSnapshot, pool_id: str) -> bool:
    """No fresh telemetry from any node of the pool: fleetloop knows nothing about the pool's
    capacity or demand right now (which is not the same as no demand). A pool with no node at all
    but with router outcomes in the window is not silent: that is demand with no capacity.

    Read from the fleet-wide figures (:mod:`fleetloop.policies.pool_figures`); :func:`pool_is_silent_plain`
    states it node by node."""
    figs = pool_figures(snap).get(pool_id)
    if figs is None:
        pool = snap.pools.get(pool_id)
        return pool is None or pool.requests_w == 0
    return figs.all_stale


def pool_is_silent_plain(snap: FleetSnapshot, pool_id: str) -> bool:
    nodes = snap.pool_nodes(pool_id)
    if not nodes:
        pool = snap.pools.get(pool_id)
        return pool is None or pool.requests_w == 0
    return all(n.stale for n in nodes)


def _freeze_autoscale(d: AutoscaleDecision, snap: FleetSnapshot, held: int | None) -> AutoscaleDecision:
    """A silent pool keeps its last target, never below the nodes it has: silence is not 'no demand'."""
    serving = sum(1 for n in snap.pool_nodes(d.pool_id) if not n.draining)
    base = held if held is not None else max(d.desired_nodes, d.current_nodes)
    frozen = max(base, serving)
    if frozen == d.desired_nodes and not d.drain:
        return d
    return _overruled(d, frozen, "silent-pool-frozen")


def _overruled(d: AutoscaleDecision, desired: int, why: str) -> AutoscaleDecision:
    """``d`` at ``desired`` nodes, draining none, its proposal kept in its inputs, ``why`` said."""
    inputs = dict(d.inputs)
    inputs["proposed_nodes"] = float(d.desired_nodes)
    return d.model_copy(
        update={"desired_nodes": desired, "drain": (), "reason": f"{d.reason}:{why}", "inputs": inputs}
    )


def _shape_autoscale(d: AutoscaleDecision, env: Envelope) -> AutoscaleDecision:
    lo = d.current_nodes - env.max_scale_step
    hi = d.current_nodes + env.max_scale_step
    desired = min(max(d.desired_nodes, lo, 0), hi)
    if desired == d.desired_nodes:
        return d
    drain = d.drain[: max(0, d.current_nodes - desired)]  # drain only the nodes this step removes
    return d.model_copy(
        update={"desired_nodes": desired, "drain": drain, "reason": f"{d.reason}:step-limited"}
    )


def settle_autoscale(
    d: AutoscaleDecision, snap: FleetSnapshot, env: Envelope, held: int | None, silent: bool
) -> AutoscaleDecision | None:
    """What the engine lets out of an autoscale proposal for its pool (None: nothing, this tick).

    No telemetry is "unknown", never "no nodes" (a control plane must not shrink a pool its absence
    would leave alone):

    - a pool with fresh telemetry: the proposal, step-limited (:func:`_shape_autoscale`);
    - a silent pool (:func:`pool_is_silent`): frozen at the target held (:func:`_freeze_autoscale`);
    - a pool no node of which is known (no telemetry row: a new pool, or a scraper not running or
      down long enough for the model to forget the nodes) while router outcomes show it serving:
      its size is unknown. The target held is a floor (the proposal may still scale up: demand with
      no capacity, a pool scaled to zero whose calls are shed), never a ceiling;
    - either of the last two with no target held and no node known: nothing. Any figure would be a
      guess at the size of a pool that may be serving (every HPA-style autoscaler proposes 0,
      ``no-nodes-yet``, and a Kubernetes actuator would scale the running pool away); the actuator
      keeps what it had, as it would without fleetloop (``control.state`` is compacted: the last
      target published stays there).

    Shared by :func:`decide` and :func:`decide_many`."""
    known = pool_figures(snap).get(d.pool_id) is not None
    if not known and held is None:
        return None
    if silent:
        return _freeze_autoscale(d, snap, held)
    shaped = _shape_autoscale(d, env)
    if known or held is None or shaped.desired_nodes >= held:
        return shaped
    return _overruled(d, held, "no-telemetry-held")


def decide(
    snap: FleetSnapshot,
    policy: CompiledPolicy,
    state: EngineState,
    tick: Tick,
    input_offsets: Mapping[str, int] | None = None,
) -> TickResult:
    """Decide for ``tick.pool_id`` as of ``snap.now_ms`` (== ``tick.ts_ms``)."""
    env = envelope_of(policy)
    pool_id = tick.pool_id
    seed = (tick.tick_id, zlib.crc32(pool_id.encode()))
    new_states = dict(state.algorithms)
    held = dict(state.autoscale_held)
    ejected = dict(state.ejections_held)
    bodies: list[tuple[str, DecisionBody]] = []
    breakers: dict[str, BreakerDecision] = {}
    diagnostics: dict[str, float] = {}
    for section in ORDER:
        sec = policy.sections[section]
        key = (section, sec.algorithm.name, pool_id)
        algo_state = state.algorithms.get(key)
        if algo_state is None:
            algo_state = sec.algorithm.initial_state()
        ctx = PolicyContext(
            now_ms=snap.now_ms,
            tick_id=tick.tick_id,
            tick_ms=policy.tick_ms,
            pool_id=pool_id,
            seed=seed,
            breakers=breakers,
            slo=policy.slo,
        )
        result = sec.algorithm.decide(snap, sec.params, algo_state, ctx)
        new_states[key] = result.state
        for k, v in result.diagnostics.items():
            diagnostics[f"{section}.{k}"] = float(v)
        produced = list(result.decisions)
        if section == "breaker":
            shaped = [d for d in produced if isinstance(d, BreakerDecision)]
            if sec.mode == "shadow":
                shaped = [
                    d.model_copy(update={"enforced": False}) if d.state != "closed" else d for d in shaped
                ]
            shaped = _cap_ejections(shaped, snap, pool_id, env, ejected.get(pool_id))
            _hold(ejected, pool_id, shaped)
            breakers.update({d.node_id: d for d in shaped})
            produced = list(shaped)
        elif section == "routing":
            routed: list[DecisionBody | None] = [
                _shape_routing(d, snap, breakers, env) if isinstance(d, RoutingDecision) else d
                for d in produced
            ]
            produced = [d for d in routed if d is not None]
        elif section == "admission":
            produced = [_shape_admission(d, env) if isinstance(d, AdmissionDecision) else d for d in produced]
        elif section == "autoscale":
            silent = pool_is_silent(snap, pool_id)
            shaped_as: list[DecisionBody] = []
            for d in produced:
                if isinstance(d, AutoscaleDecision):
                    # Frozen (silent), held (unknown) or nothing: settle_autoscale.
                    settled = settle_autoscale(d, snap, env, held.get(d.pool_id), silent)
                    if settled is None:
                        continue
                    d = settled
                    if sec.mode == "enforce":
                        held[d.pool_id] = d.desired_nodes
                shaped_as.append(d)
            produced = shaped_as
        bodies.extend((sec.mode, d) for d in produced)
    offsets = dict(sorted((input_offsets or {}).items()))
    # Every part of the envelope is validated once per tick (the stamps, the offsets) or already was
    # (the tick, each body), so the per-decision wrapper is assembled without validating it again.
    stamps = {
        mode: PolicyStamp(
            name=policy.stamp.name, version=policy.stamp.version, hash=policy.stamp.hash, mode=mode
        )
        for mode in sorted({mode for mode, _ in bodies})
    }
    offsets = _OFFSETS.validate_python(offsets)
    ts_ms, tick_id = tick.ts_ms, tick.tick_id
    decisions = tuple(
        assemble(
            Decision,
            {
                "ts_ms": ts_ms,
                "tick_id": tick_id,
                "policy": stamps[mode],
                "input_offsets": offsets,
                "body": body,
            },
            set(_DECISION_FIELDS),
        )
        for mode, body in bodies
    )
    # Keep only states of this policy's algorithms (other pools' states are kept as they were).
    live = {(s, policy.sections[s].algorithm.name) for s in ORDER}
    kept = {k: v for k, v in new_states.items() if (k[0], k[1]) in live}
    diagnostics["decisions"] = float(len(decisions))
    return TickResult(decisions=decisions, state=EngineState(kept, held, ejected), diagnostics=diagnostics)


# ``decide_many``'s cheaper parts: diagnostics keys built once, and one fields set shared by every
# wrapper it builds. A frozen model never changes its fields set in place (``model_copy`` copies it
# before adding the updated names), and a set is one more object for the cyclic collector to track
# per decision: ~15,000 a tick at 10,000 nodes, which tipped a whole-fleet tick past the daemon's
# young-generation threshold (100,000) into a collection of ~55 ms inside the tick.
_DIAG_KEYS: dict[tuple[str, str], str] = {}
_FIELDS_SET = set(_DECISION_FIELDS)
_object_setattr = object.__setattr__
_new_decision = Decision.__new__


def _diag_key(section: str, k: str) -> str:
    key = _DIAG_KEYS.get((section, k))
    if key is None:
        if len(_DIAG_KEYS) >= 4096:  # keys come from algorithms: bounded, whatever they report
            _DIAG_KEYS.clear()
        key = _DIAG_KEYS[(section, k)] = f"{section}.{k}"
    return key


def _wrap(
    body: DecisionBody, ts_ms: int, tick_id: int, stamp: PolicyStamp, offsets: dict[str, int]
) -> Decision:
    """:func:`assemble` of one ``Decision`` (the same ``__dict__``, fields and extras), inlined, its
    fields set shared (``_FIELDS_SET``)."""
    m = _new_decision(Decision)
    _object_setattr(
        m,
        "__dict__",
        {"ts_ms": ts_ms, "tick_id": tick_id, "policy": stamp, "input_offsets": offsets, "body": body},
    )
    _object_setattr(m, "__pydantic_fields_set__", _FIELDS_SET)
    _object_setattr(m, "__pydantic_extra__", None)
    _object_setattr(m, "__pydantic_private__", None)
    return m


def decide_many(
    snap: FleetSnapshot,
    policy: CompiledPolicy,
    states: Sequence[EngineState],
    ticks: Sequence[Tick],
    input_offsets: Mapping[str, int] | None = None,
) -> list[TickResult]:
    """``[decide(snap, policy, s, t, input_offsets) for s, t in zip(states, ticks)]``, equal bit for
    bit (decisions in the same order, states, diagnostics), for ticks of one boundary: one per pool
    (distinct pool ids), all with the same ``ts_ms`` and ``tick_id``. :func:`decide` is the statement;
    ``tests/unit/test_decide_many.py`` holds the two equal.

    Section by section over the whole batch instead of pool by pool: each section's algorithm
    decides every pool in one call (its ``decide_pools``, :class:`fleetloop.policies.base.BatchAlgorithm`,
    given the pools in pool-id order) when it has one, else in a loop of its ``decide``; the
    envelope then shapes that section's decisions pool by pool (the ejection cap only where an
    enforced breaker is open). The stamps and offsets are validated once per batch and the
    decision wrappers are built without a call each. Pure, like :func:`decide`: the states given are
    not changed; if any pool's tick raises, the whole call raises (the caller may then decide the
    ticks one by one to isolate it)."""
    n = len(ticks)
    if len(states) != n:
        raise ValueError(f"decide_many: {len(states)} states for {n} ticks")
    if n == 0:
        return []
    ts_ms, tick_id = ticks[0].ts_ms, ticks[0].tick_id
    order = sorted(range(n), key=lambda i: ticks[i].pool_id)
    pool_ids = [ticks[i].pool_id for i in order]
    for t in ticks:
        if t.ts_ms != ts_ms or t.tick_id != tick_id:
            raise ValueError("decide_many: the ticks of one batch share ts_ms and tick_id")
    if len(set(pool_ids)) != n:
        raise ValueError("decide_many: one tick per pool")
    env = envelope_of(policy)
    pool_states = [states[i] for i in order]
    now_ms, tick_ms, slo = snap.now_ms, policy.tick_ms, policy.slo
    breakers: list[dict[str, BreakerDecision]] = [{} for _ in range(n)]
    ctxs = [
        PolicyContext(
            now_ms=now_ms,
            tick_id=tick_id,
            tick_ms=tick_ms,
            pool_id=pid,
            seed=(tick_id, zlib.crc32(pid.encode())),
            breakers=breakers[j],
            slo=slo,
        )
        for j, pid in enumerate(pool_ids)
    ]
    produced_states: list[list[Any]] = [[] for _ in range(n)]  # per pool, per section in ORDER
    diagnostics: list[dict[str, float]] = [{} for _ in range(n)]
    # Per pool, per section: the section's mode and its shaped decisions (no tuple per decision).
    bodies: list[list[tuple[Mode, list[DecisionBody]]]] = [[] for _ in range(n)]
    held = [dict(st.autoscale_held) for st in pool_states]
    ejected = [dict(st.ejections_held) for st in pool_states]
    to_route: list[tuple[list[DecisionBody], int]] = []  # where each routing decision goes
    route_items: list[tuple[RoutingDecision, Mapping[str, BreakerDecision]]] = []
    for section in ORDER:
        sec = policy.sections[section]
        algorithm = sec.algorithm
        name = algorithm.name
        algo_states: list[Any] = []
        for j, st in enumerate(pool_states):
            algo_state = st.algorithms.get((section, name, pool_ids[j]))
            algo_states.append(algorithm.initial_state() if algo_state is None else algo_state)
        # A context is the same as a fresh one until its generator is drawn from: keep it till then.
        for j, ctx in enumerate(ctxs):
            if ctx._rng:
                ctxs[j] = PolicyContext(
                    now_ms=now_ms,
                    tick_id=tick_id,
                    tick_ms=tick_ms,
                    pool_id=ctx.pool_id,
                    seed=ctx.seed,
                    breakers=breakers[j],
                    slo=slo,
                )
        batch = getattr(algorithm, "decide_pools", None)
        if batch is not None:
            results = list(batch(snap, sec.params, algo_states, list(ctxs)))
            if len(results) != n:
                raise ValueError(f"{section}: decide_pools returned {len(results)} results for {n} pools")
        else:
            decide_one = algorithm.decide
            params = sec.params
            results = [decide_one(snap, params, s, c) for s, c in zip(algo_states, ctxs, strict=True)]
        mode = sec.mode
        shadow = mode == "shadow"
        for j, result in enumerate(results):
            produced_states[j].append(result.state)
            if result.diagnostics:
                diag = diagnostics[j]
                for k, v in result.diagnostics.items():
                    diag[_diag_key(section, k)] = float(v)
            out = bodies[j]
            if section == "breaker":
                shaped: list[BreakerDecision] = []
                capped = False
                for d in result.decisions:
                    if isinstance(d, BreakerDecision):
                        if d.state != "closed":
                            if shadow:
                                d = d.model_copy(update={"enforced": False})
                            elif d.enforced and d.state == "open":
                                capped = True
                        shaped.append(d)
                if capped:
                    shaped = _cap_ejections(shaped, snap, pool_ids[j], env, ejected[j].get(pool_ids[j]))
                _hold(ejected[j], pool_ids[j], shaped)
                breakers[j].update({d.node_id: d for d in shaped})
                out.append((mode, cast("list[DecisionBody]", shaped)))
            elif section == "routing":
                # Shaped for the whole batch below (_shape_routing_many): here, where each goes.
                routed = list(result.decisions)
                for i, d in enumerate(routed):
                    if isinstance(d, RoutingDecision):
                        to_route.append((routed, i))
                        route_items.append((d, breakers[j]))
                out.append((mode, routed))
            elif section == "admission":
                out.append(
                    (
                        mode,
                        [
                            _shape_admission_fast(d, env) if isinstance(d, AdmissionDecision) else d
                            for d in result.decisions
                        ],
                    )
                )
            elif section == "autoscale":
                silent = pool_is_silent(snap, pool_ids[j])
                scaled: list[DecisionBody] = []
                for d in result.decisions:
                    if isinstance(d, AutoscaleDecision):
                        settled = settle_autoscale(d, snap, env, held[j].get(d.pool_id), silent)
                        if settled is None:
                            continue
                        d = settled
                        if mode == "enforce":
                            held[j][d.pool_id] = d.desired_nodes
                    scaled.append(d)
                out.append((mode, scaled))
            else:
                out.append((mode, list(result.decisions)))
        if route_items:
            dropped: dict[int, tuple[list[DecisionBody], list[int]]] = {}
            for (routed, i), shaped_d in zip(
                to_route, _shape_routing_many(route_items, snap, env), strict=True
            ):
                if shaped_d is None:  # nothing to route to: no decision, as in decide
                    dropped.setdefault(id(routed), (routed, []))[1].append(i)
                else:
                    routed[i] = shaped_d
            for routed, at in dropped.values():
                for i in reversed(at):
                    del routed[i]
            to_route.clear()
            route_items.clear()
    offsets = _OFFSETS.validate_python(dict(sorted((input_offsets or {}).items())))
    stamps: dict[Mode, PolicyStamp] = {}
    ps = policy.stamp
    live = {(s, policy.sections[s].algorithm.name) for s in ORDER}
    keys_of = [(s, policy.sections[s].algorithm.name) for s in ORDER]
    results_out: list[TickResult | None] = [None] * n
    for j, pid in enumerate(pool_ids):
        decisions: list[Decision] = []
        append = decisions.append
        for sec_mode, section_bodies in bodies[j]:
            if not section_bodies:
                continue
            stamp = stamps.get(sec_mode)
            if stamp is None:
                stamp = stamps[sec_mode] = PolicyStamp(
                    name=ps.name, version=ps.version, hash=ps.hash, mode=sec_mode
                )
            for body in section_bodies:
                append(_wrap(body, ts_ms, tick_id, stamp, offsets))
        old = pool_states[j].algorithms
        new_states = dict(old)
        for (section, name), st in zip(keys_of, produced_states[j], strict=True):
            new_states[(section, name, pid)] = st
        if len(new_states) == len(keys_of):  # the pool's own states only (every key set just above)
            kept = new_states
        else:
            kept = {k: v for k, v in new_states.items() if (k[0], k[1]) in live}
        diag = diagnostics[j]
        diag["decisions"] = float(len(decisions))
        results_out[order[j]] = TickResult(
            decisions=tuple(decisions), state=EngineState(kept, held[j], ejected[j]), diagnostics=diag
        )
    return [r for r in results_out if r is not None]


class Engine:
    """A convenience holder for ``(policy, state)`` around :func:`decide`; still no I/O.

    State is kept per pool: a pool's tick reads and replaces only its own algorithms' states, so a
    whole-fleet tick costs the sum of its pools, not pools squared."""

    def __init__(self, policy: CompiledPolicy) -> None:
        self.policy = policy
        self.pools: dict[str, EngineState] = {}

    @property
    def state(self) -> EngineState:
        """Every pool's states in one :class:`EngineState` (for inspection; ``tick`` does not use it)."""
        merged: dict[tuple[str, str, str], Any] = {}
        held: dict[str, int] = {}
        ejected: dict[str, Mapping[str, int | None]] = {}
        for pool_id in sorted(self.pools):
            merged.update(self.pools[pool_id].algorithms)
            held.update(self.pools[pool_id].autoscale_held)
            ejected.update(self.pools[pool_id].ejections_held)
        return EngineState(merged, held, ejected)

    def retain(self, pools: Collection[str]) -> int:
        """Forget the state of every pool not in ``pools`` (the model evicted it); returns how many."""
        gone = [p for p in self.pools if p not in pools]
        for p in gone:
            del self.pools[p]
        return len(gone)

    @property
    def envelope(self) -> Envelope:
        return envelope_of(self.policy)

    def set_policy(self, policy: CompiledPolicy) -> None:
        self.policy = policy

    def tick(
        self, snap: FleetSnapshot, tick: Tick, input_offsets: Mapping[str, int] | None = None
    ) -> TickResult:
        result = decide(snap, self.policy, self.pools.get(tick.pool_id, _EMPTY), tick, input_offsets)
        self.pools[tick.pool_id] = result.state
        return result

    def tick_many(
        self, snap: FleetSnapshot, ticks: Sequence[Tick], input_offsets: Mapping[str, int] | None = None
    ) -> list[TickResult]:
        """:meth:`tick` for each of ``ticks`` (one boundary, one tick per pool) in one
        :func:`decide_many`; the results in the order of ``ticks``."""
        pools = self.pools
        results = decide_many(
            snap, self.policy, [pools.get(t.pool_id, _EMPTY) for t in ticks], ticks, input_offsets
        )
        for t, result in zip(ticks, results, strict=True):
            pools[t.pool_id] = result.state
        return results
