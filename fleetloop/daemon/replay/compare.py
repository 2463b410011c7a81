"""Compare a shadow policy's decisions with the enforced ones, tick by tick (pure; no I/O).

Both policies decided the same ticks from the same records (the daemon runs the shadow right after
the enforcing policy, :meth:`fleetloop.core.shard.Shard.decide_shadow`, from the enforced policy
state where its first tick on a pool starts), so a pair is one tick of one pool and one decision
key (``kind/entity``). The policies named are those that decided the paired ticks (each tick's own
records, never a held breaker record from an earlier tick), per side as stretches of tick ids.
Only ticks both decided are paired; what each decided is compared, never which policy said so
(stamps), why (reason) or from which figures (inputs). How far apart a pair is, per kind:

- routing: total-variation distance of the weights, ``0.5 * sum_n |w_enforced(n) - w_shadow(n)|``
  (0: the same split; 1: disjoint nodes); a pair differs when it is above 1e-9 or the picker, the
  per-priority weights or the spill pools differ;
- breaker: the state (closed / open / half_open); distance 1 when it differs, detail ``a->b``.
  Breaker records are change-only (:mod:`fleetloop.policies.breaker.emission`): a closed node's
  record is published only when it changes and on keyframes, so each side's breakers on a tick are
  what a router holds then, the newest record per node of the pool, over the records of the last
  ``KEYFRAME_TICKS`` ticks (a node of the pool is re-sent at least that often; an older record is a
  node that left). A node held on one side only is closed on the other, by the same rule (a node
  that is not closed is emitted every tick): the shadow starts from the enforced breakers
  (:class:`fleetloop.core.shard.Shard`) and re-sends a closed node only at its keyframe;
- autoscale: the desired node count; distance ``|desired_e - desired_s|`` nodes;
- admission: the shed thresholds per priority class (queue depth, outstanding, new-task tables and
  the budget floor); distance the largest ``|threshold_e - threshold_s|`` over classes both set; a
  class limited on one side only is a difference (distance: that side's threshold);
- retry_budget: the retry ratio, floor and exemptions; distance ``|ratio_e - ratio_s|``;
- batching: the token cap; distance ``|cap_e - cap_s|`` tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleetloop.policies.breaker.emission import KEYFRAME_TICKS
from fleetloop.schemas.decisions import (
    AdmissionDecision,
    AutoscaleDecision,
    BatchingDecision,
    BreakerDecision,
    Decision,
    RetryBudgetDecision,
    RoutingDecision,
)

UNITS: dict[str, str] = {
    "routing": "TV distance",
    "breaker": "state",
    "admission": "queue depth",
    "retry_budget": "retry ratio",
    "autoscale": "nodes",
    "batching": "tokens",
}
EPS = 1e-9


@dataclass(slots=True)
class Tally:
    """How often and how far one kind (or one entity) differed."""

    compared: int = 0
    differ: int = 0
    only_enforced: int = 0
    only_shadow: int = 0
    distance_sum: float = 0.0
    distance_max: float = 0.0
    details: Counter[str] = field(default_factory=Counter)

    def add(self, differs: bool, distance: float, detail: str) -> None:
        self.compared += 1
        if differs:
            self.differ += 1
            self.distance_sum += distance
            self.distance_max = max(self.distance_max, distance)
            if detail:
                self.details[detail] += 1

    def as_json(self) -> dict[str, Any]:
        return {
            "compared": self.compared,
            "differ": self.differ,
            "differ_frac": round(self.differ / self.compared, 6) if self.compared else 0.0,
            "only_enforced": self.only_enforced,
            "only_shadow": self.only_shadow,
            "distance_mean": round(self.distance_sum / self.differ, 6) if self.differ else 0.0,
            "distance_max": round(self.distance_max, 6),
            "most_common": self.details.most_common(1)[0][0] if self.details else "",
        }


@dataclass(slots=True)
class Comparison:
    ticks_paired: int = 0  # (tick, pool) both policies decided
    ticks_enforced_only: int = 0  # no shadow ran on them (before it was applied, after removal)
    ticks_shadow_only: int = 0
    by_kind: dict[str, Tally] = field(default_factory=dict)
    by_entity: dict[tuple[str, str], Tally] = field(default_factory=dict)
    shadow_policies: set[tuple[str, int, str]] = field(default_factory=set)
    enforced_policies: set[tuple[str, int, str]] = field(default_factory=set)
    # Per side, (name, version, hash) -> [first tick id, last tick id, ticks] over the paired ticks.
    enforced_ticks: dict[tuple[str, int, str], list[int]] = field(default_factory=dict)
    shadow_ticks: dict[tuple[str, int, str], list[int]] = field(default_factory=dict)

    def _tally(self, kind: str, entity: str) -> tuple[Tally, Tally]:
        return (
            self.by_kind.setdefault(kind, Tally()),
            self.by_entity.setdefault((kind, entity), Tally()),
        )

    def as_json(self) -> dict[str, Any]:
        def stamps(s: set[tuple[str, int, str]]) -> list[dict[str, Any]]:
            return [{"name": n, "version": v, "hash": h} for n, v, h in sorted(s)]

        def on(ticks: dict[tuple[str, int, str], list[int]]) -> list[dict[str, Any]]:
            return [
                {"name": n, "version": v, "hash": h, "from_tick": a, "to_tick": b, "ticks": k}
                for (n, v, h), (a, b, k) in sorted(ticks.items(), key=lambda kv: (kv[1][0], kv[0]))
            ]

        return {
            "ticks_paired": self.ticks_paired,
            "ticks_enforced_only": self.ticks_enforced_only,
            "ticks_shadow_only": self.ticks_shadow_only,
            "enforced_policies": stamps(self.enforced_policies),
            "shadow_policies": stamps(self.shadow_policies),
            "enforced_stretches": on(self.enforced_ticks),
            "shadow_stretches": on(self.shadow_ticks),
            "by_kind": {
                k: {**t.as_json(), "unit": UNITS.get(k, "")} for k, t in sorted(self.by_kind.items())
            },
            "entities": [
                {"kind": k, "entity": e, **t.as_json(), "unit": UNITS.get(k, "")}
                for (k, e), t in sorted(self.by_entity.items())
            ],
        }


def total_variation(a: dict[str, float], b: dict[str, float]) -> float:
    """``0.5 * sum |a(n) - b(n)|`` over the nodes of either (0 when both are empty)."""
    return 0.5 * sum(abs(a.get(n, 0.0) - b.get(n, 0.0)) for n in sorted(set(a) | set(b)))


def _tables(d: AdmissionDecision) -> dict[str, int]:
    out = {"budget_floor_ms": d.reject_if_budget_below_ms}
    for name in (
        "max_queue_depth",
        "new_task_max_queue_depth",
        "max_outstanding",
        "new_task_max_outstanding",
    ):
        for prio, v in getattr(d, name).items():
            out[f"{name}[{prio}]"] = v
    return out


def distance(enforced: Decision, shadow: Decision) -> tuple[bool, float, str]:
    """(differs, how far, a short detail) for two decisions of one key on one tick."""
    e, s = enforced.body, shadow.body
    if isinstance(e, RoutingDecision) and isinstance(s, RoutingDecision):
        tv = total_variation(e.weights, s.weights)
        other = (e.picker, e.by_priority, e.spill_to, e.max_prompt_tokens, e.slo_prompt_tokens) != (
            s.picker,
            s.by_priority,
            s.spill_to,
            s.max_prompt_tokens,
            s.slo_prompt_tokens,
        )
        return tv > EPS or other, tv, "" if tv > EPS or not other else "picker/priority/spill"
    if isinstance(e, BreakerDecision) and isinstance(s, BreakerDecision):
        differs = e.state != s.state
        return differs, 1.0 if differs else 0.0, f"{e.state}->{s.state}"
    if isinstance(e, AutoscaleDecision) and isinstance(s, AutoscaleDecision):
        d = abs(e.desired_nodes - s.desired_nodes)
        return d > 0, float(d), f"{e.desired_nodes}->{s.desired_nodes}"
    if isinstance(e, AdmissionDecision) and isinstance(s, AdmissionDecision):
        te, ts = _tables(e), _tables(s)
        gaps = {k: abs(te[k] - ts[k]) for k in te if k in ts and te[k] != ts[k]}
        one_sided = {k: (te | ts)[k] for k in set(te) ^ set(ts)}
        gaps.update(one_sided)
        if not gaps:
            return False, 0.0, ""
        worst = max(sorted(gaps), key=lambda k: gaps[k])
        return True, float(gaps[worst]), f"{worst} {te.get(worst, 'none')}->{ts.get(worst, 'none')}"
    if isinstance(e, RetryBudgetDecision) and isinstance(s, RetryBudgetDecision):
        gap = abs(e.retry_ratio - s.retry_ratio)
        other = (e.min_retries_per_s, e.exempt_retries_of, e.retries_allowed_now) != (
            s.min_retries_per_s,
            s.exempt_retries_of,
            s.retries_allowed_now,
        )
        return gap > EPS or other, gap, f"{e.retry_ratio:g}->{s.retry_ratio:g}"
    if isinstance(e, BatchingDecision) and isinstance(s, BatchingDecision):
        d = abs(e.max_batch_tokens - s.max_batch_tokens)
        return d > 0, float(d), f"{e.max_batch_tokens}->{s.max_batch_tokens}"
    return True, 1.0, f"{e.kind}->{s.kind}"


def _by_tick(decisions: Iterable[Decision]) -> dict[tuple[int, str], dict[str, Decision]]:
    """(tick id, pool) -> key -> decision (the last one recorded, as a router would keep it)."""
    out: dict[tuple[int, str], dict[str, Decision]] = {}
    for d in decisions:
        out.setdefault((d.tick_id, getattr(d.body, "pool_id", "")), {})[d.key] = d
    return out


def _holding(
    held: dict[str, dict[str, Decision]], tick: tuple[int, str], decided: dict[str, Decision] | None
) -> dict[str, Decision] | None:
    """One side's decisions of ``tick`` with its breakers as a router holds them: this tick's records
    folded into the pool's held breaker records, those older than ``KEYFRAME_TICKS`` ticks dropped.
    None when the side did not decide the tick."""
    if decided is None:
        return None
    tick_id, pool_id = tick
    pool = held.setdefault(pool_id, {})
    for key, d in decided.items():
        if d.body.kind == "breaker":
            pool[key] = d
    for key in [k for k, d in pool.items() if tick_id - d.tick_id >= KEYFRAME_TICKS]:
        del pool[key]
    return {**{k: d for k, d in decided.items() if d.body.kind != "breaker"}, **pool}


def _count(
    names: set[tuple[str, int, str]],
    ticks: dict[tuple[str, int, str], list[int]],
    tick_id: int,
    decided: dict[str, Decision],
) -> None:
    """Note the policy that decided ``tick_id`` on one side, from that tick's own records (every
    decision of a tick carries the same name, version and hash)."""
    first = next(iter(decided.values()), None)
    if first is None:
        return
    stamp = (first.policy.name, first.policy.version, first.policy.hash)
    names.add(stamp)
    span = ticks.setdefault(stamp, [tick_id, tick_id, 0])
    span[0], span[1], span[2] = min(span[0], tick_id), max(span[1], tick_id), span[2] + 1


def compare(
    enforced: Iterable[Decision], shadow: Iterable[Decision], *, from_ms: int = 0, to_ms: int | None = None
) -> Comparison:
    """Pair the decisions of ticks in ``[from_ms, to_ms]`` that both policies decided."""

    def inside(d: Decision) -> bool:
        return d.ts_ms >= from_ms and (to_ms is None or d.ts_ms <= to_ms)

    e_ticks = _by_tick(d for d in enforced if inside(d))
    s_ticks = _by_tick(d for d in shadow if inside(d))
    out = Comparison()
    out.ticks_enforced_only = len(set(e_ticks) - set(s_ticks))
    out.ticks_shadow_only = len(set(s_ticks) - set(e_ticks))
    held_e: dict[str, dict[str, Decision]] = {}
    held_s: dict[str, dict[str, Decision]] = {}
    for tick in sorted(set(e_ticks) | set(s_ticks)):
        es = _holding(held_e, tick, e_ticks.get(tick))
        ss = _holding(held_s, tick, s_ticks.get(tick))
        if es is None or ss is None:
            continue
        out.ticks_paired += 1
        _count(out.enforced_policies, out.enforced_ticks, tick[0], e_ticks[tick])
        _count(out.shadow_policies, out.shadow_ticks, tick[0], s_ticks[tick])
        for key in sorted(set(es) | set(ss)):
            kind, entity = key.split("/", 1)
            by_kind, by_entity = out._tally(kind, entity)
            if kind == "breaker" and (key in es) != (key in ss):
                # Held on one side only: closed on the other (a node not closed is sent every tick).
                held = es.get(key) or ss[key]
                state = held.body.state if isinstance(held.body, BreakerDecision) else "closed"
                e_state, s_state = (state, "closed") if key in es else ("closed", state)
                differs = e_state != s_state
                by_kind.add(differs, 1.0 if differs else 0.0, f"{e_state}->{s_state}")
                by_entity.add(differs, 1.0 if differs else 0.0, f"{e_state}->{s_state}")
                continue
            if key not in ss:
                by_kind.only_enforced += 1
                by_entity.only_enforced += 1
                continue
            if key not in es:
                by_kind.only_shadow += 1
                by_entity.only_shadow += 1
                continue
            e, s = es[key], ss[key]
            differs, far, detail = distance(e, s)
            by_kind.add(differs, far, detail)
            by_entity.add(differs, far, detail)
    return out
