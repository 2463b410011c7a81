"""Levers that know their limits: decision tables for each new rule, and the property
that no lever's decision costs priority 0 anything in a pure capacity-loss case.

- pool-wide slowdown: the breaker does not enforce an error ejection the pool shares;
- capacity-aware ejection cap: the engine enforces an ejection only when the nodes left can carry
  the ejected node's useful work;
- shed-then-retry: a shed call's retry is granted on top of the storm budget;
- mass preemption: calls lost with their node are granted their retry and do not make admission
  shed; the survivors' timeouts during the episode are the lost nodes' displaced load and the
  budget grows by ``k / warm`` until the capacity is back; the autoscaler discounts a long
  prefill's own compute time;
- admission gates on tasks lost, not calls failed, and sets no outstanding limit at its ceiling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from fleetloop.core.decide import shaping
from fleetloop.core.decide.engine import EngineState, decide
from fleetloop.policies.admission.slo_aware import SloAware, SloAwareParams
from fleetloop.policies.autoscale.predictive import SloPredictive, SloPredictiveParams
from fleetloop.policies.base import FleetSnapshot, NodeView
from fleetloop.policies.breaker.latency_outlier import LatencyOutlier, LatencyOutlierParams
from fleetloop.policies.envelope import Envelope
from fleetloop.policies.registry import builtin_policy, compile_policy, parse_document
from fleetloop.policies.retry_budget.ratio import Ratio, RatioParams
from fleetloop.router import Endpoint, Router
from fleetloop.schemas import (
    AdmissionDecision,
    AutoscaleDecision,
    BreakerDecision,
    Decision,
    PolicyStamp,
    RetryBudgetDecision,
    RoutingDecision,
    Tick,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.oracles.engine import cap_ejections_plain
from tests.policies.snapshots import NOW_MS, ctx, node, snapshot, tenant

# -- pool-wide slowdown: the breaker ---------------------------------------------------------------


def _breakers(views: list[NodeView]) -> dict[str, BreakerDecision]:
    snap = snapshot(views)
    res = LatencyOutlier().decide(snap, LatencyOutlierParams(), LatencyOutlier().initial_state(), ctx(snap))
    return {d.node_id: d for d in res.decisions if isinstance(d, BreakerDecision)}


@pytest.mark.parametrize(
    ("others_failed", "enforced", "reason"),
    [
        (0, True, "consecutive-failures"),  # fails alone: a black hole, ejected
        (1, True, "consecutive-failures"),  # peers fail at a tenth of its rate: still its own
        (3, True, "consecutive-failures"),  # median 3/10 < half of 10/10
        (5, False, "consecutive-failures:pool-wide"),  # median 5/10 >= half: the pool's failure
        (8, False, "consecutive-failures:pool-wide"),  # every node times out together
    ],
)
def test_error_ejection_is_not_enforced_when_the_pool_shares_the_failures(
    others_failed: int, enforced: bool, reason: str
) -> None:
    views = [node("a", consecutive_failures=6, requests_w=10, failures_w=10)] + [
        node(f"n{i}", requests_w=10, failures_w=others_failed) for i in range(3)
    ]
    d = _breakers(views)["a"]
    assert (d.state, d.enforced, d.reason) == ("open", enforced, reason)


def test_pool_wide_is_judged_on_serving_nodes_only() -> None:
    # Two peers failing everything are crashed (stale): they do not make a's failures "shared".
    views = [
        node("a", consecutive_failures=6, requests_w=10, failures_w=10),
        node("b", requests_w=10, failures_w=10, stale=True),
        node("c", requests_w=10, failures_w=10, weights_state="cold"),
        node("d", requests_w=10),
        node("e", requests_w=10),
    ]
    assert _breakers(views)["a"].enforced


@pytest.mark.parametrize(
    ("streaks", "others", "enforced", "reason"),
    [
        # host-loss-mid-decode at 301 s: three of five busy nodes crashed (5-7 failures in a row,
        # successes from before the crash still in the window); two survivors succeed: the three
        # fail alone. A median over all five (0.58) shielded them.
        ([(7, 2, 5), (12, 5, 7), (9, 2, 7)], [(5, 5, 0), (1, 1, 0)], True, "consecutive-failures"),
        # The same three streaks in a pool whose other nodes time out half their calls: shared.
        (
            [(7, 2, 5), (12, 5, 7), (9, 2, 7)],
            [(10, 5, 5), (10, 4, 6)],
            False,
            "consecutive-failures:pool-wide",
        ),
        # Every node in a streak (the pool failing everything): the level is read on all of them.
        ([(7, 2, 5), (12, 5, 7), (9, 2, 7)], [], False, "consecutive-failures:pool-wide"),
        # Survivors failing a fifth of their calls: 0.2 < half of a's 5/7.
        ([(7, 2, 5), (12, 5, 7)], [(10, 8, 2), (10, 8, 2)], True, "consecutive-failures"),
    ],
)
def test_nodes_in_a_failure_streak_are_not_their_own_evidence_of_a_pool_wide_failure(
    streaks: list[tuple[int, int, int]], others: list[tuple[int, int, int]], enforced: bool, reason: str
) -> None:
    views = [
        node(f"a{i}", consecutive_failures=6, requests_w=r, ok_w=ok, failures_w=f)
        for i, (r, ok, f) in enumerate(streaks)
    ] + [node(f"s{i}", requests_w=r, ok_w=ok, failures_w=f) for i, (r, ok, f) in enumerate(others)]
    d = _breakers(views)["a0"]
    assert (d.state, d.enforced, d.reason) == ("open", enforced, reason)


# -- capacity-aware ejection cap: the engine -------------------------------------------------------


def _policy(max_ejected_frac: float = 0.5) -> Any:
    doc = builtin_policy().document.model_dump(mode="json")
    doc["spec"]["breaker"] = {"type": "consecutive-errors"}
    doc["spec"]["envelope"] = {**doc["spec"]["envelope"], "max_ejected_frac": max_ejected_frac}
    return compile_policy(parse_document(doc, "test"))


def _engine_breakers(views: list[NodeView], max_ejected_frac: float = 0.5) -> dict[str, BreakerDecision]:
    snap = snapshot(views)
    res = decide(snap, _policy(max_ejected_frac), EngineState(), Tick(ts_ms=NOW_MS, tick_id=1, pool_id="p"))
    return {d.body.node_id: d.body for d in res.decisions if isinstance(d.body, BreakerDecision)}


BAD = {"consecutive_failures": 6, "requests_w": 10}


@pytest.mark.parametrize(
    ("bad", "peers", "enforced", "reason"),
    [
        # Idle peers: plenty of spare, the share cap is the only limit.
        ({"ok_w": 4, "failures_w": 6, "kv_cache_used_frac": 0.5}, {}, True, "consecutive-failures"),
        # Every peer has a queue (full) and the candidate served ok calls earlier in the window, then
        # failed six in a row: since its streak began it carries nothing, so it is ejected whatever
        # the pool's load (the calls it served before do not count). It was capped before.
        (
            {"ok_w": 4, "failures_w": 6, "queue_depth": 3},
            {"queue_depth": 4, "requests_w": 10, "ok_w": 10},
            True,
            "consecutive-failures",
        ),
        # The same full pool, the candidate's calls all fail: it carries nothing, eject it.
        ({"failures_w": 10, "queue_depth": 3}, {"queue_depth": 4}, True, "consecutive-failures"),
        # A healthy-speed candidate that is fully busy, in a streak: out, though 3 x 0.3 < 1.
        (
            {"ok_w": 4, "failures_w": 6, "queue_depth": 3, "tbt_p50_ms": 50.0},
            {"kv_cache_used_frac": 0.7, "tbt_p50_ms": 50.0},
            True,
            "consecutive-failures",
        ),
        # A crashed (stale) candidate carries nothing whatever the pool's load.
        ({"stale": True}, {"queue_depth": 4}, True, "consecutive-failures"),
    ],
)
def test_a_node_in_a_failure_streak_is_ejected_whatever_the_pools_load(
    bad: Mapping[str, Any], peers: Mapping[str, Any], enforced: bool, reason: str
) -> None:
    views = [node("a", **{**BAD, **bad})] + [node(f"n{i}", **peers) for i in range(3)]
    d = _engine_breakers(views)["a"]
    assert (d.state, d.enforced, d.reason) == ("open", enforced, reason)


def _capped(
    views: list[NodeView],
    open_: list[str],
    *,
    held: Mapping[str, int | None] | None = None,
    max_ejected_frac: float = 1.0,
) -> dict[str, BreakerDecision]:
    """The engine's ejection cap on open, enforced breakers of ``open_`` (a latency ejection: the
    reason names no streak) in a snapshot of ``views``, both forms of the rule, which must agree."""
    snap = snapshot(views)
    decisions = [
        BreakerDecision(entity=f"node/{n.node_id}", reason="latency-outlier", pool_id="p",
                        node_id=n.node_id, state="open" if n.node_id in open_ else "closed",
                        until_ms=NOW_MS + 30_000 if n.node_id in open_ else None)
        for n in views
    ]  # fmt: skip
    env = Envelope(max_ejected_frac=max_ejected_frac)
    got = shaping.cap_ejections(list(decisions), snap, "p", env, held)
    assert got == cap_ejections_plain(list(decisions), snap, "p", env, held)
    return {d.node_id: d for d in got}


FULL = {"queue_depth": 4, "requests_w": 10, "ok_w": 10}


@pytest.mark.parametrize(
    ("bad", "peers", "enforced"),
    [
        # Idle peers: plenty of spare.
        ({"ok_w": 10, "queue_depth": 3}, {}, True),
        # Every peer has a queue (full) and the candidate's calls succeed: nowhere to put its work.
        ({"ok_w": 10, "queue_depth": 3}, FULL, False),
        # Half its calls fail: it still carries half a node, and a full pool has no room for that.
        ({"ok_w": 5, "failures_w": 5, "requests_w": 10, "queue_depth": 3}, FULL, False),
        # Its latest call failed (a streak of one): nothing served since, out whatever the load.
        ({"ok_w": 9, "failures_w": 1, "consecutive_failures": 1, "queue_depth": 3}, FULL, True),
        # A candidate 8x slower than its peers carries an eighth of a node: fits in 3 x 0.3 spare.
        (
            {"ok_w": 10, "queue_depth": 3, "tbt_p50_ms": 400.0},
            {"kv_cache_used_frac": 0.7, "tbt_p50_ms": 50.0},
            True,
        ),
        # A healthy-speed candidate that is fully busy needs a whole node of spare: 3 x 0.3 < 1.
        (
            {"ok_w": 10, "queue_depth": 3, "tbt_p50_ms": 50.0},
            {"kv_cache_used_frac": 0.7, "tbt_p50_ms": 50.0},
            False,
        ),
        # No call in its window: not "all ok" but as its pool's nodes do. Peers that fail half their
        # calls put its useful work at half a node, which fits in 3 x 0.3 (all ok would not).
        ({"queue_depth": 3}, {"kv_cache_used_frac": 0.7, "requests_w": 10, "ok_w": 5, "failures_w": 5}, True),
        ({"queue_depth": 3}, {"kv_cache_used_frac": 0.7, "requests_w": 10, "ok_w": 10}, False),
        # No call anywhere in the pool (no router outcomes): its telemetry alone, a full node.
        ({"queue_depth": 3}, {"kv_cache_used_frac": 0.7}, False),
        # A crashed (stale) candidate carries nothing whatever the pool's load.
        ({"ok_w": 10, "stale": True}, FULL, True),
    ],
)
def test_capacity_cap_weighs_a_candidates_useful_work_since_its_streak_began(
    bad: Mapping[str, Any], peers: Mapping[str, Any], enforced: bool
) -> None:
    views = [node("a", **bad)] + [node(f"n{i}", **peers) for i in range(3)]
    d = _capped(views, ["a"])["a"]
    assert (d.state, d.enforced) == ("open", enforced)
    assert d.reason == ("latency-outlier" if enforced else "latency-outlier:capacity-cap")


def test_capacity_cap_takes_the_worst_first_and_stops_when_spare_runs_out() -> None:
    # Two busy candidates of healthy speed; two peers with 0.5 spare each hold one node's work.
    views = [
        node("a", consecutive_failures=0, requests_w=10, ok_w=10, kv_cache_used_frac=1.0),
        node("b", consecutive_failures=0, requests_w=10, ok_w=10, kv_cache_used_frac=1.0),
        node("c", kv_cache_used_frac=0.5),
        node("d", kv_cache_used_frac=0.5),
    ]
    got = _capped(views, ["a", "b"])
    assert (got["a"].enforced, got["b"].enforced) == (True, False)
    assert got["b"].reason.endswith(":capacity-cap")


def test_a_held_ejection_is_not_judged_again_until_its_end() -> None:
    """An ejection the engine let out enforced last tick stays enforced, though its node now looks
    like one the full pool could not take (its window emptied once routers stopped sending to it),
    and counts against the share cap before any new candidate; at its end it is judged afresh."""
    views = [node("a", queue_depth=3), node("b", queue_depth=3)] + [node(f"n{i}", **FULL) for i in range(3)]
    assert not _capped(views, ["a"])["a"].enforced  # judged afresh: the pool has no room for it
    held = _capped(views, ["a", "b"], held={"a": NOW_MS + 1}, max_ejected_frac=0.2)
    assert (held["a"].enforced, held["a"].reason) == (True, "latency-outlier")
    assert (held["b"].enforced, held["b"].reason) == (False, "latency-outlier:max-ejected-cap")
    assert not _capped(views, ["a"], held={"a": NOW_MS})["a"].enforced  # its end: judged again
    assert _capped(views, ["a"], held={"a": None})["a"].enforced  # no end given: while it is open


@pytest.mark.parametrize(
    ("frac", "pool_size", "cap"),
    [
        (0.5, 1, 1),
        (0.5, 2, 1),
        (0.5, 40, 20),
        (0.1, 9, 1),
        (0.1, 10, 1),
        (0.1, 20, 2),
        (0.34, 3, 1),
        (0.0, 40, 0),
    ],
)
def test_share_cap_always_lets_one_node_out_unless_the_fraction_is_zero(
    frac: float, pool_size: int, cap: int
) -> None:
    assert shaping.share_cap(frac, pool_size) == cap


# -- shed-then-retry and mass failures: the retry budget -------------------------------------------


def _budget(
    pool: Mapping[str, Any], views: list[NodeView] | None = None, **params: Any
) -> RetryBudgetDecision:
    snap = snapshot(views or [node("a")], pool_fields={"p": dict(pool)})
    (d, *_) = Ratio().decide(snap, RatioParams(per_tenant=False, **params), None, ctx(snap)).decisions
    assert isinstance(d, RetryBudgetDecision)
    return d


@pytest.mark.parametrize(
    ("pool", "lost_on", "exempt", "expected"),
    [
        ({"requests_w": 1000, "retries_w": 400}, None, True, 0),  # a storm: spent
        ({"requests_w": 1000, "retries_w": 100}, None, True, 200),  # 100 + 20% of 1000 - 100
        # 150 of the 250 retries were of shed calls (uncounted by the router): 50 counted
        ({"requests_w": 1000, "retries_w": 250, "shed_w": 150}, None, True, 200),
        ({"requests_w": 1000, "retries_w": 250, "shed_w": 150}, None, False, 50),  # Finagle's plain budget
        # 120 were retries of reclaimed calls, and 1 of 3 nodes is lost (a mass-failure episode:
        # the ratio grows by 1 short / 2 warm): 100 + 0.7 x 1000 - (250 - 120)
        ({"requests_w": 1000, "retries_w": 250}, "cold", True, 670),
        ({"requests_w": 1000, "retries_w": 250}, "stale", True, 670),  # ... of crashed-node calls
        ({"requests_w": 1000, "retries_w": 250}, "warm", True, 50),  # failing on a serving node: a storm
        ({"requests_w": 1000, "retries_w": 250}, "cold", False, 50),  # Finagle's: no exemption, no episode
    ],
)
def test_retries_of_shed_and_lost_calls_do_not_spend_the_storm_budget(
    pool: Mapping[str, Any], lost_on: str | None, exempt: bool, expected: int
) -> None:
    views = [node("a"), node("b")]
    if lost_on is not None:
        views.append(
            node(
                "c",
                requests_w=120,
                failures_w=120,
                stale=lost_on == "stale",
                weights_state=lost_on if lost_on != "stale" else "warm",
            )
        )
    d = _budget(pool, views, exempt_shed_and_lost=exempt)
    assert d.retries_allowed_now == expected


def test_tenant_budgets_leave_out_their_shed_calls_and_a_share_of_the_lost_ones() -> None:
    views = [node("a"), node("c", requests_w=100, failures_w=100, weights_state="cold")]
    snap = snapshot(
        views,
        pool_fields={"p": {"requests_w": 1000, "retries_w": 300}},
        tenants=[
            tenant("gold", 0, requests_w=250, retries_w=150),
            tenant("free", 2, requests_w=750, retries_w=150, shed_w=40),
        ],
    )
    out = {
        d.tenant_id: d.retries_allowed_now
        for d in Ratio().decide(snap, RatioParams(), None, ctx(snap)).decisions
        if isinstance(d, RetryBudgetDecision)
    }
    # One of two nodes lost: an episode adding 1 short / 1 warm to the ratio (0.2 -> 1.2).
    # pool: 100 + 1200 - (300 - 100); gold: 100 + 300 - (150 - 25); free: 100 + 900 - (150 - 40 - 75)
    assert out == {None: 1100, "gold": 275, "free": 965}


# -- mass failure: the episode that grows the budget while lost capacity is away -----------------


def _episode_run(steps: list[tuple[int, int, int]], **params: Any) -> list[tuple[str, int, float]]:
    """Ticks of (warm serving nodes, lost nodes that failed calls this window, reloading nodes that
    failed nothing) 10 s apart; per tick (reason, retries allowed, ratio added), 1000 requests and
    900 timed-out calls' retries per window."""
    state = None
    out: list[tuple[str, int, float]] = []
    for i, (warm, lost, loading) in enumerate(steps):
        views = [node(f"s{k:02d}") for k in range(warm)]
        views += [
            node(f"x{k:02d}", requests_w=50, failures_w=50, weights_state="loading") for k in range(lost)
        ]
        views += [node(f"y{k:02d}", weights_state="loading") for k in range(loading)]
        now = NOW_MS + 10_000 * i
        snap = snapshot(views, now_ms=now, pool_fields={"p": {"requests_w": 1000, "retries_w": 900}})
        res = Ratio().decide(snap, RatioParams(per_tenant=False, **params), state, ctx(snap))
        (d,) = res.decisions
        assert isinstance(d, RetryBudgetDecision)
        state = res.state
        out.append((d.reason, d.retries_allowed_now, d.inputs.get("ratio_added", 0.0)))
    return out


