"""The derivation: known records in, expected scenario fields out (fleetloop.whatif.derive)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.telemetry import NodeTelemetry
from fleetloop.sim.builder import pool, two_tenant_scenario
from fleetloop.sim.scenario import load_scenario, parse_scenario
from fleetloop.whatif.derive import DeriveError, catalog_gpu, catalog_model, derive
from tests.whatif.recorded import Recording, record

T0 = 1_800_000_000_000

INCIDENT: dict[str, Any] = two_tenant_scenario(
    "incident",
    seed=3,
    duration_s=150,
    slo={"ttft_ms": 2000, "tbt_ms": 100},
    pools=[
        pool("chat", "llama-8b", "L40S", 4, cold_start_s=30),
        pool("big", "llama-70b", "H100", 3, cold_start_s=60),
    ],
    copilot={
        "rate_per_s": 0.5,
        "models": ["llama-70b"],
        "deadline_s": 60,
        "client": {"timeout_s": 10, "max_retries": 2, "stream": False},
    },
    faults=[
        {"at_s": 40, "kind": "degrade", "node": "chat/2", "factor": 20.0, "duration_s": 40},
        {"at_s": 70, "kind": "crash", "node": "big/1"},
        {"at_s": 100, "kind": "preempt", "node": "chat/0"},
    ],
)


@pytest.fixture(scope="module")
def incident() -> Recording:
    return record(parse_scenario(INCIDENT), builtin_policy("default"), seed=7)


def _by(items: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    return {x[key]: x for x in items}


def test_a_simulated_incident_derives_back_to_its_scenario(incident: Recording, tmp_path: Path) -> None:
    d = derive(incident.outcomes, incident.telemetry, from_ms=incident.from_ms, to_ms=incident.to_ms)
    doc = d.document
    assert doc["duration_s"] == 150
    pools = _by(doc["pools"], "id")
    assert {k: (p["model"], p["gpu"], p["nodes"]) for k, p in pools.items()} == {
        "chat": ("llama-8b", "L40S", 4),
        "big": ("llama-70b", "H100", 3),
    }
    # Boots were seen (the preempted node's reload, the crashed node's replacement): their length.
    assert pools["chat"]["cold_start_s"] == pytest.approx(30, rel=0.1)
    assert pools["big"]["cold_start_s"] == pytest.approx(60, rel=0.1)
    assert {t["id"]: t["priority"] for t in doc["tenants"]} == {"gold": 0, "free": 2}
    wl = _by(doc["workload"], "tenant")
    gold, free = wl["gold"], wl["free"]
    assert (gold["kind"], gold["calls"], free["kind"], free["calls"]) == (
        "copilot",
        [3, 6],
        "chatbot",
        [1, 1],
    )
    assert gold["rate_per_s"] == pytest.approx(0.5, rel=0.15)
    assert free["rate_per_s"] == pytest.approx(2.0, rel=0.15)
    assert gold["prompt_tokens"]["median"] == pytest.approx(1500, rel=0.25)
    assert free["prompt_tokens"]["median"] == pytest.approx(600, rel=0.25)
    assert gold["output_tokens"]["median"] == pytest.approx(200, rel=0.25)
    assert gold["prompt_tokens"]["max"] <= 12000
    assert gold["shared_prefix_tokens"] == 1000
    assert free["shared_prefix_tokens"] == 0
    assert (gold["models"], free["models"]) == (["llama-70b"], ["llama-8b"])
    assert gold["client"] == {"timeout_s": 10.0, "max_retries": 2, "stream": False}
    assert free["client"]["timeout_s"] == 8.0
    assert "stream" not in free["client"]  # streaming clients never time out once tokens flow
    # No free call was cut by its deadline here: its longest task is a lower bound, and says so.
    assert 30 <= free["deadline_s"] <= 31
    assert any("tenant free: no call was cut by its deadline" in n for n in d.notes)
    # Gold's deadline is read from the calls it cut, which gives the scenario's own; in a recording
    # where none was cut (whether one is depends on the node physics), the longest task, a lower bound.
    if any("tenant gold: no call was cut by its deadline" in n for n in d.notes):
        assert gold["deadline_s"] <= 60
    else:
        assert gold["deadline_s"] == 60
    faults = {(f["kind"], f.get("node")): f for f in doc["faults"]}
    assert set(faults) == {("degrade", "chat/2"), ("crash", "big/1"), ("preempt", "chat/0")}
    degrade = faults[("degrade", "chat/2")]
    assert 40 <= degrade["at_s"] <= 45
    assert degrade["factor"] == pytest.approx(20, rel=0.25)
    assert 68 <= faults[("crash", "big/1")]["at_s"] <= 70
    assert 98 <= faults[("preempt", "chat/0")]["at_s"] <= 101
    # It is a scenario the simulator loads from a file.
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert load_scenario(path) == d.scenario


def test_observed_kpis_are_the_simulators_own(incident: Recording) -> None:
    """Same definitions as ``fleetloop sim``: on the simulator's own records they agree."""
    o = derive(incident.outcomes, incident.telemetry, from_ms=incident.from_ms, to_ms=incident.to_ms).observed
    s = incident.summary
    assert (o.tasks_started, o.tasks_succeeded, o.tasks_failed, o.tasks_unresolved) == (
        s["tasks"]["started"],
        s["tasks"]["succeeded"],
        s["tasks"]["failed"],
        0,
    )
    assert o.success_rate == pytest.approx(s["tasks"]["success_rate"], abs=1e-9)
    assert o.p0_success_rate == pytest.approx(s["by_priority"]["0"]["success_rate"], abs=1e-9)
    assert o.ttft_p99_ms == pytest.approx(s["latency"]["ttft_p99_ms"], abs=0.01)
    # Fleet spend from telemetry (1 s reports) against the simulator's exact node-seconds.
    assert o.cost_source == "telemetry"
    assert o.cost_per_successful_task_usd == pytest.approx(s["cost"]["per_successful_task_usd"], rel=0.02)


