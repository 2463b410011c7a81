"""The batch forms (``decide_pools``) of slo-predictive autoscale, slo-aware admission, the ratio
retry budget and tbt-feedback batching equal the loop of their reference form (``decide``; for
slo-predictive, whose ``decide`` is a batch of one, its oracle ``tests/oracles/predictive.py``),
element for element and bit for bit: the decisions' JSON and fields set, the diagnostics' doubles
(``float.hex``) and the states (``repr``: -0.0 and NaN told apart), tick after tick with each form's
own states carried, on:

- the bench fleet (:mod:`fleetloop.bench.fleetgen` through the real model);
- a fleet that misbehaves (:func:`tests.support.perturbed.perturbed_snapshots`: nodes going cold,
  loading, draining, silent, failing, reporting 10**9 queued requests and 10**12 queued tokens);
- hand-built hostile sequences: 1e308 and -0.0 figures, NaN latencies, event time jumping to 2100
  and back, a pool of 100,000 new node ids;
- odd fleets: one pool, a one-node pool, a pool whose nodes are all stale, draining and ejected
  nodes, a pool with a view and no node, a context for a pool the snapshot does not know.

Breakers (``ctx.breakers``) are the engine's shape: a decision for every node of the pool, some
open (enforced or not) or half open, now and then one naming a sibling pool's node or no node.
Each form reads its own copy of every snapshot (its own memo), so neither reads what the other left.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from fleetloop.policies.admission.slo_aware import SloAware, SloAwareParams
from fleetloop.policies.autoscale.predictive import SloPredictive, SloPredictiveParams
from fleetloop.policies.autoscale.predictive.rule import _recent, _within
from fleetloop.policies.base import FleetSnapshot, NodeView, PolicyContext, PolicyResult
from fleetloop.policies.batching.tbt_feedback import TbtFeedback, TbtFeedbackParams
from fleetloop.policies.columns import fleet_columns
from fleetloop.policies.pool_figures import inputs_ok, r6_fast, r6_many, segment_sums
from fleetloop.policies.registry import builtin_policy
from fleetloop.policies.retry_budget.ratio import Ratio, RatioParams
from fleetloop.schemas.decisions import BreakerDecision
from tests.oracles import predictive as predictive_oracle
from tests.policies import snapshots as sb
from tests.support.bench_fleet import bench_snapshots
from tests.support.perturbed import perturbed_snapshots

DEFAULT = builtin_policy("default")

Algo = Any
Case = tuple[str, Algo, Any]

CASES: list[Case] = [
    ("predictive-default", SloPredictive(), SloPredictiveParams()),
    ("predictive-yaml", SloPredictive(), DEFAULT.sections["autoscale"].params),
    (
        "predictive-eager",
        SloPredictive(),
        SloPredictiveParams(
            spare_nodes=0, tolerance=0.0, down_period_s=0.0, cold_start_s=5.0, up_window_s=0.0,
            down_step_frac=1.0, min_requests=0, min_nodes=0, max_nodes=40,
            pools={"pool-b": {"min_nodes": 3, "max_nodes": 5}},
        ),
    ),
]  # fmt: skip
CASES += [
    ("admission-default", SloAware(), SloAwareParams()),
    (
        "admission-eager",
        SloAware(),
        SloAwareParams(
            tighten_at=0.3, relax_below=0.2, decrease=0.5, increase=50.0, min_level=4.0, max_level=64.0,
            min_failure_frac=0.0, classes=5, protect_priority=-1, reject_cap_ms=0,
        ),
    ),
    ("retry-default", Ratio(), RatioParams()),
    ("retry-yaml", Ratio(), DEFAULT.sections["retry_budget"].params),
    ("retry-plain-finagle", Ratio(), RatioParams(exempt_shed_and_lost=False, per_tenant=False)),
    ("retry-short-episodes", Ratio(), RatioParams(episode_max_s=3.0, retry_ratio=0.0, min_retries_per_s=0.0)),
    ("batching-default", TbtFeedback(), TbtFeedbackParams()),
    (
        "batching-eager",
        TbtFeedback(),
        TbtFeedbackParams(tighten_at=0.2, relax_below=0.1, decrease=0.9, increase_tokens=16, min_tokens=256),
    ),
]  # fmt: skip
IDS = [c[0] for c in CASES]


def _breaker(pool_id: str, node_id: str, state: str = "closed", enforced: bool = True) -> BreakerDecision:
    return BreakerDecision(
        entity=f"node/{node_id}", reason="x", pool_id=pool_id, node_id=node_id, state=state, enforced=enforced
    )  # type: ignore[arg-type]


def breakers_for(
    snap: FleetSnapshot, k: int, rng: np.random.Generator
) -> dict[str, dict[str, BreakerDecision]]:
    """Per pool, a breaker decision for each of its nodes: mostly closed, some open (enforced or not)
    or half open (every other tick only the non-closed ones, as change-only records leave them);
    now and then one naming another pool's node or no node."""
    out: dict[str, dict[str, BreakerDecision]] = {}
    all_ids = sorted(snap.nodes)
    for pool_id in sorted(snap.pools):
        views = snap.pool_nodes(pool_id)
        found: dict[str, BreakerDecision] = {}
        for n in views:
            u = rng.random()
            if u < 0.06:
                found[n.node_id] = _breaker(pool_id, n.node_id, "open", enforced=True)
            elif u < 0.08:
                found[n.node_id] = _breaker(pool_id, n.node_id, "open", enforced=False)
            elif u < 0.10:
                found[n.node_id] = _breaker(pool_id, n.node_id, "half_open")
            else:
                found[n.node_id] = _breaker(pool_id, n.node_id)
        if k % 2:  # change-only records: the closed nodes are absent (read as closed)
            found = {i: b for i, b in found.items() if b.state != "closed"}
        if all_ids and k % 4 == 1 and rng.random() < 0.3:  # another pool's node (a sibling's, maybe)
            other = all_ids[int(rng.integers(len(all_ids)))]
            found[other] = _breaker(pool_id, other, "open")
        if k % 5 == 2 and rng.random() < 0.2:
            found["no-such-node"] = _breaker(pool_id, "no-such-node", "open")
        out[pool_id] = found
    return out


