"""The fleet model: a pure reducer over telemetry and outcomes, read through ``snapshot``."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np
import pytest
from fleetloop.core.model import FleetModel, ModelConfig, apply, snapshot
from fleetloop.core.model.windows import LAT_EDGES_MS, lat_bin
from fleetloop.policies.base import NodeView
from fleetloop.schemas import NodeTelemetry, RequestOutcome
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from tests.oracles.snapshot import node_view_plain
from tests.support.records import outcome, telemetry

T = 1_700_000_000_000  # a whole second: bucket boundaries fall on T + k * 1000

Record = NodeTelemetry | RequestOutcome


def fold(records: Sequence[Record], config: ModelConfig | None = None) -> FleetModel:
    return apply(FleetModel(config), records)


# -- newest telemetry -------------------------------------------------------------------------------


@pytest.mark.parametrize("order", [(0, 1), (1, 0)], ids=["in-order", "older-arrives-later"])
def test_newest_telemetry_by_event_time_wins(order: tuple[int, int]) -> None:
    records = [
        telemetry("a", ts_ms=T + 1_000, queue_depth=3),
        telemetry("a", ts_ms=T + 2_000, queue_depth=7, weights_state="loading"),
    ]
    snap = snapshot(fold([records[i] for i in order]), T + 2_500)
    a = snap.nodes["a"]
    assert (a.queue_depth, a.weights_state, a.last_seen_ms, a.age_ms) == (7, "loading", T + 2_000, 500)


# -- windows ----------------------------------------------------------------------------------------

WINDOW_RECORDS = [
    telemetry("a", ts_ms=T + 10_000),
    outcome("a", "ok", ts_ms=T + 500, n=1, ttft_ms=999.0),  # bucket T: outside both windows
    outcome("a", "ok", ts_ms=T + 1_000, n=2, ttft_ms=50.0),
    outcome("a", "error", ts_ms=T + 5_000, n=3),
    outcome("a", "timeout", ts_ms=T + 9_000, n=4),
    outcome("a", "ok", ts_ms=T + 10_400, n=5, ttft_ms=150.0),
]


@pytest.mark.parametrize(
    ("window_ms", "requests", "ok", "failures", "ttft_mean"),
    [
        (10_000, 4, 2, 2, 100.0),  # buckets T+1 s .. T+10 s
        (5_000, 2, 1, 1, 150.0),  # buckets T+6 s .. T+10 s
        (1_000, 1, 1, 0, 150.0),  # the newest bucket only
    ],
)
def test_node_window_counts(window_ms: int, requests: int, ok: int, failures: int, ttft_mean: float) -> None:
    snap = snapshot(fold(WINDOW_RECORDS), T + 10_500, window_ms=window_ms)
    a = snap.nodes["a"]
    assert (a.requests_w, a.ok_w, a.failures_w, a.ttft_mean_ms_w) == (requests, ok, failures, ttft_mean)
    pool = snap.pools["p"]
    assert (pool.requests_w, pool.ok_w, pool.failures_w) == (requests, ok, failures)
    assert pool.request_rate_per_s == pytest.approx(requests / (window_ms / 1000))


def test_a_window_without_ttft_has_no_mean_and_a_window_in_the_past_is_empty() -> None:
    model = fold([telemetry("a", ts_ms=T), outcome("a", "error", ts_ms=T + 100)])
    assert snapshot(model, T + 500).nodes["a"].ttft_mean_ms_w is None
    later = snapshot(model, T + 60_000).nodes["a"]
    assert (later.requests_w, later.failures_w) == (0, 0)


def test_node_reported_counters_are_windowed() -> None:
    model = fold(
        [
            telemetry("a", ts_ms=T, errors=5, timeouts=1),
            telemetry("a", ts_ms=T + 8_000, errors=2, timeouts=3, preemptions=4),
        ]
    )
    both = snapshot(model, T + 9_000, window_ms=10_000).nodes["a"]
    assert (both.node_errors_w, both.node_timeouts_w, both.preemptions_w) == (7, 4, 4)
    newest = snapshot(model, T + 9_000, window_ms=5_000).nodes["a"]
    assert (newest.node_errors_w, newest.node_timeouts_w, newest.preemptions_w) == (2, 3, 4)


# -- consecutive failures ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (["error", "error", "timeout"], 3),
        (["error", "error", "ok", "timeout", "retry"], 2),
        (["error", "ok"], 0),
        (["error", "shed", "error"], 2),  # a shed call neither counts nor resets the run
        (["shed", "shed"], 0),
    ],
)
def test_consecutive_failures(kinds: list[str], expected: int) -> None:
    records: list[Record] = [telemetry("a", ts_ms=T)]
    records += [outcome("a", k, ts_ms=T + 100 * i, n=i) for i, k in enumerate(kinds)]
    assert snapshot(fold(records), T + 1_000).nodes["a"].consecutive_failures == expected


# -- TTFT quantiles ---------------------------------------------------------------------------------


def _sample(name: str) -> list[float]:
    if name == "uniform":
        return [float(x) for x in range(1, 1001)]
    if name == "bimodal":
        return [100.0] * 980 + [2_000.0] * 20
    rng = np.random.default_rng(7)
    return [float(x) for x in rng.lognormal(mean=5.0, sigma=0.8, size=2_000)]


@pytest.mark.parametrize("name", ["uniform", "bimodal", "lognormal"])
def test_pool_p99_from_the_histogram_is_within_one_bin_of_the_true_p99(name: str) -> None:
    sample = _sample(name)
    records = [outcome("a", "ok", ts_ms=T + (i % 9_000), n=i, ttft_ms=ttft) for i, ttft in enumerate(sample)]
    pool = snapshot(fold(records), T + 9_500, window_ms=10_000).pools["p"]
    assert pool.requests_w == len(sample)
    true_p99 = float(np.quantile(sample, 0.99, method="inverted_cdf"))
    true_p50 = float(np.quantile(sample, 0.50, method="inverted_cdf"))
    one_bin = 2**0.25  # ~19%
    assert pool.ttft_p99_ms_w is not None
    assert true_p99 / one_bin <= pool.ttft_p99_ms_w <= true_p99 * one_bin
    assert pool.ttft_p50_ms_w is not None
    assert true_p50 / one_bin <= pool.ttft_p50_ms_w <= true_p50 * one_bin


def test_latency_bins_are_one_fourth_octave_wide() -> None:
    ratios = {round(b / a, 9) for a, b in itertools.pairwise(LAT_EDGES_MS)}
    assert ratios == {round(2**0.25, 9)}
    assert lat_bin(0.5) == 0
    assert lat_bin(1.0) == 1


def test_a_pool_without_ttft_has_no_quantiles() -> None:
    pool = snapshot(fold([outcome("a", "error", ts_ms=T)]), T + 500).pools["p"]
    assert (pool.ttft_p50_ms_w, pool.ttft_p99_ms_w) == (None, None)


# -- retries, sheds, tenants ------------------------------------------------------------------------


def test_retries_are_counted_by_attempt_not_by_outcome() -> None:
    records = [
        outcome("a", "retry", ts_ms=T + 100, n=1, attempt=0),  # failed; the retry is the next attempt
        outcome("a", "ok", ts_ms=T + 200, n=1, attempt=1),
        outcome("a", "ok", ts_ms=T + 300, n=2, attempt=2),
        outcome("a", "ok", ts_ms=T + 400, n=3),
    ]
    snap = snapshot(fold(records), T + 1_000, window_ms=10_000)
    pool = snap.pools["p"]
    assert (pool.requests_w, pool.retries_w, pool.failures_w) == (4, 2, 1)
    assert pool.retry_rate_per_s == pytest.approx(0.2)
    assert snap.tenants["t"].retries_w == 2


def test_tenants() -> None:
    records = [
        outcome("a", "ok", ts_ms=T + 100, n=1, tenant_id="gold", priority=0),
        outcome("a", "ok", ts_ms=T + 200, n=2, tenant_id="gold", priority=0, attempt=1),
        outcome(None, "shed", ts_ms=T + 300, n=3, tenant_id="gold", priority=0),
        outcome(None, "shed", ts_ms=T + 400, n=4, tenant_id="bronze", priority=2),
        outcome("b", "error", ts_ms=T + 500, n=5, tenant_id="bronze", priority=2),
    ]
    snap = snapshot(fold(records), T + 1_000)
    assert list(snap.tenants) == ["bronze", "gold"]
    got = {t: (v.priority, v.requests_w, v.retries_w, v.shed_w) for t, v in snap.tenants.items()}
    assert got == {"gold": (0, 3, 1, 1), "bronze": (2, 2, 0, 1)}
    assert snap.pools["p"].shed_w == 2


# -- the workflow ledger ----------------------------------------------------------------------------


def _step(wf: str, ts: int, step: int, cost: float, kind: str = "ok", **kw: object) -> RequestOutcome:
    return outcome(
        "a",
        kind,
        ts_ms=ts,
        workflow_id=wf,
        request_id=f"{wf}-{step}-{ts}",
        step_index=step,
        cost_usd=cost,
        **kw,
    )


def test_tasks_started_counts_distinct_workflows() -> None:
    records = [
        _step("w1", T + 100, 0, 0.01),
        _step("w1", T + 200, 1, 0.01),
        _step("w2", T + 300, 0, 0.01),
        _step("w1", T + 400, 2, 0.01),
    ]
    ledger = snapshot(fold(records), T + 1_000).ledger
    assert (ledger.tasks_started, ledger.active_workflows, ledger.tasks_succeeded, ledger.tasks_failed) == (
        2,
        2,
        0,
        0,
    )


def test_task_outcome_finalizes_and_late_records_of_finished_tasks_are_ignored() -> None:
    records = [
        _step("w1", T + 100, 0, 0.25),
        _step("w1", T + 200, 1, 0.25, task_outcome="succeeded"),
        _step("w2", T + 300, 0, 0.5, "error"),
        _step("w2", T + 400, 0, 0.5, attempt=1),
        _step("w2", T + 500, 1, 1.0, "timeout", task_outcome="failed"),
        # Late and duplicate records of finished tasks:
        _step("w2", T + 450, 1, 9.0),
        _step("w1", T + 150, 0, 9.0, task_outcome="failed"),
    ]
    ledger = snapshot(fold(records), T + 1_000).ledger
    assert (ledger.tasks_started, ledger.tasks_succeeded, ledger.tasks_failed, ledger.active_workflows) == (
        2,
        1,
        1,
        0,
    )
    assert ledger.spend_on_failed_usd == pytest.approx(2.0)  # every attempt of w2, not w1's spend


def test_fleet_cost_comes_from_telemetry_and_gives_cost_per_successful_task() -> None:
    records: list[Record] = [
        telemetry("a", ts_ms=T + 1_000, cost_rate_usd_per_h=3.6, interval_ms=1_000),  # $0.001
        telemetry("a", ts_ms=T + 2_000, cost_rate_usd_per_h=3.6, interval_ms=1_000),  # $0.001
        telemetry("b", ts_ms=T + 2_000, cost_rate_usd_per_h=7.2, interval_ms=5_000),  # $0.01
        _step("w1", T + 100, 0, 0.0, task_outcome="succeeded"),
    ]
    ledger = snapshot(fold(records), T + 3_000).ledger
    assert ledger.fleet_cost_usd == pytest.approx(0.012)
    assert ledger.cost_per_successful_task_usd == pytest.approx(0.012)
    more = apply(fold(records), [_step("w2", T + 200, 0, 0.0, task_outcome="succeeded")])
    assert snapshot(more, T + 3_000).ledger.cost_per_successful_task_usd == pytest.approx(0.006)


def test_no_successful_task_means_no_cost_per_task() -> None:
    ledger = snapshot(fold([telemetry("a", ts_ms=T)]), T + 500).ledger
    assert ledger.fleet_cost_usd > 0
    assert ledger.cost_per_successful_task_usd is None


def test_a_task_quiet_past_the_horizon_is_handed_off_not_failed() -> None:
    config = ModelConfig(abandon_workflow_after_ms=30_000)
    model = fold([_step("w1", T, 0, 0.3), _step("w2", T + 25_000, 0, 0.1)], config)
    assert snapshot(model, T + 25_000).ledger.active_workflows == 2
    apply(model, [telemetry("x", ts_ms=T + 45_000)])  # telemetry alone does not move the ledger's clock
    assert snapshot(model, T + 45_000).ledger.active_workflows == 2
    apply(model, [_step("w3", T + 45_000, 0, 0.0)])  # calls do: w1 quiet 45 s, w2 20 s
    ledger = snapshot(model, T + 45_000).ledger
    assert (ledger.active_workflows, ledger.tasks_failed, ledger.spend_on_failed_usd) == (2, 0, 0.0)
    assert (model.ledger.tasks_handed_off, model.evicted["workflows"]) == (1, 1)
    assert list(model.ledger.active) == ["w2", "w3"]


def test_a_task_spanning_two_shards_is_counted_once_with_its_whole_spend() -> None:
    """Calls 0-1 reach one partition's shard, call 2 (which fails the task) another's: the second
    counts the failure with the spend the router carried; the first hands the task off."""
    config = ModelConfig(abandon_workflow_after_ms=30_000)
    first = fold([_step("w", T, 0, 0.25), _step("w", T + 1_000, 1, 0.5)], config)
    second = fold(
        [_step("w", T + 2_000, 2, 0.125, "error", workflow_spend_usd=0.75, task_outcome="failed")], config
    )
    for model in (first, second):
        apply(model, [_step("later", T + 60_000, 0, 0.0)])
    a, b = snapshot(first, T + 60_000).ledger, snapshot(second, T + 60_000).ledger
    assert (a.tasks_failed, a.active_workflows, first.ledger.tasks_handed_off) == (0, 1, 1)  # "later"
    assert (b.tasks_failed, b.active_workflows, second.ledger.tasks_handed_off) == (1, 1, 0)
    assert b.spend_on_failed_usd == pytest.approx(0.875)  # 0.25 + 0.5 carried, 0.125 its own


def test_a_task_still_calling_here_is_kept_however_long_it_runs() -> None:
    config = ModelConfig(abandon_workflow_after_ms=30_000)
    model = FleetModel(config)
    for i in range(12):  # one call every 10 s for 110 s, plus a short task opened each time
        apply(model, [_step("long", T + i * 10_000, i, 0.01), _step(f"s{i}", T + i * 10_000, 0, 0.01)])
    assert "long" in model.ledger.active
    assert model.ledger.tasks_handed_off == 12 - 4  # the short ones quiet over 30 s went
    assert sorted(model.ledger.active) == ["long", "s10", "s11", "s8", "s9"]


def test_open_and_finished_workflows_stay_bounded_by_rate_times_horizon() -> None:
    """Ten minutes of event time at 100 tasks/s, each seen here for one call only (its others
    elsewhere): memory levels off at rate x horizon instead of growing with the run."""
    config = ModelConfig(abandon_workflow_after_ms=30_000, finished_workflow_ttl_ms=60_000)
    model = FleetModel(config)
    peak_active = peak_finished = 0
    for s in range(600):
        batch = [
            _step(
                f"w{s}-{i}",
                T + s * 1_000 + i * 10,
                0,
                0.001,
                task_outcome="succeeded" if i % 4 == 0 else None,
            )
            for i in range(100)
        ]
        apply(model, batch)
        peak_active = max(peak_active, len(model.ledger.active))
        peak_finished = max(peak_finished, len(model.ledger.finished))
    assert peak_active <= 75 * 32  # 75 open/s for the 30 s horizon, plus a second of bucket slack
    assert peak_finished <= 25 * 62
    assert model.ledger.tasks_handed_off >= 75 * 560
    assert model.ledger.tasks_failed == 0


# -- eviction and staleness -------------------------------------------------------------------------


def test_a_silent_node_is_forgotten_after_forget_node_after_ms_of_event_time() -> None:
    model = fold([telemetry("a", ts_ms=T), telemetry("b", ts_ms=T + 30_000)])
    snap = snapshot(model, T + 30_000)
    assert sorted(snap.nodes) == ["a", "b"]
    assert snap.pools["p"].node_ids == ("a", "b")
    apply(model, [telemetry("b", ts_ms=T + 61_000)])  # a silent for 61 s > 60 s
    snap = snapshot(model, T + 61_000)
    assert sorted(snap.nodes) == ["b"]
    assert snap.pools["p"].node_ids == ("b",)


def test_a_node_silent_less_than_forget_node_after_ms_stays_but_is_stale() -> None:
    model = fold([telemetry("a", ts_ms=T), telemetry("b", ts_ms=T + 59_000)])
    a = snapshot(model, T + 59_000).nodes["a"]
    assert (a.stale, a.age_ms) == (True, 59_000)


def test_records_later_than_the_retention_are_dropped_and_counted() -> None:
    model = fold([telemetry("a", ts_ms=T), telemetry("a", ts_ms=T + 400_000)])
    assert model.late_dropped == 0
    apply(
        model,
        [
            outcome("a", "error", ts_ms=T + 50_000, n=1, tenant_id="late"),  # 350 s late: beyond 300 s
            telemetry("c", ts_ms=T + 50_000),
            outcome("a", "ok", ts_ms=T + 399_000, n=2),  # 1 s late: kept
        ],
    )
    assert model.late_dropped == 2
    snap = snapshot(model, T + 400_000, window_ms=300_000)
    assert "c" not in snap.nodes
    assert "late" not in snap.tenants
    assert (snap.nodes["a"].requests_w, snap.nodes["a"].failures_w) == (1, 0)


@pytest.mark.parametrize(
    ("age_ms", "stale"),
    [(0, False), (4_999, False), (5_000, False), (5_001, True), (60_000, True)],
)
def test_staleness(age_ms: int, stale: bool) -> None:
    a = snapshot(fold([telemetry("a", ts_ms=T)]), T + age_ms, stale_after_ms=5_000).nodes["a"]
    assert (a.age_ms, a.stale) == (age_ms, stale)


def test_snapshot_does_not_change_the_model() -> None:
    model = fold(WINDOW_RECORDS)
    assert snapshot(model, T + 10_500) == snapshot(model, T + 10_500)


# -- order independence -----------------------------------------------------------------------------

SPAN_MS = 50_000  # within forget_node_after_ms and the retention: nothing is evicted


@st.composite
def pool_records(draw: st.DrawFn, pool: str) -> list[Record]:
    """One pool's records, in the order its partition holds them."""
    nodes = [f"{pool}-n{i}" for i in range(2)]
    out: list[Record] = []
    for i in range(draw(st.integers(1, 12))):
        ts = T + draw(st.integers(0, SPAN_MS))
        if draw(st.booleans()):
            out.append(
                telemetry(
                    draw(st.sampled_from(nodes)),
                    pool,
                    ts,
                    queue_depth=draw(st.integers(0, 20)),
                    errors=draw(st.integers(0, 2)),
                    cost_rate_usd_per_h=draw(st.sampled_from([0.7, 1.3, 2.9, 4.1])),
                    interval_ms=draw(st.sampled_from([1_000, 3_000])),
                )
            )
            continue
        kind = draw(st.sampled_from(["ok", "ok", "error", "timeout", "retry", "shed"]))
        node = None if kind == "shed" and draw(st.booleans()) else draw(st.sampled_from(nodes))
        tenant = draw(st.sampled_from(["t0", "t1"]))  # shared by both pools, one priority each
        out.append(
            outcome(
                node,
                kind,
                pool,
                ts,
                n=i,
                request_id=f"{pool}-r{i}",
                workflow_id=f"{pool}-w{draw(st.integers(0, 3))}",
                tenant_id=tenant,
                priority=int(tenant[1]),
                attempt=draw(st.integers(0, 2)),
                ttft_ms=draw(st.floats(1.0, 5_000.0)) if kind == "ok" else None,
                cost_usd=draw(st.sampled_from([0.0, 0.001, 0.013, 0.2])),
                task_outcome=draw(st.sampled_from([None, None, "succeeded", "failed"])),
            )
        )
    return out


