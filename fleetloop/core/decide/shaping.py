"""The safety envelope's shaping of a tick's decisions (:mod:`fleetloop.policies.envelope`), section
by section: the breakers' ejections capped (:func:`cap_ejections`), routing weights with stale and
ejected nodes zeroed and probing nodes given their share (:func:`shape_routing`), admission tables
floored (:func:`shape_admission`), and autoscale targets step-limited or, for a silent pool,
frozen (:func:`shape_autoscale`, :func:`freeze_autoscale`). Pure: the same decisions, snapshot and
envelope give the same shaped decisions, byte for byte.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

import numpy as np

from fleetloop.policies.autoscale.committed import committed
from fleetloop.policies.base import FleetSnapshot, r6, r6_array
from fleetloop.policies.columns import fleet_columns
from fleetloop.policies.envelope import Envelope
from fleetloop.policies.pool_figures import pool_figures, row_ids
from fleetloop.schemas.base import updated
from fleetloop.schemas.decisions import AdmissionDecision, AutoscaleDecision, BreakerDecision, RoutingDecision


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


def hold(
    ejected: dict[str, Mapping[str, int | None]], pool_id: str, shaped: Sequence[BreakerDecision]
) -> None:
    """Set the pool's held ejections in ``ejected`` to those of its tick's shaped breaker decisions
    (none: the pool's entry is dropped, so a pool with no ejection keeps no entry)."""
    now = held_after(shaped)
    if now:
        ejected[pool_id] = now
    else:
        ejected.pop(pool_id, None)


HELD = "held-to-its-end"  # the reason of an ejection the engine holds where its breaker would not
HOLD_ENDED = "hold-ended"  # the reason of the closed record that ends such a hold


def keep_held(
    decisions: list[BreakerDecision],
    snap: FleetSnapshot,
    pool_id: str,
    held: Mapping[str, int | None] | None,
) -> list[BreakerDecision]:
    """Rule (3) of :func:`cap_ejections` where the breaker does not propose the ejection enforced:
    an ejection the engine let out enforced at the pool's last tick, with an end still ahead
    (``now < until_ms``), is published open and enforced to that end whatever the breaker now
    proposes for the node (closed, half-open, detected only, or nothing: an absent node is closed),
    reason ``held-to-its-end``. This is the one place the rule is kept, for every breaker; a breaker
    judges each tick afresh and does not hold what it published. A breaker proposes an ejection it
    still has open detected only when a rule of its own would now withhold it (latency-outlier's
    pool-wide, queueing and panic rules, read from a window that empties once routers stop sending
    to the node), and lets go of a node it no longer judges: Envoy's forgets a host that leaves the
    endpoints (stale, cold, draining), and one that comes back is a new host. Without this the
    ejection was released for a tick and taken back (a flap), or for as long as the node was away
    (to a pool's even spread when every node fell to weight 0) and at once when it came back,
    failing or not. Only what the engine let out enforced is held: an ejection it capped was never
    enforced, and its breaker's next proposal is judged afresh.

    At the first tick at or past the end, a node the breaker says nothing of (so closed, since every
    record that is not closed is published every tick) gets a closed record, reason ``hold-ended``:
    a router keeps the newest record, which was the held one. Only the pool's nodes in the snapshot
    are held; an ejection with no end given is held only while its breaker keeps it open."""
    if not held:
        return decisions
    now = snap.now_ms
    cols = fleet_columns(snap)
    lo, hi = cols.bounds.get(pool_id, (0, 0))
    present = set(row_ids(snap)[lo:hi])
    at = {d.node_id: i for i, d in enumerate(decisions)}
    out = list(decisions)
    for node_id, until in sorted(held.items()):
        if until is None or node_id not in present:
            continue
        i = at.get(node_id)
        d = out[i] if i is not None else None
        if now < until:
            if d is not None and d.state == "open" and d.enforced:
                continue
            rec = BreakerDecision(
                entity=f"node/{node_id}",
                pool_id=pool_id,
                node_id=node_id,
                state="open",
                until_ms=until,
                ejections=d.ejections if d is not None else 0,
                reason=HELD,
            )
        elif d is None:
            rec = BreakerDecision(
                entity=f"node/{node_id}", pool_id=pool_id, node_id=node_id, state="closed", reason=HOLD_ENDED
            )
        else:
            continue
        if i is None:
            out.append(rec)
        else:
            out[i] = rec
    return out


def cap_ejections(
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
    still shields a failure the whole pool shares, and latency-outlier's queueing rule a streak of
    timeouts on a node that keeps completing calls at its peers' speed). A node with no call in the
    window has no success share of its own; an empty window is not "all ok" (ejecting a node the
    routers stopped sending to would read as moving its whole load): it is read as its pool's, the
    other serving nodes' success share. Only when no serving node of the pool took a call (a
    deployment without router outcomes, scrape only) does the node's telemetry alone say what it
    carries.

    A slow node carries little useful work (its ``speed_i``), so it too may be ejected into a busy
    pool; a pool-wide slowdown leaves no spare anywhere and no node slow against the median, so
    nothing is ejected for it (ejecting would pile the same load on fewer, equally slow nodes).

    (3) Held ejections: ``held`` is what :func:`held_after` took from the pool's last tick (node ->
    ``until_ms``). A candidate in it whose end is still ahead (``now < until_ms``, or no end given)
    stays enforced without being judged again by (2): its work already moved to the others (their
    telemetry shows it), and its window empties once routers stop sending to it, so a fresh
    judgement would release it for one tick and take it back the next (a flap). It comes back
    through its breaker: half-open at the end of its backoff, a probe share, then closed or open
    again. A breaker that lets go of it before its end (stops judging the node, or a rule of its own
    would now withhold it) does not release it either: :func:`keep_held` publishes it held. Only (1)
    can release a held ejection early, when the pool shrank under it (the envelope's bound comes
    first).

    Inputs: the breaker decisions of the pool's tick (open and enforced ones are the candidates),
    per node ``consecutive_failures``, ``ok_w``, ``requests_w``, ``queue_depth``,
    ``kv_cache_used_frac``, ``tbt_p50_ms``, ``warm``, ``stale``; ``envelope.max_ejected_frac``
    (default 0.5); ``held``. Failure modes: a node that answers but fails (a streak) in a pool-wide
    outage is ejected up to the share cap; the breaker's pool-wide rule, not this cap, keeps such
    ejections detected only. A pool without router outcomes judges a latency ejection by speed and
    load alone. A held ejection of a node that recovered during its backoff stays out until then.

    The pool's nodes are read from the snapshot's columns (no view built); ``tests.oracles.engine``
    states the same rule over the views."""
    open_ = [d for d in decisions if d.state == "open" and d.enforced]
    if not open_:
        return decisions
    cap, spare, moves, severity = _pool_capacity(snap, pool_id, env, {d.node_id for d in open_})
    ordered = sorted(open_, key=severity)
    return _unenforce(
        decisions, _choose(ordered, held or {}, now_ms=snap.now_ms, cap=cap, spare=spare, moves=moves)
    )


def _pool_capacity(
    snap: FleetSnapshot, pool_id: str, env: Envelope, candidates: set[str]
) -> tuple[int, float, Callable[[str], float | None], Callable[[BreakerDecision], tuple[float, str]]]:
    """The figures :func:`cap_ejections` judges ``candidates`` (the open, enforced nodes) by, from the
    pool's rows of the snapshot's columns: the share cap (1), the spare of the serving nodes that are
    not candidates (2), a node's useful work (``moves``: None when it is not serving) and the
    candidates' order (``severity``: most consecutive failures first, then node id)."""
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
    return cap, spare, moves, severity