def contexts(
    snap: FleetSnapshot, k: int, breakers: dict[str, dict[str, BreakerDecision]], pools: Sequence[str]
) -> list[PolicyContext]:
    return [
        PolicyContext(
            now_ms=snap.now_ms,
            tick_id=k,
            tick_ms=1000,
            pool_id=p,
            seed=(k, i),
            breakers=breakers.get(p, {}),
            slo=DEFAULT.slo,
        )
        for i, p in enumerate(pools)
    ]


def fresh(snap: FleetSnapshot) -> FleetSnapshot:
    """The same snapshot with an empty memo (each form computes its own figures)."""
    return dataclasses.replace(snap, memo={})


def same(a: PolicyResult[Any], b: PolicyResult[Any], where: str) -> None:
    assert [d.model_dump_json() for d in a.decisions] == [d.model_dump_json() for d in b.decisions], where
    assert [d.model_fields_set for d in a.decisions] == [d.model_fields_set for d in b.decisions], where
    assert [type(d) for d in a.decisions] == [type(d) for d in b.decisions], where
    assert {x: v.hex() for x, v in a.diagnostics.items()} == {x: v.hex() for x, v in b.diagnostics.items()}, (
        where
    )
    assert [type(v) for v in a.diagnostics.values()] == [type(v) for v in b.diagnostics.values()], where
    assert repr(a.state) == repr(b.state), where


def reference(algo: Algo) -> Callable[..., PolicyResult[Any]]:
    """The form a batch is held to: the algorithm's oracle when its ``decide`` is the batch itself."""
    return predictive_oracle.decide if isinstance(algo, SloPredictive) else algo.decide  # type: ignore[no-any-return]


def run_both(
    algo: Algo,
    params: Any,
    ticks: Iterable[tuple[FleetSnapshot, list[PolicyContext]]],
) -> dict[str, Any]:
    """Decide every tick both ways, each form carrying its own states; return what was seen."""
    plain: dict[str, Any] = {}
    batch: dict[str, Any] = {}
    seen: dict[str, Any] = {"reasons": set(), "ticks": 0, "refused": 0, "pools": 0}
    for k, (snap, ctxs) in enumerate(ticks):
        pools = [c.pool_id for c in ctxs]
        s_plain = [plain.get(p, algo.initial_state()) for p in pools]
        s_batch = [batch.get(p, algo.initial_state()) for p in pools]
        assert [repr(s) for s in s_plain] == [repr(s) for s in s_batch]
        a_snap, b_snap = fresh(snap), fresh(snap)
        try:
            want = [reference(algo)(a_snap, params, s, c) for s, c in zip(s_plain, ctxs, strict=True)]
        except (ValueError, OverflowError) as e:  # both refuse alike (never expected: counted)
            with pytest.raises(type(e), match=re.escape(str(e)[:60])):
                algo.decide_pools(b_snap, params, s_batch, ctxs)
            seen["refused"] += 1
            continue
        got = algo.decide_pools(b_snap, params, s_batch, ctxs)
        assert len(got) == len(want)
        for p, a, b in zip(pools, want, got, strict=True):
            same(a, b, f"tick {k} pool {p}")
            plain[p], batch[p] = a.state, b.state
            seen["reasons"].update(d.reason.split(":")[0] for d in a.decisions)
        seen["ticks"] += 1
        seen["pools"] += len(pools)
    return seen