# No shrinking: a counterexample is reported at once (shrinking one takes half a minute); the
# example tests below this one are the minimal cases.
@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    report_multiple_bugs=False,
    phases=(Phase.explicit, Phase.generate),
)
@given(pool_records("pa"), pool_records("pb"), st.data())
def test_folding_two_pools_in_any_interleaving_gives_the_same_snapshot(
    a: list[Record], b: list[Record], data: st.DataObject
) -> None:
    lanes = data.draw(st.permutations([0] * len(a) + [1] * len(b)), label="lanes")
    its = (iter(a), iter(b))
    interleaved = [next(its[lane]) for lane in lanes]
    now = T + SPAN_MS + 1_000
    # Ledger horizons beyond the records' span: a task let go after going quiet and opened again by
    # a later call is counted as started twice, and which comes first follows the fleet clock, so
    # within a horizon's reach the ledger's counts depend on the interleaving (as the late-record
    # rule does within the retention). A shard's fold order is fixed by its cuts, so decisions and
    # replay do not; outcomes (succeeded, failed) do not either (checked below).
    config = ModelConfig(abandon_workflow_after_ms=3_600_000, finished_workflow_ttl_ms=600_000)
    for window_ms in (10_000, 60_000):
        expected = snapshot(fold(a + b, config), now, window_ms=window_ms)
        assert snapshot(fold(interleaved, config), now, window_ms=window_ms) == expected
        assert snapshot(fold(b + a, config), now, window_ms=window_ms) == expected
    outcomes = snapshot(fold(a + b), now).ledger
    for order in (interleaved, b + a):
        ledger = snapshot(fold(order), now).ledger
        assert (ledger.tasks_succeeded, ledger.tasks_failed) == (
            outcomes.tasks_succeeded,
            outcomes.tasks_failed,
        )