@pytest.mark.parametrize(
    ("steps", "params", "expected"),
    [
        # Half of 16 nodes reclaimed at once: +8/8 while they reload (the lost calls' own retries
        # are the 400 left out of the count on the first tick); back at 16 warm, one more window.
        (
            [(16, 0, 0), (8, 8, 0), (8, 0, 8), (8, 0, 8), (16, 0, 0), (16, 0, 0)],
            {},
            [
                ("budget", 0, 0.0),  # 100 + 200 - 900: a storm on a whole pool, spent
                ("budget+mass-failure", 800, 1.0),  # 100 + 1.2 x 1000 - (900 - 400 lost calls' retries)
                ("budget+mass-failure", 400, 1.0),  # 100 + 1.2 x 1000 - 900
                ("budget+mass-failure", 400, 1.0),
                ("budget", 0, 0.0),  # capacity back and a window since the loss: plain budget
                ("budget", 0, 0.0),
            ],
        ),
        # A scale-up's loading nodes failed nothing: no episode, the plain storm budget.
        ([(8, 0, 8), (8, 0, 8)], {}, [("budget", 0, 0.0), ("budget", 0, 0.0)]),
        # Capacity that never comes back: the episode ends after episode_max_s (30 s here).
        (
            [(8, 8, 0), (8, 0, 8), (8, 0, 8), (8, 0, 8)],
            {"episode_max_s": 30.0},
            [
                ("budget+mass-failure", 800, 1.0),
                ("budget+mass-failure", 400, 1.0),
                ("budget+mass-failure", 400, 1.0),
                ("budget", 0, 0.0),
            ],
        ),
        # Turned off: Finagle's plain budget.
        ([(8, 8, 0), (8, 0, 8)], {"episode_max_s": 0.0}, [("budget+shed-lost", 0, 0.0), ("budget", 0, 0.0)]),
        # One node of 16 lost: the ratio grows by 1/15 only.
        (
            [(15, 1, 0), (15, 0, 1)],
            {},
            [("budget+mass-failure", 0, 0.066667), ("budget+mass-failure", 0, 0.066667)],
        ),
    ],
)
def test_a_mass_failure_grows_the_budget_until_the_capacity_is_back(
    steps: list[tuple[int, int, int]], params: dict[str, Any], expected: list[tuple[str, int, float]]
) -> None:
    assert _episode_run(steps, **params) == expected