def engine_ticks(
    snaps: Iterable[FleetSnapshot], seed: int = 3, extra_pools: Sequence[str] = ()
) -> Iterator[tuple[FleetSnapshot, list[PolicyContext]]]:
    rng = np.random.default_rng(seed)
    for k, snap in enumerate(snaps):
        pools = sorted({*snap.pools, *extra_pools})
        yield snap, contexts(snap, k, breakers_for(snap, k, rng), pools)


@pytest.fixture(scope="module")
def bench() -> list[FleetSnapshot]:
    return list(bench_snapshots(1000, 40))


@pytest.fixture(scope="module")
def perturbed() -> list[FleetSnapshot]:
    return list(perturbed_snapshots(320, 45))


# -- hand-built fleets --------------------------------------------------------------------------


def _pool_fields(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "requests_w": 400,
        "ok_w": 390,
        "failures_w": 10,
        "retries_w": 30,
        "shed_w": 5,
        "request_rate_per_s": 40.0,
        "prompt_tokens_rate_per_s": 80_000.0,
        "output_tokens_rate_per_s": 8_000.0,
        "ttft_p50_ms_w": 900.0,
        "ttft_p99_ms_w": 2500.0,
        "requests_by_priority_w": {0: 100, 2: 300},
        "tasks_ended_w": 50,
        "tasks_lost_w": 4,
        "open_workflows": 30,
        "workflows_started": 100,
        "workflows_ended": 70,
        "tasks_failed": 3,
    }
    base.update(over)
    return base


def _node(node_id: str, pool_id: str, k: int, **over: Any) -> NodeView:
    fields: dict[str, Any] = {
        "model": "llama-8b",
        "gpu_type": "H100",
        "gpu_count": 4,
        "queue_depth": (k * 7 + len(node_id)) % 5,
        "running_requests": 10 + (k * 3 + len(node_id)) % 20,
        "queued_prompt_tokens": 1500 * ((k + len(node_id)) % 4),
        "kv_cache_used_frac": 0.1 + 0.07 * ((k + len(node_id)) % 12),
        "prefix_cache_hit_frac": 0.3,
        "tbt_p50_ms": 20.0 + (k % 5),
        "tbt_p99_ms": 50.0 + 3 * (k % 7),
        "ttft_p99_ms": 800.0,
        "requests_w": 20,
        "ok_w": 19,
        "failures_w": 1,
    }
    fields.update(over)
    return sb.node(node_id, pool_id, **fields)