def test_a_window_counts_the_tasks_it_started_only(incident: Recording) -> None:
    mid = incident.from_ms + 60_000
    first = derive(incident.outcomes, incident.telemetry, from_ms=incident.from_ms, to_ms=mid)
    second = derive(incident.outcomes, incident.telemetry, from_ms=mid, to_ms=incident.to_ms)
    assert (
        first.observed.tasks_started + second.observed.tasks_started == incident.summary["tasks"]["started"]
    )
    assert first.document["duration_s"] == 60
    # The faults of the second window are relative to its own start.
    faults = {(f["kind"], f.get("node")): f["at_s"] for f in second.document["faults"]}
    assert 8 <= faults[("crash", "big/1")] <= 10
    # The degrade began before this window: a fault from its first slow reports in it (the node
    # serves little while its breaker is open, so not every second has a report with a TBT).
    assert faults[("degrade", "chat/2")] <= 5


# -- hand-made records -----------------------------------------------------------------------------------


def tel(node: str, t_s: float, **kw: Any) -> NodeTelemetry:
    base: dict[str, Any] = {
        "ts_ms": T0 + int(t_s * 1000),
        "node_id": node,
        "pool_id": kw.pop("pool", "p"),
        "model": kw.pop("model", "llama-8b"),
        "gpu_type": kw.pop("gpu", "L40S"),
        "weights_state": "warm",
        "interval_ms": 1000,
        "queue_depth": 0,
        "running_requests": 0,
        "kv_cache_used_frac": 0.1,
        "hbm_free_gib": 10.0,
        "gpu_util_frac": 0.5,
        "cost_rate_usd_per_h": 3.6,
        "tbt_p50_ms": 20.0,
    }
    base.update(kw)
    return NodeTelemetry.model_validate(base)


def call(wf: str, step: int, sent_s: float, e2e_s: float, **kw: Any) -> RequestOutcome:
    base: dict[str, Any] = {
        "ts_ms": T0 + int((sent_s + e2e_s) * 1000),
        "request_id": f"{wf}.{step}",
        "workflow_id": wf,
        "step_index": step,
        "tenant_id": "t",
        "priority": 1,
        "latency_budget_ms": 5000,
        "pool_id": "p",
        "node_id": "p/0",
        "model": "llama-8b",
        "prompt_tokens": 100,
        "output_tokens": 10,
        "ttft_ms": 50.0,
        "e2e_ms": e2e_s * 1000,
        "outcome": "ok",
    }
    base.update(kw)
    return RequestOutcome.model_validate(base)