def test_fleet_cost_does_not_depend_on_the_interleaving_of_pools() -> None:
    """The cost of the same four intervals, folded pool A first or pool B first."""
    pa = [telemetry("a", "pa", T, cost_rate_usd_per_h=0.7)]
    pb = [telemetry("b", "pb", T + 1_000 * i, cost_rate_usd_per_h=r) for i, r in enumerate((0.7, 0.7, 1.3))]
    now = T + 3_000
    assert snapshot(fold(pb + pa), now).ledger == snapshot(fold(pa + pb), now).ledger


def test_interleaving_does_not_decide_whether_a_node_is_forgotten() -> None:
    """Pool pa's node reports at T and gets a failed call at T+55 s; pool pb reports at T+61 s.
    Both pools' own orders are kept; only the interleaving across partitions differs."""
    pa = [telemetry("a", "pa", T), outcome("a", "error", "pa", T + 55_000, n=1)]
    pb = [telemetry("b", "pb", T + 61_000)]
    now = T + 62_000
    assert snapshot(fold([pa[0], pb[0], pa[1]]), now) == snapshot(fold(pa + pb), now)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.integers(min_value=0, max_value=12_000),
            st.sampled_from(["ok", "error", "timeout"]),
            st.none() | st.floats(min_value=0.0, max_value=5_000.0),
        ),
        max_size=30,
    ),
    st.none() | st.floats(min_value=0.5, max_value=500.0),
    st.sampled_from(["warm", "cold", "loading"]),
    st.booleans(),
    st.integers(min_value=0, max_value=20_000),
)
def test_snapshot_node_views_equal_the_keyword_built_views(
    calls: list[tuple[str, int, str, float | None]],
    tbt: float | None,
    weights_state: str,
    draining: bool,
    now_offset: int,
) -> None:
    """The snapshot builds each node's view by setting its slots (a fast path); it must equal, field
    for field and in type, the view built with keywords from the same node."""
    records: list[Record] = [
        telemetry(n, ts_ms=T + 3_000, tbt_p50_ms=tbt, weights_state=weights_state, draining=draining)
        for n in ("a", "b", "c")
    ]
    records += [
        outcome(n, kind, ts_ms=T + at, n=i, ttft_ms=ttft if kind == "ok" else None)
        for i, (n, at, kind, ttft) in enumerate(calls)
    ]
    model = fold(records)
    now = T + now_offset
    snap = snapshot(model, now)
    for node_id, view in snap.nodes.items():
        plain = node_view_plain(model.nodes[node_id], now, 10_000, 5_000)
        assert view == plain
        assert [type(getattr(view, f.name)) for f in dataclasses.fields(NodeView)] == [
            type(getattr(plain, f.name)) for f in dataclasses.fields(NodeView)
        ]