# -- admission: tasks lost, not calls failed --------------------------------------------------------


def _admission(
    views: list[NodeView], *, failures: int = 0, ended: int = 0, lost: int = 0, level: float | None = None
) -> AdmissionDecision:
    snap = snapshot(
        views,
        pool_fields={
            "p": {
                "requests_w": 1000,
                "failures_w": failures,
                "ttft_p99_ms_w": 6000.0,
                "tasks_ended_w": ended,
                "tasks_lost_w": lost,
            }
        },
    )
    (d,) = SloAware().decide(snap, SloAwareParams(), level, ctx(snap)).decisions
    assert isinstance(d, AdmissionDecision)
    return d


@pytest.mark.parametrize(
    ("failures", "ended", "lost", "reason"),
    [
        (400, 800, 0, "tasks-succeed"),  # 40% of calls timed out, every retry carried its task
        (400, 800, 39, "tasks-succeed"),  # 4.9% of tasks lost: below one in twenty
        (0, 800, 40, "slo-near"),  # 5% of tasks lost over the SLO: distress, whatever the calls did
        (400, 0, 0, "tasks-succeed"),  # no task ended in the window: nothing lost
    ],
)
def test_admission_gates_on_tasks_lost_not_calls_failed(
    failures: int, ended: int, lost: int, reason: str
) -> None:
    d = _admission(
        [node(f"n{i}", requests_w=250, failures_w=failures // 4) for i in range(4)],
        failures=failures,
        ended=ended,
        lost=lost,
        level=100.0,
    )
    assert d.reason == reason


def test_admission_does_not_tighten_for_calls_lost_with_their_nodes() -> None:
    lost = [node(f"x{i}", requests_w=40, failures_w=40, weights_state="cold") for i in range(4)]
    serving = [node(f"n{i}", requests_w=100, ok_w=100) for i in range(4)]
    d = _admission(serving + lost, failures=160, ended=500)  # every failure is on a reclaimed node
    assert d.reason == "tasks-succeed"
    assert d.inputs["lost_calls_w"] == 160.0


@pytest.mark.parametrize(
    ("level", "ended", "lost", "outstanding"),
    [
        (None, 800, 0, {}),  # at the ceiling: no outstanding limit, the queue limits stand
        (256.0, 800, 0, {}),
        (252.0, 800, 0, {}),  # climbing back by 4 reaches the ceiling: none
        (100.0, 800, 40, {"1": 140, "2": 70}),  # distress: 100 x 0.7
    ],
)
def test_no_outstanding_limit_at_the_ceiling(
    level: float | None, ended: int, lost: int, outstanding: dict[str, int]
) -> None:
    d = _admission(
        [node(f"n{i}", running_requests=300) for i in range(4)], ended=ended, lost=lost, level=level
    )
    assert d.new_task_max_outstanding == outstanding
    assert d.new_task_max_queue_depth["2"] >= 2  # queue limits always published


# -- the autoscaler: a long prefill's own compute time is not pressure -------------------------------


def _autoscale(prompt_tokens: float, ttft_p50_ms: float) -> AutoscaleDecision:
    views = [
        node(f"n{i}", model="llama-70b", gpu_type="H100", gpu_count=4, running_requests=1 if i < 2 else 0)
        for i in range(10)
    ]
    rate = 0.2  # calls per second: light load
    snap = snapshot(
        views,
        pool_fields={
            "p": {
                "requests_w": 30,
                "request_rate_per_s": rate,
                "prompt_tokens_rate_per_s": rate * prompt_tokens,
                "output_tokens_rate_per_s": rate * 300,
                "ttft_p50_ms_w": ttft_p50_ms,
            }
        },
    )
    params = SloPredictiveParams(min_nodes=2, max_nodes=20)
    (d,) = SloPredictive().decide(snap, params, SloPredictive().initial_state(), ctx(snap)).decisions
    assert isinstance(d, AutoscaleDecision)
    return d


@pytest.mark.parametrize(
    ("prompt_tokens", "ttft_p50_ms", "grows"),
    [
        (30_000, 3_000.0, False),  # ~2.7 s of it is the prefill itself: no node count removes it
        (30_000, 4_000.0, True),  # 1.3 s of waiting above the prefill, past the 1 s target: queueing
        (500, 3_000.0, True),  # a short prompt waiting 3 s is queueing
    ],
)
def test_autoscale_separates_prefill_compute_from_queueing(
    prompt_tokens: float, ttft_p50_ms: float, grows: bool
) -> None:
    d = _autoscale(prompt_tokens, ttft_p50_ms)
    # The raw target, before stabilization (a first tick holds the count, as HPA's first sync).
    assert (d.inputs["raw_desired"] > d.current_nodes) is grows
    assert d.inputs["prefill_ms"] > (2000.0 if prompt_tokens > 10_000 else 0.0)


# -- the property: a pure capacity loss costs priority 0 nothing through any lever -----------------


DEFAULT = builtin_policy()


@settings(max_examples=40, deadline=None)
@given(
    n_serving=st.integers(3, 12),
    n_lost=st.integers(1, 12),
    how=st.sampled_from(["cold", "stale"]),
    lost_failures=st.integers(1, 200),
    kv=st.floats(0.0, 0.9),
    ttft=st.floats(50.0, 20_000.0),
)
def test_capacity_loss_never_costs_priority_zero(
    n_serving: int, n_lost: int, how: str, lost_failures: int, kv: float, ttft: float
) -> None:
    """Some nodes vanish (crash: stale; preemption: cold), every call on them failed, the nodes
    left are healthy. Then: admission never limits priority 0's calls and never tightens for the
    lost calls, every lost call's retry goes past the budget, no serving node is ejected, and the
    autoscaler does not give capacity back."""
    serving = [node(f"s{i:02d}", requests_w=50, ok_w=50, kv_cache_used_frac=kv) for i in range(n_serving)]
    lost = [
        node(
            f"x{i:02d}",
            requests_w=lost_failures,
            failures_w=lost_failures,
            consecutive_failures=lost_failures,
            stale=how == "stale",
            weights_state="cold" if how == "cold" else "warm",
        )
        for i in range(n_lost)
    ]
    requests = 50 * n_serving + lost_failures * n_lost
    snap: FleetSnapshot = snapshot(
        serving + lost,
        pool_fields={
            "p": {
                "requests_w": requests,
                "ok_w": 50 * n_serving,
                "failures_w": lost_failures * n_lost,
                "retries_w": requests // 4,
                "ttft_p99_ms_w": ttft,
                "ttft_p50_ms_w": ttft / 2,
                "requests_by_priority_w": {0: requests // 2, 2: requests - requests // 2},
            }
        },
        tenants=[
            tenant("gold", 0, requests_w=requests // 2),
            tenant("free", 2, requests_w=requests - requests // 2),
        ],
    )
    result = decide(snap, DEFAULT, EngineState(), Tick(ts_ms=NOW_MS, tick_id=1, pool_id="p"))
    bodies = [d.body for d in result.decisions]
    for b in bodies:
        if isinstance(b, AdmissionDecision):
            assert "0" not in b.new_task_max_outstanding
            assert "0" not in b.max_outstanding
            assert b.max_queue_depth.get("0", 10**9) >= 2
            assert b.reason != "slo-near"  # the lost calls are not distress
        if isinstance(b, RetryBudgetDecision):
            assert "error" in b.exempt_retries_of  # every lost call's retry goes, uncounted
        if isinstance(b, BreakerDecision) and b.node_id.startswith("s"):
            assert not (b.enforced and b.state == "open")
        if isinstance(b, AutoscaleDecision):
            assert b.desired_nodes >= b.current_nodes


@pytest.mark.parametrize(
    ("exempt", "failed_as", "allowed_after_spent"),
    [
        (("error", "shed"), "shed", True),  # a shed call's retry: not a storm retry
        (("error", "shed"), "error", True),  # a call its node dropped: replaced, not duplicated
        (("error", "shed"), "timeout", False),  # a timed-out call's retry: the storm, budgeted
        ((), "shed", False),  # Finagle's plain budget counts every retry
    ],
)
def test_router_lets_exempt_retries_through_a_spent_budget(
    exempt: tuple[str, ...], failed_as: str, allowed_after_spent: bool
) -> None:
    r: Router[Endpoint] = Router({}, np.random.default_rng(0), members={}, nodes={})
    body = RetryBudgetDecision(
        entity="pool/p",
        pool_id="p",
        reason="r",
        retry_ratio=0.2,
        min_retries_per_s=0.0,
        retries_allowed_now=1,
        exempt_retries_of=exempt,  # type: ignore[arg-type]
    )
    stamp = PolicyStamp(name="t", version=1, hash="0" * 16, mode="enforce")
    routed = RoutingDecision(entity="pool/p", pool_id="p", reason="r", weights={"n": 1.0})
    r.apply([Decision(ts_ms=NOW_MS, tick_id=1, policy=stamp, body=b) for b in (routed, body)], now_s=0.0)
    assert r.allow_retry("p", "t", "timeout", now_s=1.0)  # spends the only one
    assert r.allow_retry("p", "t", failed_as, now_s=1.0) is allowed_after_spent


def test_ratio_publishes_the_exemptions_unless_turned_off() -> None:
    assert _budget({"requests_w": 10}).exempt_retries_of == ("error", "shed")
    assert _budget({"requests_w": 10}, exempt_shed_and_lost=False).exempt_retries_of == ()


def test_model_counts_tasks_ended_and_lost_on_a_pool_not_those_we_shed() -> None:
    from fleetloop.core.model import FleetModel, apply
    from fleetloop.core.model import snapshot as model_snapshot
    from tests.support.records import outcome, telemetry

    t0 = 1_700_000_000_000
    model = apply(
        FleetModel(),
        [
            telemetry("a", ts_ms=t0),
            outcome("a", "ok", ts_ms=t0 + 100, n=1, task_outcome="succeeded"),
            outcome("a", "retry", ts_ms=t0 + 150, n=2),  # a failed call the client retries: no task
            outcome("a", "timeout", ts_ms=t0 + 200, n=2, attempt=1, task_outcome="failed"),  # lost
            outcome("a", "error", ts_ms=t0 + 300, n=3, task_outcome="failed"),  # lost
            outcome(None, "shed", ts_ms=t0 + 400, n=4, task_outcome="failed"),  # our own shed: not lost
            outcome("a", "ok", ts_ms=t0 + 500, n=5),  # a step of a task under way
        ],
    )
    pool = model_snapshot(model, t0 + 1_000, window_ms=10_000).pools["p"]
    assert (pool.tasks_ended_w, pool.tasks_lost_w) == (4, 2)
    later = model_snapshot(model, t0 + 20_000, window_ms=10_000).pools["p"]
    assert (later.tasks_ended_w, later.tasks_lost_w) == (0, 0)  # out of the window


def test_model_splits_the_workflow_ledger_by_pool() -> None:
    """Per pool: open tasks that called it, tasks that first called it, those of them that ended
    (wherever their final call was), and failed tasks whose final call was here, sheds included."""
    from fleetloop.core.model import FleetModel, apply
    from fleetloop.core.model import snapshot as model_snapshot
    from tests.support.records import outcome, telemetry

    t0 = 1_700_000_000_000
    model = apply(
        FleetModel(),
        [
            telemetry("a", ts_ms=t0),
            telemetry("b", pool="q", ts_ms=t0),
            outcome("a", "ok", ts_ms=t0 + 100, n=1),  # task 1 calls p, then q, and ends on q
            outcome("b", "ok", pool="q", ts_ms=t0 + 200, n=1, task_outcome="succeeded"),
            outcome("a", "ok", ts_ms=t0 + 300, n=2),  # task 2: open on p
            outcome("a", "ok", ts_ms=t0 + 350, n=2, step_index=1),  # its second call: counted once
            outcome("b", "ok", pool="q", ts_ms=t0 + 400, n=3),  # task 3: open on q
            outcome(None, "shed", pool="q", ts_ms=t0 + 500, n=4, task_outcome="failed"),  # shed on q
            outcome("a", "timeout", ts_ms=t0 + 600, n=5, task_outcome="failed"),  # lost on p
        ],
    )
    snap = model_snapshot(model, t0 + 1_000, window_ms=10_000)
    p, q = snap.pools["p"], snap.pools["q"]
    assert (p.open_workflows, p.workflows_started, p.workflows_ended, p.tasks_failed) == (1, 3, 2, 1)
    assert (q.open_workflows, q.workflows_started, q.workflows_ended, q.tasks_failed) == (1, 3, 2, 1)
    assert snap.ledger.active_workflows == 2  # tasks 2 and 3; the fleet's count holds both pools'