def fleet(nodes: list[str], seconds: int, **per_node: dict[str, Any]) -> list[NodeTelemetry]:
    return [tel(n, s, **per_node.get(n.replace("/", "_"), {})) for s in range(1, seconds + 1) for n in nodes]


def one_task(**kw: Any) -> list[RequestOutcome]:
    return [call("w", 0, 0.5, 1.0, task_outcome="succeeded", **kw)]


def test_bad_windows_are_one_line_errors() -> None:
    f = fleet(["p/0", "p/1"], 10)
    with pytest.raises(DeriveError, match="empty or reversed"):
        derive(one_task(), f, from_ms=T0 + 5000, to_ms=T0 + 5000)
    with pytest.raises(DeriveError, match="no task started in the window"):
        derive(one_task(), f, from_ms=T0 + 2000, to_ms=T0 + 9000)
    with pytest.raises(DeriveError, match="no node telemetry in the window"):
        derive(one_task(), [], from_ms=T0, to_ms=T0 + 9000)
    with pytest.raises(DeriveError, match="'TPU-v5e' in telemetry is not in the simulator's catalog"):
        derive(one_task(), [tel("p/0", 1, gpu="TPU-v5e")], from_ms=T0, to_ms=T0 + 9000)
    for err in (DeriveError("x"),):
        assert "\n" not in str(err)


def test_reported_names_map_to_the_catalog() -> None:
    assert catalog_gpu("NVIDIA-H100-80GB-HBM3") == "H100"
    assert catalog_gpu("NVIDIA A100-SXM4-80GB") == "A100"
    assert catalog_gpu("AMD Instinct MI300X") == "MI300X"
    assert catalog_model("meta-llama/Llama-3.1-70B-Instruct") == "llama-70b"
    assert catalog_model("meta-llama/Meta-Llama-3.1-8B-Instruct") == "llama-8b"
    assert catalog_model("Qwen/Qwen2.5-7B-Instruct") == "qwen-7b"
    with pytest.raises(DeriveError, match="mistral-7b"):
        catalog_model("mistral-7b")


def test_node_ids_that_are_not_pool_indices_are_numbered_in_sorted_order() -> None:
    nodes = ["10.0.0.9:8000", "10.0.0.10:8000", "10.0.0.11:8000"]
    slow = {"10.0.0.11:8000".replace("/", "_"): {"tbt_p50_ms": 200.0}}
    d = derive(one_task(node_id="10.0.0.9:8000"), fleet(nodes, 10, **slow), from_ms=T0, to_ms=T0 + 10_000)
    assert d.document["pools"][0]["nodes"] == 3
    # sorted: 10.0.0.10, 10.0.0.11, 10.0.0.9 -> the slow one is index 1
    assert d.document["faults"] == [{"at_s": 0.0, "kind": "degrade", "node": "p/1", "factor": 10.0}]


def test_a_slowdown_needs_three_reports_and_ends_after_three_normal_ones() -> None:
    def tbt(t: int) -> float:
        if t == 3:
            return 100.0  # one slow report alone is noise
        return 100.0 if 10 <= t < 20 else 20.0

    records = [
        tel(n, t, tbt_p50_ms=tbt(t) if n == "p/2" else 20.0)
        for t in range(1, 31)
        for n in ("p/0", "p/1", "p/2")
    ]
    d = derive(one_task(), records, from_ms=T0, to_ms=T0 + 30_000)
    assert d.document["faults"] == [
        {"at_s": 9.0, "kind": "degrade", "node": "p/2", "factor": 5.0, "duration_s": 10.0}
    ]


