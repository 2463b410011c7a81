"""slo-aware: outstanding-work limits on new low-priority tasks that tighten while the pool misses
its SLO and loses tasks, relax otherwise; priority 0 and continuing calls are not limited."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from fleetloop.policies.admission.slo_aware import (
    SloAware,
    SloAwareParams,
    failure_frac,
    new_task_limits,
    next_level,
    pressure,
    queue_limits,
)
from fleetloop.policies.slo import Slo, SloBook
from fleetloop.router import Router
from fleetloop.schemas.decisions import AdmissionDecision
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from tests.policies.snapshots import ctx, node, snapshot

P = SloAwareParams()  # tighten 0.9, relax 0.6, x0.7, +4, [16, 256]
# The SLO comes from the policy's classes (spec.slo) through the context, no longer from params.
SLO = Slo(1500.0, 80.0)
BOOK = SloBook(default=SLO)


@pytest.mark.parametrize(
    ("level", "x", "failing", "expected"),
    [
        (256.0, 1.2, 0.10, (179.2, "slo-near")),
        (256.0, 0.9, 0.05, (179.2, "slo-near")),  # both exactly at their thresholds
        (20.0, 3.0, 0.50, (16.0, "slo-near")),  # floor
        (256.0, 3.0, 0.01, (256.0, "tasks-succeed")),  # over the SLO but tasks succeed: no shedding
        (100.0, 3.0, 0.0, (142.857143, "tasks-succeed")),  # ... and the level climbs back (/ 0.7)
        (16.0, 3.0, 0.0, (22.857143, "tasks-succeed")),  # as fast as it fell, at least +4
        (250.0, 3.0, 0.0, (256.0, "tasks-succeed")),  # ceiling
        (100.0, 0.7, 0.20, (100.0, "hold")),
        (100.0, 0.6, 0.20, (104.0, "slo-headroom")),  # failing, but latency fine: not our lever
        (254.0, 0.1, 0.20, (256.0, "slo-headroom")),  # ceiling
        (100.0, None, 0.9, (100.0, "no-data")),
        (1.0, None, 0.9, (16.0, "no-data")),  # an out-of-bounds state is clamped
    ],
)
def test_next_level_table(level: float, x: float | None, failing: float, expected: tuple[float, str]) -> None:
    got, reason = next_level(P, level, x, failing)
    assert (round(got, 6), reason) == expected


def test_pressure_is_the_worse_of_ttft_and_tbt() -> None:
    assert pressure(SLO, 3000.0, 40.0) == 2.0
    assert pressure(SLO, 300.0, 120.0) == 1.5
    assert pressure(SLO, None, 40.0) == 0.5
    assert pressure(SLO, None, None) is None


def test_failure_frac_ignores_an_idle_window() -> None:
    assert failure_frac(0, 0) == 0.0
    assert failure_frac(200, 20) == 0.1


@pytest.mark.parametrize(
    ("params", "level", "expected"),
    [
        ({}, 16.0, {"1": 32, "2": 16}),  # priority 0 is never limited
        ({}, 179.2, {"1": 358, "2": 179}),
        ({"classes": 4, "class_spread": 1.5}, 20.0, {"1": 45, "2": 30, "3": 20}),
        ({"protect_priority": -1, "classes": 2}, 10.0, {"0": 20, "1": 10}),
        ({"protect_priority": 1}, 16.0, {"2": 16}),
        ({"classes": 1}, 16.0, {}),
    ],
)
def test_new_task_limits(params: dict[str, Any], level: float, expected: dict[str, int]) -> None:
    assert new_task_limits(SloAwareParams(**params), level) == expected


def test_queue_limits_are_the_static_queue_depth_ones() -> None:
    assert queue_limits(P) == ({"0": 64, "1": 32, "2": 16}, {"0": 48, "1": 24, "2": 12})


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (16.0, ({"0": 64, "1": 32, "2": 16}, {"0": 48, "1": 24, "2": 12})),  # distress: the static ones
        (1.0, ({"0": 64, "1": 32, "2": 16}, {"0": 48, "1": 24, "2": 12})),  # never below them
        (32.0, ({"0": 128, "1": 64, "2": 32}, {"0": 96, "1": 48, "2": 24})),
        (256.0, ({"0": 1024, "1": 512, "2": 256}, {"0": 768, "1": 384, "2": 192})),  # tasks succeed: 16x
    ],
)
def test_queue_limits_open_with_the_level(
    level: float, expected: tuple[dict[str, int], dict[str, int]]
) -> None:
    """A queue that drains before its calls time out costs latency, not tasks: the queue limits
    are the static ones only under distress (mass preemption)."""
    assert queue_limits(P, level) == expected


def _overloaded(lost: int, ttft_p99: float = 3000.0, ttft_p50: float = 900.0) -> Any:
    return snapshot(
        [node("a", tbt_p99_ms=50.0, queue_depth=1, running_requests=70), node("b", tbt_p99_ms=60.0)],
        pool_fields={
            "p": {
                "requests_w": 1000,
                "shed_w": 100,
                "failures_w": 2 * lost,
                "tasks_ended_w": 900,
                "tasks_lost_w": lost,
                "ttft_p99_ms_w": ttft_p99,
                "ttft_p50_ms_w": ttft_p50,
            }
        },
    )


def test_decide_tightens_under_distress_and_publishes_everything() -> None:
    snap = _overloaded(lost=90)  # 90 of 900 tasks lost = 10% failing, pressure 2.0
    res = SloAware().decide(snap, P, None, ctx(snap, slo=BOOK))
    (d,) = res.decisions
    assert isinstance(d, AdmissionDecision)
    assert (d.entity, d.pool_id, d.reason) == ("pool/p", "p", "slo-near")
    assert d.new_task_max_outstanding == {"1": 358, "2": 179}
    assert d.max_outstanding == {}  # continuing calls are never shed on outstanding work
    # Queue thresholds follow the level: 179.2 / 16 = 11.2x the static ones.
    assert d.max_queue_depth == {"0": 716, "1": 358, "2": 179}
    assert d.new_task_max_queue_depth == {"0": 537, "1": 268, "2": 134}
    assert d.reject_if_budget_below_ms == 900
    assert res.state == 179.2
    assert d.inputs["slo_pressure"] == 2.0
    assert d.inputs["failure_frac_w"] == 0.1
    assert d.inputs["max_outstanding_seen"] == 71.0


def test_decide_does_not_shed_while_tasks_succeed() -> None:
    snap = _overloaded(lost=9)  # 1% of tasks lost: latency is over the SLO but tasks still succeed
    res = SloAware().decide(snap, P, None, ctx(snap, slo=BOOK))
    (d,) = res.decisions
    assert d.reason == "tasks-succeed"
    assert d.new_task_max_outstanding == {}  # at the ceiling: no outstanding limit
    res = SloAware().decide(snap, P, 100.0, ctx(snap, slo=BOOK))  # below it, the level's limits
    assert res.decisions[0].new_task_max_outstanding == {"1": 285, "2": 142}


def test_the_level_climbs_back_as_fast_as_it_fell_once_tasks_succeed() -> None:
    """After a breach (a burst of lost tasks when half a busy pool was reclaimed) the level sits at
    its floor; once a window has lost no task the level is back at the ceiling within 8 ticks, and
    with it no new-task outstanding limit, even with TTFT p99 still 20x the SLO (the queue built
    while the pool was short drains for a while). An additive climb (+4 a tick) still shed every
    new low-priority task on a node with calls queued a minute later."""
    level, fell = P.max_level, 0
    while level > P.min_level:  # distress: 10% of tasks lost, pressure 20
        level, fell = next_level(P, level, 20.0, 0.1)[0], fell + 1
    assert fell == 8
    snap = _overloaded(lost=0, ttft_p99=30_000.0)
    climbed: list[float] = []
    for _ in range(fell):
        res = SloAware().decide(snap, P, level, ctx(snap, slo=BOOK))
        assert res.decisions[0].reason == "tasks-succeed"
        level = res.state
        climbed.append(level)
    assert climbed[-2] < P.max_level == climbed[-1]
    assert res.decisions[0].new_task_max_outstanding == {}


def test_reject_budget_is_capped_and_off_without_data() -> None:
    snap = _overloaded(lost=0, ttft_p50=9000.0)
    (d,) = SloAware().decide(snap, P, None, ctx(snap, slo=BOOK)).decisions
    assert d.reject_if_budget_below_ms == 2000
    quiet = snapshot([node("a")])
    (q,) = SloAware().decide(quiet, P, None, ctx(quiet, slo=BOOK)).decisions
    assert (q.reject_if_budget_below_ms, q.reason) == (0, "no-data")


def test_param_bounds() -> None:
    with pytest.raises(ValidationError):
        SloAwareParams(relax_below=1.0, tighten_at=0.9)
    with pytest.raises(ValidationError):
        SloAwareParams(min_level=300.0, max_level=256.0)
    with pytest.raises(ValidationError):
        SloAwareParams(decrease=1.0)


# -- the router applies the outstanding limits (fleetloop/router/pick.py, admit) --------------------


def _router_with(d: AdmissionDecision) -> Router[Any]:
    r: Router[Any] = Router({}, np.random.default_rng(0))
    r.state.pool(d.pool_id).admission = d
    return r


@pytest.mark.parametrize(
    ("priority", "new_task", "queue", "running", "admitted"),
    [
        (2, True, 0, 15, True),
        (2, True, 1, 15, False),  # first call of a new low-priority task: outstanding 16 >= 16
        (2, True, 0, 16, True),  # ... but a node with nothing queued takes it into its batch
        (2, False, 0, 200, True),  # a later call of a task under way: no outstanding limit
        (2, False, 16, 0, False),  # ... but a full node's queue still sheds it
        (1, True, 1, 31, False),
        (1, True, 0, 31, True),
        (0, True, 0, 10_000, True),  # priority 0: never on outstanding work
    ],
)
def test_router_sheds_on_outstanding_work(
    priority: int, new_task: bool, queue: int, running: int, admitted: bool
) -> None:
    d = AdmissionDecision(
        entity="pool/p",
        pool_id="p",
        reason="r",
        max_queue_depth={"0": 64, "1": 32, "2": 16},
        new_task_max_outstanding={"1": 32, "2": 16},
    )
    fake = SimpleNamespace(queue_depth=queue, running=running)
    got = _router_with(d).admit("p", fake, priority, new_task=new_task, budget_ms=10_000)  # type: ignore[arg-type]
    assert got is admitted


def test_router_continuing_limit_applies_when_published() -> None:
    d = AdmissionDecision(
        entity="pool/p", pool_id="p", reason="r", max_queue_depth={}, max_outstanding={"2": 40}
    )
    r = _router_with(d)
    assert r.admit("p", SimpleNamespace(queue_depth=0, running=39), 2, new_task=False, budget_ms=1)  # type: ignore[arg-type]
    assert not r.admit("p", SimpleNamespace(queue_depth=2, running=38), 2, new_task=True, budget_ms=1)  # type: ignore[arg-type]


# -- properties ------------------------------------------------------------------------------------

levels = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
xs = st.none() | st.floats(min_value=0.0, max_value=1e3, allow_nan=False)
fracs = st.floats(min_value=0.0, max_value=1.0)


@settings(deadline=None)  # pure functions: a deadline would time the loaded machine, not the code
@given(levels, xs, fracs)
def test_level_always_within_bounds(level: float, x: float | None, f: float) -> None:
    new, _ = next_level(P, level, x, f)
    assert P.min_level <= new <= P.max_level


@settings(deadline=None)  # pure functions: a deadline would time the loaded machine, not the code
@given(levels, st.floats(0.0, 100.0), st.floats(0.0, 100.0), fracs, fracs)
def test_level_monotone_non_increasing_in_pressure_and_failures(
    level: float, x1: float, x2: float, f1: float, f2: float
) -> None:
    (xl, xh), (fl, fh) = sorted((x1, x2)), sorted((f1, f2))
    assert next_level(P, level, xh, fh)[0] <= next_level(P, level, xl, fl)[0]


@settings(deadline=None)  # pure functions: a deadline would time the loaded machine, not the code
@given(st.floats(1.0, 256.0), st.integers(1, 10), st.floats(1.0, 16.0))
@example(level=256.0, classes=2, spread=1.0)  # the ceiling: no class limited (raised KeyError '1' once)
def test_more_important_classes_never_get_less_room(level: float, classes: int, spread: float) -> None:
    params = SloAwareParams(classes=classes, class_spread=spread)
    limits = new_task_limits(params, level)
    assert "0" not in limits
    if level >= params.max_level:
        assert limits == {}  # at the ceiling (no distress since it climbed back) nobody is limited
        return
    values = [limits[str(p)] for p in range(1, classes)]
    assert values == sorted(values, reverse=True)


@settings(deadline=None)  # pure functions: a deadline would time the loaded machine, not the code
@given(st.floats(16.0, 256.0), st.integers(0, 500))
def test_idempotent_for_the_same_tick(level: float, lost: int) -> None:
    snap = _overloaded(lost=lost)
    a = SloAware().decide(snap, P, level, ctx(snap, slo=BOOK))
    b = SloAware().decide(snap, P, level, ctx(snap, slo=BOOK))
    assert a.decisions == b.decisions
    assert a.state == b.state
