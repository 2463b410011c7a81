"""The fleet end to end: determinism, accounting identities, faults, and the FleetSim contract."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fleetloop.policies.registry import PolicyError, builtin_policy
from fleetloop.schemas.decisions import (
    AutoscaleDecision,
    Decision,
    PolicyStamp,
    RetryBudgetDecision,
    RoutingDecision,
)
from fleetloop.sim.fleet import FleetSim
from fleetloop.sim.runner import EPOCH_MS, run
from fleetloop.sim.scenario import Scenario, parse_scenario
from tests.sim.conftest import small_scenario_dict


def _policies() -> list[str]:
    names = ["none", "default"]
    try:
        builtin_policy("classic")
        names.insert(1, "classic")
    except PolicyError:
        pass
    return names


def _json(sc: Scenario, policy: str, seed: int | None = None) -> dict[str, Any]:
    data = run(sc, builtin_policy(policy), seed=seed).to_json()
    data["sim"].pop("wall_s")
    data["sim"].pop("speedup")
    return data


def test_same_seed_same_json(tiny: Scenario) -> None:
    a = orjson.dumps(_json(tiny, "default"))
    b = orjson.dumps(_json(tiny, "default"))
    assert a == b
    c = orjson.dumps(_json(tiny, "default", seed=12345))
    assert a != c  # the seed matters


@pytest.mark.parametrize("policy", _policies())
def test_every_task_accounted_and_cost_identities(tiny: Scenario, policy: str) -> None:
    d = _json(tiny, policy)
    tasks, cost = d["tasks"], d["cost"]
    assert tasks["started"] > 0
    assert tasks["started"] == tasks["succeeded"] + tasks["failed"]
    if tasks["succeeded"]:
        assert cost["per_successful_task_usd"] == pytest.approx(
            cost["total_usd"] / tasks["succeeded"], rel=1e-5
        )
    assert 0 <= cost["wasted_usd"] <= cost["attributed_usd"] + 1e-6
    assert cost["attributed_usd"] <= cost["total_usd"] + 1e-6
    bp = d["by_priority"]
    assert sum(v["tasks_started"] for v in bp.values()) == tasks["started"]
    assert sum(v["tasks_succeeded"] for v in bp.values()) == tasks["succeeded"]
    req = d["requests"]
    assert req["sent"] == req["ok"] + req["shed"] + req["errors"] + req["timeouts"]
    # The faults fired, on the named targets.
    kinds = [f["kind"] for f in d["faults"]]
    assert kinds == ["degrade", "crash", "preempt", "load_spike"]
    assert d["faults"][0]["nodes"] == ["small/1"]


def test_total_cost_is_node_seconds_times_price(tiny: Scenario) -> None:
    sim = FleetSim(tiny, 1, start_ms=EPOCH_MS)
    sim.advance_to(EPOCH_MS + 10_000)
    # No faults yet, no scaling: 3 H200 x2 nodes + 3 L40S x1 nodes for 10 s.
    expected = 10.0 * (3 * 2 * 3.59 + 3 * 1 * 0.79) / 3600.0
    assert sim.total_cost_usd() == pytest.approx(expected, rel=1e-9)


def test_emitted_records_are_in_window_and_ordered(tiny: Scenario) -> None:
    sim = FleetSim(tiny, 3, start_ms=EPOCH_MS)
    prev = EPOCH_MS
    seen_tel = 0
    for k in range(1, 31):
        t = EPOCH_MS + k * 700
        out = sim.advance_to(t)
        for recs in (out.telemetry, out.outcomes):
            ts = [r.ts_ms for r in recs]
            assert ts == sorted(ts)
            assert all(prev < x <= t for x in ts)
        seen_tel += len(out.telemetry)
        prev = t
    # one record per node per second: 6 nodes x 21 whole seconds in 21 s
    assert seen_tel == 6 * 21
    with pytest.raises(ValueError, match="back in time"):
        sim.advance_to(EPOCH_MS)


def _stamp(mode: str = "enforce") -> PolicyStamp:
    return PolicyStamp(name="t", version=1, hash="0" * 16, mode=mode)  # type: ignore[arg-type]


def test_autoscale_provisions_cold_and_respects_bounds_and_tick_order(tiny: Scenario) -> None:
    sim = FleetSim(tiny, 1, start_ms=EPOCH_MS)
    sim.advance_to(EPOCH_MS + 1000)

    def scale(n: int, tick: int, mode: str = "enforce") -> Decision:
        body = AutoscaleDecision(
            entity="pool/small", reason="t", pool_id="small", current_nodes=3, desired_nodes=n
        )
        return Decision(ts_ms=EPOCH_MS + 1000, tick_id=tick, policy=_stamp(mode), body=body)

    sim.apply([scale(40, 5)])  # clamped to max_nodes 6
    assert len(sim.pool_nodes("small")) == 6
    assert [n.weights_state for n in sim.pool_nodes("small")][3:] == ["cold", "cold", "cold"]
    sim.apply([scale(2, 4)])  # older tick: ignored
    assert len(sim.pool_nodes("small")) == 6
    sim.apply([scale(2, 6, mode="shadow")])  # shadow: ignored
    assert len(sim.pool_nodes("small")) == 6
    out = sim.advance_to(EPOCH_MS + 2000)
    assert {t.weights_state for t in out.telemetry if t.pool_id == "small"} >= {"cold", "warm"}
    sim.advance_to(EPOCH_MS + 40_000)
    assert all(n.warm for n in sim.pool_nodes("small"))
    sim.apply([scale(1, 7)])  # clamped to min_nodes 2; the rest drain then leave
    sim.advance_to(EPOCH_MS + 120_000)
    assert len([n for n in sim.pool_nodes("small") if not n.draining]) == 2


def _warm_times(seed: int) -> list[float]:
    d = small_scenario_dict()
    for p in d["pools"]:
        p.pop("cold_start_s")  # the published distribution
    sc = parse_scenario(d, "tiny")
    sim = FleetSim(sc, seed, start_ms=EPOCH_MS)
    sim.advance_to(EPOCH_MS + 1000)
    body = AutoscaleDecision(
        entity="pool/small", reason="t", pool_id="small", current_nodes=3, desired_nodes=6
    )
    sim.apply([Decision(ts_ms=EPOCH_MS + 1000, tick_id=1, policy=_stamp("enforce"), body=body)])
    warm_at: dict[str, float] = {}
    for t in range(2, 400):
        sim.advance_to(EPOCH_MS + t * 1000)
        for n in sim.pool_nodes("small"):
            if n.warm and n.node_id not in warm_at:
                warm_at[n.node_id] = float(t)
    return [warm_at[f"small/{i}"] for i in (3, 4, 5)]


def test_cold_starts_are_drawn_per_boot_and_deterministic_per_seed() -> None:
    a = _warm_times(5)
    assert a == _warm_times(5)  # same seed, same cold starts
    assert len(set(a)) > 1  # each boot draws its own
    assert all(50 <= x <= 150 for x in a)  # cached 8B: ~82 s median (published), from t=1 s
    assert a != _warm_times(6)


def test_crash_loses_in_flight_work_and_clients_retry() -> None:
    d = small_scenario_dict()
    d["faults"] = [{"at_s": 30, "kind": "crash", "pool": "small", "count": 3}]
    d["workload"] = [d["workload"][1]]
    d["tenants"] = [{"id": "free", "priority": 2}]
    d["workload"][0]["output_tokens"] = {"median": 2000, "max": 4000}
    sc = parse_scenario(d, "crash")
    sim = FleetSim(sc, 1, start_ms=EPOCH_MS)
    sim.advance_to(EPOCH_MS + 29_999)
    in_flight = sum(n.running + n.queue_depth for n in sim.pool_nodes("small"))
    assert in_flight > 0
    out = sim.advance_to(EPOCH_MS + 31_000)
    lost = [o for o in out.outcomes if o.outcome in ("retry", "error") and o.ts_ms == EPOCH_MS + 30_000]
    assert len(lost) == in_flight
    assert not sim.pool_nodes("small")
    assert all(o.cost_usd > 0 for o in lost if o.attempt == 0)


def _long_calls(stream: bool) -> Scenario:
    """One L40S serving 8B calls of ~1,500 output tokens (~20 s each) to a client that waits 5 s."""
    d = small_scenario_dict()
    d["pools"] = [{**d["pools"][1], "nodes": 1, "min_nodes": 1, "max_nodes": 1}]
    d["tenants"] = [{"id": "free", "priority": 2}]
    chat = d["workload"][1]
    chat.update(rate_per_s=0.5, output_tokens={"median": 1500, "max": 1600}, deadline_s=80)
    chat["client"] = {"timeout_s": 5, "max_retries": 2, "stream": stream}
    d["workload"] = [chat]
    d["faults"] = []
    d["duration_s"] = 60
    return parse_scenario(d, "long-calls")


def _drain(sc: Scenario) -> FleetSim:
    sim = FleetSim(sc, 3, start_ms=EPOCH_MS)
    t = EPOCH_MS
    while not sim.done and t < EPOCH_MS + 600_000:
        t += 1000
        sim.advance_to(t)
    return sim


def test_a_streaming_client_that_gives_up_aborts_its_request() -> None:
    sim = _drain(_long_calls(stream=True))
    req = sim.report().summary["requests"]
    assert req["orphaned"] == 0
    # Calls that got their first token within 5 s stream on to the end: some succeed.
    assert req["ok"] > 0


def test_a_non_streaming_client_leaves_an_orphan_that_runs_on_as_waste() -> None:
    sc = _long_calls(stream=False)
    sim = FleetSim(sc, 3, start_ms=EPOCH_MS)
    # The first call arrives, starts decoding, and its client gives up 5 s later (a 20 s call):
    # the request keeps the node busy after the timeout, next to the client's retry.
    t = EPOCH_MS
    while sim.orphans == 0 and t < EPOCH_MS + 60_000:
        t += 500
        sim.advance_to(t)
    assert sim.orphans >= 1
    node = sim.pool_nodes("small")[0]
    assert node.running + node.queue_depth >= 2  # the orphan and the retry
    while not sim.done and t < EPOCH_MS + 600_000:
        t += 1000
        sim.advance_to(t)
    s = sim.report().summary
    # Every call outlasts its 5 s timeout: every attempt times out and runs on as an orphan.
    assert s["requests"]["ok"] == 0
    assert s["requests"]["orphaned"] == s["requests"]["timeouts"] > 0
    assert s["tasks"]["succeeded"] == 0
    assert s["tasks"]["failed_by"] == {"retries_exhausted:timeout": s["tasks"]["failed"]}
    # The orphans' GPU time is waste, and more of it than the streaming client's.
    streaming = _drain(_long_calls(stream=True)).report().summary
    assert s["cost"]["wasted_usd"] > streaming["cost"]["wasted_usd"]


def _caller_view(
    sc: Scenario, seed: int
) -> tuple[dict[str, Any], dict[int, tuple[int, int, int]], dict[int, int]]:
    """The run's summary; per priority (calls, calls within the TTFT SLO, calls within 5 ms of
    it) recounted from the outcome records a router would publish: a call is a request id, timed
    from its first attempt's send (``ts_ms - e2e_ms``) to the first token of its ``ok`` attempt;
    and per priority the ``ok`` attempts whose own TTFT is within the SLO."""
    sim = FleetSim(sc, seed, start_ms=EPOCH_MS)
    t = EPOCH_MS
    records = []
    while not sim.done and t < EPOCH_MS + 900_000:
        t += 1000
        records.extend(o for o in sim.advance_to(t).outcomes if o.diverted_to is None)
    start: dict[str, float] = {}
    first: dict[str, float] = {}
    prio: dict[str, int] = {}
    for o in records:
        sent = o.ts_ms - o.e2e_ms
        start[o.request_id] = min(start.get(o.request_id, sent), sent)
        prio[o.request_id] = o.priority
        if o.outcome == "ok":
            assert o.ttft_ms is not None
            first[o.request_id] = sent + o.ttft_ms
    slo = sc.slo.ttft_ms
    attempts_within: dict[int, int] = {}
    for o in records:
        if o.outcome == "ok" and o.ttft_ms is not None and o.ttft_ms <= slo:
            attempts_within[o.priority] = attempts_within.get(o.priority, 0) + 1
    out: dict[int, tuple[int, int, int]] = {}
    for rid, p in prio.items():
        calls, within, edge = out.get(p, (0, 0, 0))
        ft = first.get(rid)
        waited = None if ft is None else ft - start[rid]
        out[p] = (
            calls + 1,
            within + (waited is not None and waited <= slo),
            edge + (waited is not None and abs(waited - slo) <= 5.0),
        )
    return sim.report().summary, out, attempts_within


def test_first_tokens_as_callers_see_them_count_each_call_once_from_its_first_attempt() -> None:
    """The caller-view SLI (``calls``, ``calls_ttft_within_slo`` per class) agrees with a recount
    from the wire records, and a call retried after a crash is timed from its first attempt: fewer
    calls are within the SLO than successful attempts are."""
    d = small_scenario_dict()
    d["faults"] = [{"at_s": 30, "kind": "crash", "pool": "small", "count": 2}]
    d["workload"][1]["output_tokens"] = {"median": 300, "max": 3000}
    sc = parse_scenario(d, "crash-retries")
    summary, recount, attempts_within = _caller_view(sc, 1)
    bp = summary["by_priority"]
    for p, (calls, within, edge) in recount.items():
        got = bp[str(p)]
        assert got["calls"] == calls
        assert abs(got["calls_ttft_within_slo"] - within) <= edge  # ms rounding on the wire
    # The calls the crash cut short mid-decode were retried and completed, each counted once from
    # its first attempt: their retries' own first tokens came fast, the callers' did not.
    free = bp["2"]
    ok_fast = attempts_within[2]
    assert summary["requests"]["retries"] > 0
    assert free["calls_ttft_within_slo"] < ok_fast


def test_a_call_that_never_completes_is_a_miss_for_the_caller_view() -> None:
    """Every attempt outlasts its 5 s non-streaming timeout: no call completes, each counts once
    as a miss, and no attempt-level TTFT exists to flatter the run."""
    sim = _drain(_long_calls(stream=False))
    s = sim.report().summary
    free = s["by_priority"]["2"]
    assert s["tasks"]["succeeded"] == 0
    assert free["calls"] == s["tasks"]["started"] > 0  # one call per task, whatever its retries
    assert free["calls_ttft_within_slo"] == 0
    assert s["requests"]["retries"] > 0


def _budget_gone_at(crash_s: int) -> dict[str, int]:
    """A control plane publishes a spent retry budget for ``small`` once, at 1 s, then goes away;
    three of its nodes crash at ``crash_s`` and the clients retry the calls they lost. What the
    tasks that failed failed of."""
    d = small_scenario_dict()
    d["faults"] = [{"at_s": crash_s, "kind": "crash", "pool": "small", "count": 2}]
    d["workload"] = [d["workload"][1]]
    d["tenants"] = [{"id": "free", "priority": 2}]
    d["workload"][0]["output_tokens"] = {"median": 2000, "max": 4000}
    sim = FleetSim(parse_scenario(d, "budget-gone"), 1, start_ms=EPOCH_MS)
    sim.advance_to(EPOCH_MS + 1_000)
    weights = {n.node_id: 1.0 for n in sim.pool_nodes("small")}
    routing = RoutingDecision(entity="pool/small", reason="t", pool_id="small", weights=weights)
    spent = RetryBudgetDecision(
        entity="pool/small", reason="t", pool_id="small", retry_ratio=0.0, min_retries_per_s=0.0,
        retries_allowed_now=0, exempt_retries_of=(),
    )  # fmt: skip
    sim.apply(
        [
            Decision(ts_ms=EPOCH_MS + 1_000, tick_id=1, policy=_stamp("enforce"), body=b)
            for b in (routing, spent)
        ]
    )
    sim.advance_to(EPOCH_MS + (crash_s + 20) * 1_000)
    return sim.failed_by


def test_a_budget_whose_control_plane_went_away_refuses_no_retry() -> None:
    """The simulator's clients spend the retry budget at event time: once the routing is older than
    the router's fail-static TTL (30 s), the held budget is as old and refuses nothing (a budget
    nobody refills would refuse every retry for good)."""
    fresh = _budget_gone_at(10)
    assert any(k.startswith("retry_budget:") for k in fresh), fresh  # the budget binds while fresh
    stale = _budget_gone_at(45)
    assert not any(k.startswith("retry_budget:") for k in stale), stale