def test_silence_is_a_crash_only_with_work_in_flight_or_failed_calls() -> None:
    def stops(node: str, last: int, **kw: Any) -> list[NodeTelemetry]:
        others = [tel(n, t) for t in range(1, 21) for n in ("p/0", "p/1") if n != node]
        return others + [tel(node, t, **kw) for t in range(1, last + 1)]

    task = one_task()
    # busy at its last report: a crash at that time
    d = derive(task, stops("p/1", 8, running_requests=3), from_ms=T0, to_ms=T0 + 20_000)
    assert d.document["faults"] == [{"at_s": 8.0, "kind": "crash", "node": "p/1"}]
    # idle at its last report and no failed call: a scale-in, said in a note
    d = derive(task, stops("p/1", 8), from_ms=T0, to_ms=T0 + 20_000)
    assert d.document["faults"] == []
    assert any("p/1 stopped reporting idle" in n for n in d.notes)
    # idle, but a call placed on it failed afterwards (connection refused): a crash
    failed = [*task, call("v", 0, 9.0, 0.01, node_id="p/1", outcome="retry")]
    d = derive(failed, stops("p/1", 8), from_ms=T0, to_ms=T0 + 20_000)
    assert d.document["faults"] == [{"at_s": 8.0, "kind": "crash", "node": "p/1"}]
    # draining: an autoscaler removed it
    d = derive(task, stops("p/1", 8, draining=True, running_requests=2), from_ms=T0, to_ms=T0 + 20_000)
    assert d.document["faults"] == []


def test_a_warm_node_that_reports_cold_was_preempted() -> None:
    states = {t: "warm" if t < 5 else "loading" if t < 9 else "warm" for t in range(1, 16)}
    records = [tel("p/0", t) for t in range(1, 16)] + [
        tel("p/1", t, weights_state=states[t]) for t in range(1, 16)
    ]
    d = derive(one_task(), records, from_ms=T0, to_ms=T0 + 15_000)
    assert d.document["faults"] == [{"at_s": 4.0, "kind": "preempt", "node": "p/1"}]
    assert d.document["pools"][0]["cold_start_s"] == 5.0  # cold from 4 s (interval start) to warm at 9 s


def test_deadline_timeout_retries_and_streaming_from_the_calls() -> None:
    # Task a: budget 5 s (the timeout) for its first call; its third call, sent at 8 s into the task,
    # had 2 s of budget left: deadline 10 s. Task b timed out mid-answer (a first token, e2e at its
    # budget) and was retried twice: a non-streaming client with at least 2 retries.
    calls = [
        call("a", 0, 1.0, 2.0),
        call("a", 1, 3.0, 4.0),
        call("a", 2, 9.0, 1.0, latency_budget_ms=2000, task_outcome="succeeded"),
        call("b", 0, 2.0, 5.0, outcome="retry", ttft_ms=800.0),
        call("b", 0, 7.5, 0.5, attempt=1, outcome="retry", ttft_ms=None),
        call("b", 0, 8.5, 1.0, attempt=2, task_outcome="succeeded"),
    ]
    d = derive(calls, fleet(["p/0", "p/1"], 20), from_ms=T0, to_ms=T0 + 20_000)
    (w,) = d.document["workload"]
    assert w["deadline_s"] == 10.0
    assert w["client"] == {"timeout_s": 5.0, "max_retries": 2, "stream": False}
    assert w["calls"] == [1, 3]
    assert w["rate_per_s"] == 0.1
    assert (d.observed.tasks_started, d.observed.success_rate) == (2, 1.0)


def test_tasks_started_before_the_window_are_not_its_own_but_late_outcomes_of_its_tasks_count() -> None:
    calls = [
        call("early", 0, 1.0, 1.0),  # started before the window
        call("early", 1, 6.0, 1.0, task_outcome="failed", outcome="timeout"),
        call("mine", 0, 6.0, 1.0),
        call("mine", 1, 12.0, 1.0, task_outcome="failed", outcome="timeout"),  # after --to: still counted
        call("open", 0, 8.0, 1.0),  # no task outcome yet when the recording ended
    ]
    d = derive(calls, fleet(["p/0", "p/1"], 20), from_ms=T0 + 5000, to_ms=T0 + 10_000)
    o = d.observed
    assert (o.tasks_started, o.tasks_succeeded, o.tasks_failed, o.tasks_unresolved) == (2, 0, 1, 1)
    assert o.success_rate == 0.0
    # fleet spend: 2 nodes x 3.6 $/h, from 5 s until the last outcome of its tasks (13 s): 8 reports each
    assert o.fleet_cost_usd == pytest.approx(2 * 8 * 0.001)
    assert o.cost_per_successful_task_usd is None