def test_the_handoff_horizon_is_learned_from_the_gaps_between_a_tasks_calls() -> None:
    from fleetloop.core.model.fleet import GAP_EDGES_MS, handoff_horizon_ms

    config = ModelConfig(abandon_workflow_after_ms=120_000, min_handoff_ms=10_000)
    gaps = [0] * (len(GAP_EDGES_MS) + 1)
    assert handoff_horizon_ms(gaps, config) == 120_000  # nothing learned yet: the ceiling
    gaps[0] = 5_000  # calls of one task here come within a second of each other
    assert handoff_horizon_ms(gaps, config) == 10_000  # twice 1 s, raised to the floor
    gaps[GAP_EDGES_MS.index(20_000)] = 4  # a few long gaps (0.08%) do not move it
    assert handoff_horizon_ms(gaps, config) == 10_000
    gaps[GAP_EDGES_MS.index(20_000)] = 50  # 1%: they do, to twice their bucket's edge
    assert handoff_horizon_ms(gaps, config) == 40_000
    gaps[-1] = 5_000  # most gaps beyond every edge: the ceiling, never more
    assert handoff_horizon_ms(gaps, config) == 120_000


def test_a_shard_whose_tasks_call_again_at_once_lets_them_go_after_seconds() -> None:
    """Tasks whose two calls here come 100 ms apart (their other calls went elsewhere): once the
    shard has seen enough of them it lets a quiet one go after the 10 s floor, not 120 s."""
    model = FleetModel(ModelConfig(abandon_workflow_after_ms=120_000, min_handoff_ms=10_000))
    for s in range(60):
        batch = []
        for i in range(50):
            wf, ts = f"w{s}-{i}", T + s * 1_000 + i * 10
            batch += [_step(wf, ts, 0, 0.001), _step(wf, ts + 100, 1, 0.001)]
        apply(model, batch)
    assert sum(model.ledger.gaps) == 3_000
    assert model.ledger.tasks_handed_off >= 50 * (60 - 12)
    assert len(model.ledger.active) <= 50 * 12