def _choose(
    ordered: Sequence[BreakerDecision],
    held: Mapping[str, int | None],
    *,
    now_ms: int,
    cap: int,
    spare: float,
    moves: Callable[[str], float | None],
) -> dict[str, str]:
    """Rules (1)-(3) of :func:`cap_ejections` over the candidates, worst first: the held
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
    """The share of a candidate's calls that would succeed: ``ok_i`` of :func:`cap_ejections`."""
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
    """Routing shaping's first step for one decision (:func:`shape_routing`): a pool's weights
    before scaling (stale, unknown and ejected nodes
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


# One decision's weights before scaling: its keys, probes, probe scale, nodes zeroed as stale, reason.
_Staged = tuple[Sequence[str], dict[str, float], float, int, str]


def shape_routing(
    items: Sequence[tuple[RoutingDecision, Mapping[str, BreakerDecision]]],
    snap: FleetSnapshot,
    env: Envelope,
) -> list[RoutingDecision | None]:
    """Shape each routing decision of a tick, given its pool's shaped breaker decisions: zero stale
    and ejected nodes, give probing (half-open) nodes their probe share, fail open if every weight
    is zero; None when no node is left to route to even then (:data:`NO_NODE`: the pool gets no
    routing decision this tick). Then every weight is scaled to the share left after the probes
    (probing nodes share at most half of the traffic, however many are half-open at once) and
    rounded (``r6``); each priority class's table is cut to the nodes left serving and
    renormalized; the spill list is cut to the envelope's ``max_spill_pools``.

    Pool by pool the same steps (``tests.oracles.engine.shape_routing_plain`` states them for one
    decision), but the rows' flags are read once for the batch and every rounding (each weight's
    ``r6(w * scale)``, each class's ``r6(w / total)``) is done in two :func:`r6_array` calls for
    the whole batch: each element is the same one IEEE product or quotient either way, rounded by
    ``r6`` or the bit-identical ``r6_array``. No Python step per node where a decision's weights
    name exactly its pool's rows, in the rows' (node-id) order, as cache-aware routing gives them
    (:func:`_unscaled_rows`); any other decision, and one that fails open, goes through
    :func:`_unscaled`."""
    if not items:
        return []
    staged, values, scales, counts = _stage(items, snap)
    with np.errstate(over="ignore", invalid="ignore"):
        products = np.array(values, dtype=np.float64) * np.repeat(np.array(scales, dtype=np.float64), counts)
    rounded: list[float] = r6_array(products).tolist()
    outs, class_keys, class_values, class_totals, class_counts = _class_tables(items, staged, rounded)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        quotients = np.array(class_values, dtype=np.float64) / np.repeat(
            np.array(class_totals, dtype=np.float64), class_counts
        )
    shares: list[float] = r6_array(quotients).tolist()
    shaped: list[RoutingDecision | None] = []
    at = c = 0
    for (d, _), (_, probes, _, zeroed, reason), out in zip(items, staged, outs, strict=True):
        if reason == NO_NODE:  # nothing to route to: no decision
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


def _stage(
    items: Sequence[tuple[RoutingDecision, Mapping[str, BreakerDecision]]], snap: FleetSnapshot
) -> tuple[list[_Staged], list[float], list[float], list[int]]:
    """Step 1 of :func:`shape_routing`, per decision: its weights before scaling (all decisions'
    in one list), its scale, how many weights it has, and what the later steps need of it."""
    cols = fleet_columns(snap)
    bounds = cols.bounds
    all_ids = row_ids(snap)
    stale_all: list[bool] = cols.stale.tolist()
    warm_all: list[bool] = cols.warm.tolist()
    staged: list[_Staged] = []
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
    return staged, values, scales, counts


def _class_tables(
    items: Sequence[tuple[RoutingDecision, Mapping[str, BreakerDecision]]],
    staged: Sequence[_Staged],
    rounded: list[float],
) -> tuple[list[dict[str, float]], list[list[str]], list[float], list[float], list[int]]:
    """Step 3 of :func:`shape_routing`, per decision: its shaped weights (``rounded`` in its keys'
    order, then its probes), and each class's weights over the nodes left serving (their keys,
    all classes' values in one list, each class's total and count; an empty class has no total)."""
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
    return outs, class_keys, class_values, class_totals, class_counts


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


# Floored tables by (protected priority, queue floor, the table's items): a pool's admission tables
# take a handful of shapes across a fleet, and a tick floors four per pool.
_FLOORED: dict[tuple[int, int, tuple[tuple[str, int], ...]], tuple[tuple[str, int], ...]] = {}


def shape_admission(d: AdmissionDecision, env: Envelope) -> AdmissionDecision:
    """Floor the admission tables: a priority at or above the protected one (numerically at most
    ``protected_priority``) keeps at least ``min_queue_threshold``, every other at least 0; the
    tables in priority order. Each table is floored once per distinct table and envelope (its
    items, every value an ``int`` exactly, so a ``True`` or a ``1.0`` equal to ``1`` never reads
    another's entry: such a table is floored on its own), and the decision copied by
    :func:`updated` (``tests.oracles.engine`` states it with ``model_copy``)."""
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

    Read from the fleet-wide figures (:mod:`fleetloop.policies.pool_figures`): all of its nodes
    stale."""
    figs = pool_figures(snap).get(pool_id)
    if figs is None:
        pool = snap.pools.get(pool_id)
        return pool is None or pool.requests_w == 0
    return figs.all_stale


def freeze_autoscale(d: AutoscaleDecision, snap: FleetSnapshot, held: int | None) -> AutoscaleDecision:
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


def shape_autoscale(d: AutoscaleDecision, env: Envelope, held: int | None = None) -> AutoscaleDecision:
    """``d`` at most ``max_scale_step`` nodes from the current count. A decrease counts from the
    lower of that count and the target ``held`` (last let out): nodes already asked to go back that
    the actuator has not removed yet are no step, and counting from them would raise a held target
    back up each tick until they are gone (a flapping target on an idle pool)."""
    lo = committed(held, d.current_nodes) - env.max_scale_step
    hi = d.current_nodes + env.max_scale_step
    desired = min(max(d.desired_nodes, lo, 0), hi)
    if desired == d.desired_nodes:
        return d
    drain = d.drain[: max(0, d.current_nodes - desired)]  # drain only the nodes this step removes
    return d.model_copy(
        update={"desired_nodes": desired, "drain": drain, "reason": f"{d.reason}:step-limited"}
    )


# A pool's autoscale drain list as the engine holds it from one tick to the next (:func:`keep_draining`).
@dataclass(frozen=True, slots=True)
class PoolDrains:
    """``listed``: the nodes on the list, in the order asked. ``since``: per listed node, the event
    time (ms) from which its grace counts: when it was put on the list, or the last tick it was
    seen leaving (stale or draining by its own telemetry) since. ``taken``: the nodes the grace took
    back, each with the pool's target at its take-back; an autoscaler's new list does not name them
    while the target has not fallen below that."""

    listed: tuple[str, ...] = ()
    since: Mapping[str, int] = field(default_factory=dict)
    taken: Mapping[str, int] = field(default_factory=dict)


NO_DRAINS = PoolDrains()
# The grace when the autoscale decision carries no lead of its own (``inputs["lead_s"]``: the
# HPA-style autoscalers): the cold start slo-predictive and capacity plan over before they learn one.
GRACE_WITHOUT_LEAD_S = 120.0


def drain_grace_ms(d: AutoscaleDecision, env: Envelope) -> float:
    """How long a node on the pool's drain list may keep reporting, fresh and not draining by its
    own telemetry, before :func:`keep_draining` takes it back: the autoscaler's lead (its decision's
    ``lead_s`` input: the pool's cold start, learned from its nodes, else the policy's figure),
    :data:`GRACE_WITHOUT_LEAD_S` without one, never under ``stale_after_ms + window_ms``.

    Why the lead. It is the slowest thing the fleet is expected to do (provision a node, boot it,
    load its weights) and the horizon the autoscaler plans capacity over; giving a node back is
    quicker (its actuator acts within a reconcile, the node's calls finish, it stops). A node still
    serving-ready a whole lead after it was asked to go is one the fleet's own floor keeps (the
    simulator's ``min_nodes``, an orchestrator's minimum replicas): held out of rotation it idles,
    paid for, while its pool's pressure is read over the others. The floor: a node its actuator
    removes at once still reports until it stops and reads stale ``stale_after_ms`` later, after a
    tick that may come a window after the one that named it; a shorter lead (a tiny learned cold
    start, a ``cold_start_s`` of 0) must not take back a node that is being removed."""
    lead = d.inputs.get("lead_s")
    lead_ms = lead * 1000.0 if lead is not None and math.isfinite(lead) else GRACE_WITHOUT_LEAD_S * 1000.0
    return max(lead_ms, float(env.stale_after_ms + env.window_ms))


def keep_draining(
    d: AutoscaleDecision, snap: FleetSnapshot, held: PoolDrains, grace_ms: float
) -> tuple[AutoscaleDecision, PoolDrains]:
    """``d`` with the pool's drain list held, and the list to hold for its next tick: a node the
    engine let out on the pool's drain list stays on it until it is gone from the pool, until a
    target above the nodes left serving takes it back, or until it has kept reporting, ready to
    serve, for ``grace_ms`` (:func:`drain_grace_ms`). ``held`` is what the pool's last tick let out.

    An autoscaler names the nodes to give back on the tick its target falls, once (slo-predictive),
    or names its surplus afresh each tick, perhaps other nodes as their load moves (capacity, the
    HPA-style ones). A router that follows ``control.state`` keeps the newest decision per pool, so
    a drain list published once was undone at the next tick: the node went back into rotation
    until the actuator removed it. The rule, over the pool's rows in the snapshot, ``leaving`` being
    a node stale or draining by its own telemetry:

    1. a node the grace took back (``held.taken``) is not named again while the target
       (``d.desired_nodes``) is not below the target at its take-back; once it is, or once the node
       is gone from the pool, the node is free to be named again;
    2. the list is the one let out, less the nodes no longer in the pool (forgotten by the fleet
       model: silent past ``forget_node_after_ms``), then the nodes ``d`` names that it lacks (less
       those of 1), in ``d``'s order. A node that went stale (its actuator removed it) stays on the
       list until it is forgotten: should it report again under its id in between, it is still
       draining;
    3. grace: a listed node's grace counts from when it was put on the list, or from the last tick
       it was seen leaving; one not leaving whose grace has run ``grace_ms`` is taken back
       (evidence the fleet will not remove it: its own floor keeps it) and remembered with the
       target for 1. The target is not changed;
    4. ``serving`` = the pool's nodes not leaving and not on the list. While ``serving <
       d.desired_nodes`` the most recently asked node on the list that is not leaving is taken back
       (last in, first out: the newest drain is the one its actuator is least likely to have
       begun, and within a tick ``d.drain`` lists the best candidates first).

    So a node asked to drain is never counted as capacity while it stays on the list, a target
    that rises again takes back warm nodes still there before any new node is needed (without an
    actuator acting at all, the nodes it never removed serve again), an autoscaler that names
    other nodes for the same surplus keeps the ones named first, and a node the fleet keeps is back
    in rotation a grace later and not named again for the same surplus (an autoscaler that names its
    surplus afresh each tick would otherwise drain it and take it back every grace). Nodes that are
    leaving are not taken back (they are leaving whatever the list says).

    Pure: the times are the snapshot's event time; a node on the list with no time (a checkpoint
    written before the grace was kept) counts its grace from this tick."""
    draining, since_held, taken_held = held.listed, held.since, held.taken
    if not draining and not d.drain and not taken_held:
        return d, NO_DRAINS
    cols = fleet_columns(snap)
    lo, hi = cols.bounds.get(d.pool_id, (0, 0))
    ids = row_ids(snap)[lo:hi]
    row = {node_id: r for r, node_id in enumerate(ids)}
    leaving = (cols.stale[lo:hi] | cols.draining[lo:hi]).tolist()
    now = snap.now_ms
    target = d.desired_nodes
    taken = {i: at for i, at in taken_held.items() if i in row and target >= at}
    listed = [i for i in draining if i in row]
    on = set(listed)
    for i in d.drain:
        if i not in on and i not in taken:
            on.add(i)
            listed.append(i)
    since: dict[str, int] = {}
    kept: list[str] = []
    for i in listed:
        r = row[i]
        t = now if leaving[r] else since_held.get(i, now)
        if not leaving[r] and now - t >= grace_ms:
            taken[i] = target
            on.discard(i)
            continue
        since[i] = t
        kept.append(i)
    serving = sum(1 for r, i in enumerate(ids) if not leaving[r] and i not in on)
    for k in range(len(kept) - 1, -1, -1):
        if serving >= target:
            break
        if not leaving[row[kept[k]]]:
            del since[kept[k]]
            del kept[k]
            serving += 1
    drain = tuple(kept)
    out = d if drain == d.drain else d.model_copy(update={"drain": drain})
    return out, PoolDrains(drain, since, dict(sorted(taken.items())))


def hold_drains(drains: dict[str, PoolDrains], pool_id: str, held: PoolDrains) -> None:
    """Set the pool's held drain list in ``drains`` (none listed and none taken back: the pool's
    entry is dropped, so a pool with nothing draining keeps no entry)."""
    if held.listed or held.taken:
        drains[pool_id] = held
    else:
        drains.pop(pool_id, None)


def settle_autoscale(  # noqa: PLR0917 - the proposal, the snapshot, the envelope, then what is held
    d: AutoscaleDecision,
    snap: FleetSnapshot,
    env: Envelope,
    held: int | None,
    silent: bool,
    drains: PoolDrains = NO_DRAINS,
) -> tuple[AutoscaleDecision, PoolDrains] | None:
    """What the engine lets out of an autoscale proposal for its pool (None: nothing, this tick), with
    the pool's drain list to hold for its next tick. Whatever the target, the pool's drain list is
    held (:func:`keep_draining`, its grace :func:`drain_grace_ms`): ``drains`` is the one let out
    at the pool's last tick.

    No telemetry is "unknown", never "no nodes" (a control plane must not shrink a pool its absence
    would leave alone):

    - a pool with fresh telemetry: the proposal, step-limited (:func:`shape_autoscale`);
    - a silent pool (:func:`pool_is_silent`): frozen at the target held (:func:`freeze_autoscale`);
    - a pool no node of which is known (no telemetry row: a new pool, or a scraper not running or
      down long enough for the model to forget the nodes) while router outcomes show it serving:
      its size is unknown. The target held is a floor (the proposal may still scale up: demand with
      no capacity, a pool scaled to zero whose calls are shed), never a ceiling;
    - either of the last two with no target held and no node known: nothing. Any figure would be a
      guess at the size of a pool that may be serving (every HPA-style autoscaler proposes 0,
      ``no-nodes-yet``, and a Kubernetes actuator would scale the running pool away); the actuator
      keeps what it had, as it would without fleetloop (``control.state`` is compacted: the last
      target published stays there)."""
    known = pool_figures(snap).get(d.pool_id) is not None
    if not known and held is None:
        return None
    if silent:
        shaped = freeze_autoscale(d, snap, held)
    else:
        shaped = shape_autoscale(d, env, held)
        if not (known or held is None or shaped.desired_nodes >= held):
            shaped = _overruled(d, held, "no-telemetry-held")
    return keep_draining(shaped, snap, drains, drain_grace_ms(shaped, env))