def test_a_thousand_node_fleet_finds_its_one_slow_node_and_its_crash() -> None:
    """At the scale users run: 1,000 nodes in 4 pools, one slowed 8x from 20 s, one crashed busy
    at 30 s; every other node's TBT varies by +-20% (hostile to a fixed threshold)."""
    pools = {
        "a": ("llama-8b", "L40S"),
        "b": ("llama-8b", "H100"),
        "c": ("llama-70b", "H100"),
        "d": ("qwen-7b", "A100"),
    }
    records = []
    for i in range(1000):
        pool = "abcd"[i % 4]
        node = f"{pool}/{i // 4}"
        model, gpu = pools[pool]
        for t in range(1, 61):
            if node == "c/7" and t > 30:
                break
            tbt = 20.0 * (0.8 + 0.4 * ((i * 7919 + t * 104729) % 1000) / 1000)
            if node == "b/123" and t > 20:
                tbt = 160.0
            records.append(
                NodeTelemetry.model_construct(
                    **tel(node, t, pool=pool, model=model, gpu=gpu).model_dump()
                    | {"tbt_p50_ms": tbt, "running_requests": 2}
                )
            )
    tasks = [call("w", 0, 0.5, 1.0, task_outcome="succeeded", pool_id="a", node_id="a/0")]
    d = derive(tasks, records, from_ms=T0, to_ms=T0 + 60_000)
    assert sorted((p["id"], p["nodes"]) for p in d.document["pools"]) == [
        ("a", 250),
        ("b", 250),
        ("c", 250),
        ("d", 250),
    ]
    assert [(f["kind"], f["node"]) for f in d.document["faults"]] == [("degrade", "b/123"), ("crash", "c/7")]
    slow = d.document["faults"][0]
    assert slow["at_s"] == 20.0
    assert slow["factor"] == pytest.approx(8.0, rel=0.25)


def test_a_model_that_fits_its_reported_gpus_in_fp8_only_runs_in_fp8() -> None:
    records = [
        tel(n, t, model="llama-70b", gpu="H100", gpu_count=1) for t in range(1, 11) for n in ("p/0", "p/1")
    ]
    d = derive(one_task(model="llama-70b"), records, from_ms=T0, to_ms=T0 + 10_000)
    (pool,) = d.document["pools"]
    assert (pool["gpus_per_node"], pool.get("precision")) == (1, "fp8")


def test_a_gpu_count_tensor_parallelism_cannot_split_keeps_the_catalog_s_choice() -> None:
    records = [
        tel(n, t, model="llama-70b", gpu="H100", gpu_count=6) for t in range(1, 11) for n in ("p/0", "p/1")
    ]
    d = derive(one_task(model="llama-70b"), records, from_ms=T0, to_ms=T0 + 10_000)
    (pool,) = d.document["pools"]
    assert "gpus_per_node" not in pool
    parse_scenario(d.document)  # the derived scenario loads (a scenario refuses 6-way tensor parallelism)