def hostile_snapshots() -> Iterator[FleetSnapshot]:
    """Hostile values, event time jumping to 2100 and back, odd pools, tick after tick."""
    far = 4_102_444_800_000
    times = [sb.NOW_MS + 1000 * k for k in range(14)] + [far, far + 1000, sb.NOW_MS + 20_000]
    times += [sb.NOW_MS + 21_000 + 1000 * k for k in range(10)]
    for k, now in enumerate(times):
        views: list[NodeView] = []
        # pool-a: figures at the schema's edges, some nodes cold/loading/draining/stale.
        for i in range(9):
            over: dict[str, Any] = {}
            if i == 0:
                over = {"queued_prompt_tokens": 10**12, "queue_depth": 10**9, "kv_cache_used_frac": 1.0}
            elif i == 1:
                over = {"kv_cache_used_frac": -0.0, "prefix_cache_hit_frac": -0.0, "running_requests": 0}
            elif i == 2:
                over = {"weights_state": ("cold", "loading", "warm")[(k // 3) % 3]}
            elif i == 3 and k % 4 >= 2:
                over = {"draining": True}
            elif i == 4 and k % 5 >= 3:
                over = {"stale": True, "age_ms": 9_000, "failures_w": 7 + k}
            elif i == 5:
                over = {"tbt_p99_ms": None if k % 2 else 1e308, "prefix_cache_hit_frac": 1.0}
            elif i == 6:
                over = {"kv_cache_used_frac": 1e-300, "tbt_p99_ms": -0.0}
            views.append(_node(f"pool-a/n{i}", "pool-a", k, **over))
        # pool-b: one node. pool-c: every node stale. pool-d: another model, sometimes short.
        views.append(_node("pool-b/n0", "pool-b", k, running_requests=1 + k % 3))
        views += [_node(f"pool-c/n{i}", "pool-c", k, stale=True, age_ms=60_000) for i in range(4)]
        views += [
            _node(f"pool-d/n{i}", "pool-d", k, model="qwen-32b", kv_cache_used_frac=0.99, queue_depth=40)
            for i in range(3 + k % 3)
        ]
        # pool-f: same model as pool-a, pressed (its shortfall is pool-a's sibling_short).
        views += [
            _node(f"pool-f/n{i}", "pool-f", k, kv_cache_used_frac=0.95 + 0.01 * (k % 4), queue_depth=30)
            for i in range(5)
        ]
        # pool-z: one warm node whose KV share is -0.0 (a sum of it alone is +0.0, as Python adds).
        views.append(_node("pool-z/n0", "pool-z", k, kv_cache_used_frac=-0.0, model="mixtral-8x7b"))
        pool_fields = {
            "pool-a": _pool_fields(
                prompt_tokens_rate_per_s=1e308 if k == 5 else 80_000.0 * (1 + k / 10),
                output_tokens_rate_per_s=8_000.0 * (1 + k / 10),
                ttft_p50_ms_w=math.nan if k == 7 else 900.0 + 50 * k,
                ttft_p99_ms_w=None if k % 6 == 0 else 2500.0,
                open_workflows=30 + 5 * k,
                workflows_started=100 + 9 * k,
                workflows_ended=70 + 4 * k,
                tasks_failed=3 + (k // 5),
            ),
            "pool-b": _pool_fields(request_rate_per_s=0.0, requests_w=5),
            "pool-c": _pool_fields(),
            "pool-d": _pool_fields(model="qwen-32b", ttft_p50_ms_w=9000.0),
            "pool-e": _pool_fields(requests_w=0, request_rate_per_s=0.0),  # a view, no node
            "pool-f": _pool_fields(ttft_p50_ms_w=2500.0),
            "pool-z": _pool_fields(model="mixtral-8x7b", ttft_p50_ms_w=None),
        }
        tenants = [
            sb.tenant("t-a", 0, requests_w=400 + k, retries_w=90, shed_w=3),
            sb.tenant("t-big", 2, requests_w=10**9, retries_w=10**9, shed_w=0),
            sb.tenant("t-idle", 1),
            sb.tenant("t-storm", 1, requests_w=5, retries_w=500 * k, shed_w=k),
        ]
        snap = sb.snapshot(views, now_ms=now, pool_fields=pool_fields, tenants=tenants)
        pools = {
            p: dataclasses.replace(v, model=pool_fields[p].get("model", "llama-8b"))
            for p, v in snap.pools.items()
        }
        yield dataclasses.replace(snap, pools=pools)


def many_new_ids(count: int = 100_000) -> Iterator[FleetSnapshot]:
    """A pool whose 100,000 node ids are all new, cold, then loading, then warm, beside a small one."""
    for k, state in enumerate(("cold", "loading", "warm", "warm")):
        views = [
            _node(f"big/n{i:06d}", "big", k, weights_state=state, queue_depth=i % 3, running_requests=i % 50)
            for i in range(count)
        ]
        views += [_node(f"small/n{i}", "small", k) for i in range(3)]
        yield sb.snapshot(
            views, now_ms=sb.NOW_MS + 1000 * k, pool_fields={"big": _pool_fields(), "small": _pool_fields()}
        )


def single_pool_snapshots(size: int, **over: Any) -> Iterator[FleetSnapshot]:
    for k in range(12):
        views = [_node(f"only/n{i}", "only", k, **over) for i in range(size)]
        yield sb.snapshot(views, now_ms=sb.NOW_MS + 1000 * k, pool_fields={"only": _pool_fields()})


# -- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_batch_equals_loop_on_the_bench_fleet(case: Case, bench: list[FleetSnapshot]) -> None:
    _, algo, params = case
    seen = run_both(algo, params, engine_ticks(bench))
    assert seen["ticks"] == len(bench)
    assert seen["refused"] == 0
    assert seen["reasons"], seen["reasons"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_batch_equals_loop_on_a_fleet_that_misbehaves(case: Case, perturbed: list[FleetSnapshot]) -> None:
    _, algo, params = case
    seen = run_both(algo, params, engine_ticks(perturbed, extra_pools=("ghost-pool",)))
    assert seen["ticks"] == len(perturbed)
    assert seen["refused"] == 0
    # The run went through several of the rule's branches (Finagle's plain budget has one reason).
    assert len(seen["reasons"]) >= {"retry-plain-finagle": 1}.get(case[0], 2), seen["reasons"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_batch_equals_loop_on_hostile_values(case: Case) -> None:
    _, algo, params = case
    seen = run_both(algo, params, engine_ticks(hostile_snapshots(), extra_pools=("ghost-pool",)))
    assert seen["ticks"] + seen["refused"] == 27


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_batch_equals_loop_on_odd_fleets(case: Case) -> None:
    _, algo, params = case
    for size in (1, 2, 5):
        run_both(algo, params, engine_ticks(single_pool_snapshots(size)))
    # One node whose KV share is -0.0: its pool's sum is +0.0, as Python's sum starts from 0.
    run_both(algo, params, engine_ticks(single_pool_snapshots(1, kv_cache_used_frac=-0.0)))
    # No pool at all, and a batch of pools the snapshot does not know.
    empty = sb.snapshot([], pool_fields={})
    run_both(algo, params, [(empty, [])])
    run_both(algo, params, [(empty, contexts(empty, 1, {}, ["x", "y"]))])


@pytest.mark.parametrize("case", CASES[:1], ids=IDS[:1])
def test_batch_equals_loop_with_100k_new_node_ids(case: Case) -> None:
    _, algo, params = case
    seen = run_both(algo, params, engine_ticks(many_new_ids()))
    assert seen["ticks"] == 4


# -- the helpers' own statements ----------------------------------------------------------------


def test_recent_is_the_filter() -> None:
    rng = np.random.default_rng(5)
    for _ in range(3000):
        n = int(rng.integers(0, 8))
        ts = sorted(rng.integers(0, 40, n).tolist())
        if rng.random() < 0.3 and n > 1:
            rng.shuffle(ts)
        seq = tuple((int(t), float(rng.choice([1.0, math.nan, -0.0]))) for t in ts)
        now = int(rng.integers(0, 60))
        span = float(rng.choice([0.0, 5.0, 10.5, 30.0, -1.0]))
        want = tuple(e for e in seq if now - e[0] <= span)
        assert repr(_recent(seq, now, span)) == repr(want)


def test_within_is_the_generator() -> None:
    """``_within`` (both forms' stabilization windows) against its statement, on ascending times as
    every tick writes them, on shuffled and repeated ones (a clock that went back), long memories
    (120 s leads), spans that hold none, all or part, and empty picks (both raise alike)."""
    rng = np.random.default_rng(11)
    for _ in range(4000):
        n = int(rng.integers(1, 130 if rng.random() < 0.2 else 9))
        ts = sorted(rng.integers(0, 200, n).tolist())
        if rng.random() < 0.3 and n > 1:
            rng.shuffle(ts)
        recs = tuple((int(t), int(rng.integers(-3, 50))) for t in ts)
        now = int(rng.integers(0, 260))
        span = float(rng.choice([0.0, 5.0, 10.5, 30.0, 120000.0, 57.25, -1.0]))
        for pick in (min, max):
            try:
                want: object = pick(r for t, r in recs if now - t <= span)
            except ValueError as exc:
                want = type(exc)
            try:
                got: object = _within(recs, now, span, pick)
            except ValueError as exc:
                got = type(exc)
            assert repr(got) == repr(want), (recs, now, span, pick)


def test_segment_sums_add_as_python_does() -> None:
    rng = np.random.default_rng(9)
    values = [1e16, 1.0, -1e16, -0.0, 0.1, 0.2, 0.3, 1e308, 1e308, -1e308, math.nan, 3.0, -0.0]
    for _ in range(200):
        n = int(rng.integers(1, 30))
        views = []
        for i in range(n):
            v = float(rng.choice(values))
            pool = f"p{int(rng.integers(0, 4))}"
            views.append(
                sb.node(f"{pool}/n{i:02d}", pool, kv_cache_used_frac=v, draining=bool(rng.random() < 0.3))
            )
        snap = sb.snapshot(views)
        cols = fleet_columns(snap)
        mask = ~cols.draining
        got = segment_sums(cols, cols.floats("kv_cache_used_frac"), mask).tolist()
        for j, p in enumerate(cols.pool_ids):
            with np.errstate(all="ignore"):
                want = sum(n.kv_cache_used_frac for n in snap.pool_nodes(p) if not n.draining)
            assert repr(float(want)) == repr(got[j]), (p, want, got[j])


def test_cases_cover_the_pools_the_batch_decides() -> None:
    """The helper compares everything: a batch that differs in one figure fails it (the mutation
    checks in the report go further: each breaks one step of a batch form)."""
    algo, params = SloPredictive(), SloPredictiveParams()
    snap = next(iter(bench_snapshots(200, 1)))
    ctxs = contexts(snap, 0, {}, sorted(snap.pools))
    states = [algo.initial_state() for _ in ctxs]
    want = [reference(algo)(fresh(snap), params, s, c) for s, c in zip(states, ctxs, strict=True)]
    got = algo.decide_pools(fresh(snap), params, states, ctxs)
    bad = dataclasses.replace(
        got[0], diagnostics={**got[0].diagnostics, "pressure": got[0].diagnostics["pressure"] + 1e-12}
    )
    with pytest.raises(AssertionError):
        same(want[0], bad, "mutated")


Checker = Callable[..., None]


def test_r6_fast_is_r6() -> None:
    from fleetloop.policies.base import r6

    rng = np.random.default_rng(2)
    values = [
        0.0,
        -0.0,
        1.0,
        -3.0,
        2.0**52,
        2.0**53 + 2,
        1e308,
        -1e308,
        math.inf,
        -math.inf,
        math.nan,
        0.5e-6,
    ]
    values += (rng.normal(0, 1e3, 2000) * rng.choice([1e-9, 1e-3, 1.0, 1e6, 1e12], 2000)).tolist()
    values += [round(x, 7) for x in rng.uniform(-10, 10, 500).tolist()]  # near the ties
    for x in values:
        assert repr(r6_fast(x)) == repr(r6(x)), x


def test_r6_many_is_r6() -> None:
    """``r6_many`` against ``r6`` element by element (``repr``: signed zeros, NaN): at every scale
    from subnormal to 1e308, on whole numbers, on exact ties ``(k + 0.5) / 1e6`` and the doubles
    either side of them up to ``|y| ~ 2**52`` (where its array path ends), infinities and NaN; and
    its bounds flags against ``inputs_ok`` of each value."""
    from fleetloop.policies.base import r6

    rng = np.random.default_rng(3)
    values = [0.0, -0.0, 1.0, -3.0, 2.0**52, 2.0**53 + 2, 1e308, -1e308, math.inf, -math.inf, math.nan]
    values += [5e-324, -5e-324, 0.5e-6, 1.5e-6, 2.5e-6, -2.5e-6, 1e15, 1e15 + 0.5, -1e15 - 0.25]
    scales = [1e-9, 1e-3, 1.0, 1e3, 1e6, 1e9, 1e12, 1e300]
    values += (rng.normal(0, 1e3, 6000) * rng.choice(scales, 6000)).tolist()
    for k in rng.integers(-(2**52), 2**52, 6000).tolist():
        tie = (k + 0.5) / 1e6
        values += [tie, math.nextafter(tie, math.inf), math.nextafter(tie, -math.inf)]
    values += [round(x, 7) for x in rng.uniform(-1e4, 1e4, 2000).tolist()]
    values += [float(i) + 0.5e-6 for i in range(-1500, 1500)]
    values += [float(i) for i in rng.integers(-(10**15), 10**15, 500).tolist()]
    got, bounded = r6_many(values)
    assert len(got) == len(bounded) == len(values)
    for x, g, b in zip(values, got, bounded, strict=True):
        assert repr(g) == repr(r6(x)), x
        assert b == inputs_ok([r6(x)]), x
    assert r6_many([]) == ([], [])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_batch_with_a_pool_twice_is_decided_pool_by_pool(case: Case, bench: list[FleetSnapshot]) -> None:
    _, algo, params = case
    snap = bench[3]
    pools = sorted(snap.pools)[:3]
    ctxs = contexts(snap, 3, breakers_for(snap, 3, np.random.default_rng(1)), [*pools, pools[0]])
    states = [algo.initial_state() for _ in ctxs]
    want = [reference(algo)(fresh(snap), params, s, c) for s, c in zip(states, ctxs, strict=True)]
    got = algo.decide_pools(fresh(snap), params, states, ctxs)
    for a, b in zip(want, got, strict=True):
        same(a, b, "a pool twice")