def test_a_slowdown_starts_at_the_busy_reports_without_a_token_right_before_it() -> None:
    def report(n: str, t: int) -> NodeTelemetry:
        if n != "p/2" or t < 6:
            return tel(n, t, running_requests=2)
        if t < 8:  # busy at 6 and 7, no token finished to time: already slow
            return tel(n, t, running_requests=3, tbt_p50_ms=None)
        return tel(n, t, running_requests=3, tbt_p50_ms=300.0)

    records = [report(n, t) for t in range(1, 21) for n in ("p/0", "p/1", "p/2")]
    d = derive(one_task(), records, from_ms=T0, to_ms=T0 + 20_000)
    assert d.document["faults"] == [{"at_s": 5.0, "kind": "degrade", "node": "p/2", "factor": 15.0}]
    # Idle reports without a figure say nothing: the start stays at the first slow report.
    idle = [
        r
        if not (r.node_id == "p/2" and r.tbt_p50_ms is None)
        else tel("p/2", (r.ts_ms - T0) // 1000, tbt_p50_ms=None)
        for r in records
    ]
    d = derive(one_task(), idle, from_ms=T0, to_ms=T0 + 20_000)
    assert d.document["faults"][0]["at_s"] == 7.0


def test_a_burst_of_arrivals_is_a_load_spike_on_top_of_the_base_rate() -> None:
    spiky = {**INCIDENT, "faults": [{"at_s": 60, "kind": "load_spike", "factor": 3.0, "duration_s": 40}]}
    rec = record(parse_scenario(spiky), builtin_policy("default"), seed=7)
    d = derive(rec.outcomes, rec.telemetry, from_ms=rec.from_ms, to_ms=rec.to_ms)
    (spike,) = [f for f in d.document["faults"] if f["kind"] == "load_spike"]
    assert 50 <= spike["at_s"] <= 70
    assert 30 <= spike["duration_s"] <= 50
    assert spike["factor"] == pytest.approx(3.0, rel=0.35)
    rates = {w["tenant"]: w["rate_per_s"] for w in d.document["workload"]}
    assert rates["free"] == pytest.approx(2.0, rel=0.2)  # the base, not the window's average
    assert rates["gold"] == pytest.approx(0.5, rel=0.25)
    assert "tenant" not in spike


def test_the_engine_a_pool_ran_is_carried_into_the_scenario(incident: Recording) -> None:
    """fleetloop scrape --runtime knows the engine; whatif --engine hands it to the derivation per
    pool (or for every pool), and the derived scenario simulates that engine's profile."""
    window = {"from_ms": incident.from_ms, "to_ms": incident.to_ms}
    d = derive(
        incident.outcomes,
        incident.telemetry,
        **window,
        engines={"big": ("trtllm", None), "*": ("sglang", "0.3")},
    )
    pools = {p.id: p for p in d.scenario.pools}
    assert (pools["big"].engine, pools["big"].runtime.name) == ("trtllm", "trtllm 1.0")
    assert (pools["chat"].engine, pools["chat"].engine_version) == ("sglang", "0.3")
    assert not any("does not name the serving engine" in n for n in d.notes)
    # Records from before NodeTelemetry.engine (or naming an engine without a profile): vLLM, noted.
    unnamed = [t.model_copy(update={"engine": None}) for t in incident.telemetry]
    plain = derive(incident.outcomes, unnamed, **window)
    assert all(p.engine == "vllm" for p in plain.scenario.pools)
    assert sum("does not name the serving engine" in n for n in plain.notes) == 2
    odd = [t.model_copy(update={"engine": "lmdeploy"}) for t in incident.telemetry]
    assert sum("does not name" in n for n in derive(incident.outcomes, odd, **window).notes) == 2
    other = derive(incident.outcomes, incident.telemetry, **window, engines={"gone": ("vllm", None)})
    assert any("--engine names pool(s) not in the window: gone" in n for n in other.notes)


def test_the_engine_the_telemetry_names_is_the_pools_unless_whatif_engine_names_another(
    incident: Recording,
) -> None:
    window = {"from_ms": incident.from_ms, "to_ms": incident.to_ms}
    assert {t.engine for t in incident.telemetry} == {"vllm"}  # the simulator names its pools' engine
    named = [
        t.model_copy(update={"engine": "sglang"}) if t.pool_id == "chat" else t for t in incident.telemetry
    ]
    d = derive(incident.outcomes, named, **window)
    pools = {p.id: p for p in d.scenario.pools}
    assert (pools["chat"].engine, pools["chat"].engine_version) == ("sglang", None)
    assert pools["big"].engine == "vllm"
    assert not any("does not name the serving engine" in n for n in d.notes)
    given = derive(incident.outcomes, named, **window, engines={"chat": ("trtllm", None)})
    assert {p.id: p.engine for p in given.scenario.pools}["chat"] == "trtllm"
