"""bench stack's parts without a broker or a router: the arm table, the interleaved schedule and void
repeats, the medians and the targets, the endpoint list a peer router is kept at, the fleet's
billing over a window, and agents' counts added over processes."""

from __future__ import annotations

import argparse
import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from fleetloop.bench.stack import command, report
from fleetloop.bench.stack.arms import ARMS, BY_NAME, Haproxy, Launch, Slots
from fleetloop.bench.stack.run import endpoints
from fleetloop.edges.fleet.agents import AgentStats
from fleetloop.edges.fleet.live import LiveFleet
from fleetloop.schemas.decisions import AutoscaleDecision
from tests.edges.test_fleet_http import one_node
from tests.edges.test_fleet_manager import _d


def test_every_fleetloop_arm_has_its_router_alone_and_names_are_unique() -> None:
    assert len(BY_NAME) == len(ARMS)
    for arm in ARMS:
        if arm.fleetloop:
            peer = next((a for a in ARMS if not a.fleetloop and a.router == arm.router), None)
            assert peer is not None, arm.name
            assert not peer.fleetloop
            assert peer.router == arm.router
    assert {a.policy for a in ARMS} == {"default", "modern"}


def test_runs_are_interleaved() -> None:
    assert command.schedule(["a", "b", "c"], 2) == [
        (1, "a"),
        (1, "b"),
        (1, "c"),
        (2, "a"),
        (2, "b"),
        (2, "c"),
    ]


def _run(arm: str, n: int, *, success: float, cost: float, ttft: float, lag: float = 1.0) -> dict[str, Any]:
    return {
        "arm": arm,
        "run": n,
        "tasks": {"success_rate": success, "p0_success_rate": success, "succeeded": 10, "started": 11},
        "cost_per_successful_task_usd": cost,
        "latency": {"ttft_p50_ms": ttft, "ttft_p99_ms": 2 * ttft},
        "nodes": {"node_hours": 1.0, "peak_billed": 24},
        "realtime_lag": {"node_events": {"p99_ms": lag}, "agents_loop_p99_ms": lag / 2},
    }


def test_a_void_run_is_repeated_and_the_last_attempt_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    lags = iter([35.0, 50.0, 5.0])
    calls: list[int] = []

    async def fake(spec: Any, err: Any) -> dict[str, Any]:
        calls.append(spec.run)
        return _run(spec.arm.name, spec.run, success=0.9, cost=1.0, ttft=100.0, lag=next(lags))

    monkeypatch.setattr(command, "run_arm", fake)
    args = argparse.Namespace(
        seconds=10.0, drain_s=5.0, agent_procs=1, void_retries=2, max_lag_ms=20.0, runs=1
    )
    voids: list[dict[str, Any]] = []
    err = command.term.console(stderr=True)
    r = command._one(one_node(), "vllm-p2c", 1, args, bootstrap="x", voids=voids, err=err)
    assert calls == [1, 1, 1]
    assert not r.get("void")
    assert [v["lag_p99_ms"] for v in voids] == [35.0, 50.0]
    lags = iter([30.0, 40.0, 50.0])
    r = command._one(one_node(), "vllm-p2c", 1, args, bootstrap="x", voids=voids, err=err)
    assert r["void"] is True  # every attempt lagged: kept, marked, left out of the medians

    async def broken(spec: Any, err: Any) -> dict[str, Any]:
        raise command.UsageError("fleetloop bench stack: router exited (1): 'boom'")

    monkeypatch.setattr(command, "run_arm", broken)
    r = command._one(one_node(), "vllm-p2c", 2, args, bootstrap="x", voids=voids, err=err)
    assert r == {"arm": "vllm-p2c", "run": 2, "error": "fleetloop bench stack: router exited (1): 'boom'"}


def test_medians_leave_void_runs_out_and_the_best_is_by_success_then_cost() -> None:
    runs = [
        _run("vllm-p2c", 1, success=0.90, cost=1.0, ttft=100.0),
        _run("vllm-p2c", 2, success=0.80, cost=1.2, ttft=120.0),
        _run("vllm-p2c", 3, success=0.95, cost=0.9, ttft=90.0),
        {**_run("vllm-p2c", 3, success=0.1, cost=9.0, ttft=900.0), "void": True},
        _run("haproxy-leastconn", 1, success=0.90, cost=0.8, ttft=100.0),
    ]
    s = report.summarize(runs, ["vllm-p2c", "haproxy-leastconn"])
    assert s["vllm-p2c"]["runs"] == 3
    assert s["vllm-p2c"]["success"] == {"median": 0.90, "min": 0.80, "max": 0.95}
    assert s["vllm-p2c"]["cost_per_task"] == {"median": 1.0, "min": 0.9, "max": 1.2}
    assert report.best(s, ["vllm-p2c", "haproxy-leastconn"]) == "haproxy-leastconn"  # same success, cheaper


def test_a_target_is_met_only_when_the_median_and_every_run_hold() -> None:
    peer = [_run("vllm-cache-aware", n, success=0.90, cost=1.0, ttft=100.0) for n in (1, 2, 3)]
    ours = [
        _run("fleetloop-vllm", 1, success=0.95, cost=0.80, ttft=105.0),
        _run("fleetloop-vllm", 2, success=0.95, cost=0.85, ttft=108.0),
        _run("fleetloop-vllm", 3, success=0.89, cost=0.95, ttft=130.0),  # loses this run on all three
    ]
    runs = peer + ours
    arms = ["vllm-cache-aware", "fleetloop-vllm"]
    s = report.summarize(runs, arms)
    t = report.targets(runs, s, arms)
    head = t["headline"]
    assert (head["ours"], head["peer"]) == ("fleetloop-vllm", "vllm-cache-aware")
    for key in ("success", "cost_per_task", "ttft_p50"):
        assert head["targets"][key]["median_ok"], key
        assert head["targets"][key]["per_run_ok"] == [True, True, False], key
        assert not head["targets"][key]["met"]
    assert head["targets"]["cost_per_task"]["ratio"] == 0.85
    assert not head["met"]
    assert [c["peer"] for c in t["same_router"]] == ["vllm-cache-aware"]


def test_a_fleetloop_arm_is_held_to_its_router_at_its_best_strategy() -> None:
    """LiteLLM alone runs three strategies: the fleetloop arm inside LiteLLM answers to the best of
    them in the run (least-busy here), not to the first listed (simple-shuffle)."""
    runs = [
        *(_run("litellm-simple-shuffle", n, success=0.90, cost=1.0, ttft=100.0) for n in (1, 2, 3)),
        *(_run("litellm-least-busy", n, success=0.97, cost=1.0, ttft=100.0) for n in (1, 2, 3)),
        *(_run("litellm-latency", n, success=0.30, cost=5.0, ttft=300.0) for n in (1, 2, 3)),
        *(_run("fleetloop-litellm", n, success=0.95, cost=0.8, ttft=100.0) for n in (1, 2, 3)),
    ]
    arms = ["litellm-simple-shuffle", "litellm-least-busy", "litellm-latency", "fleetloop-litellm"]
    t = report.targets(runs, report.summarize(runs, arms), arms)
    (pair,) = t["same_router"]
    assert (pair["ours"], pair["peer"]) == ("fleetloop-litellm", "litellm-least-busy")
    assert not pair["targets"]["success"]["met"]  # 0.95 against 0.97: simple-shuffle's 0.90 would pass
    only_shuffle = ["litellm-simple-shuffle", "fleetloop-litellm"]
    kept = [r for r in runs if r["arm"] in only_shuffle]
    (pair,) = report.targets(kept, report.summarize(kept, only_shuffle), only_shuffle)["same_router"]
    assert pair["peer"] == "litellm-simple-shuffle"


def test_haproxy_arms_declare_every_slot_and_only_fleetloop_logs(tmp_path: Any) -> None:
    slots = Slots("p", "m", {f"p/{i}": f"http://127.0.0.1:{9000 + i}" for i in range(5)})
    launch = Launch(8000, {"p/0": "http://127.0.0.1:9000"}, slots, tmp_path, None)
    Haproxy().argv(launch)
    cfg = (tmp_path / "haproxy.cfg").read_text()
    assert cfg.count(" check inter 1s fall 2 rise 2") == 5  # nodes not yet booted have slots too
    assert "option http-no-delay" in cfg
    assert "log 127.0.0.1" not in cfg
    assert not BY_NAME["haproxy-leastconn"].router.wants_log_port(False)
    assert BY_NAME["fleetloop-haproxy"].router.wants_log_port(True)
    Haproxy(no_delay=False).argv(launch)
    assert "http-no-delay" not in (tmp_path / "haproxy.cfg").read_text()


@pytest.mark.parametrize("arm", ["fleetloop-vllm", "fleetloop-sglang"])
def test_the_worker_list_arms_actuator_reads_the_metrics_page_its_router_was_started_with(
    arm: str, tmp_path: Any
) -> None:
    """Neither router reports a call to fleetloop: the fleetloop arm's actuator publishes the
    router's per-worker outcome counts, from the Prometheus port the router's command line took."""
    slots = Slots("p", "m", {f"p/{i}": f"http://127.0.0.1:{9000 + i}" for i in range(2)})
    launch = Launch(8000, {"p/0": "http://127.0.0.1:9000"}, slots, tmp_path, None)
    router = BY_NAME[arm].router
    argv = router.argv(launch)
    prom = argv[argv.index("--prometheus-port") + 1]
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    act = router.actuator(launch, "http://127.0.0.1:8000")
    assert act is not None
    assert act[act.index("--metrics-url") + 1] == f"http://127.0.0.1:{prom}/metrics"
    assert act[act.index("--model") + 1] == "m"


class _Workers:
    """A router's worker list in memory (the endpoint list's only lever)."""

    def __init__(self, present: set[str]) -> None:
        self.present = set(present)
        self.log: list[tuple[str, str]] = []

    async def list_workers(self) -> set[str]:
        return set(self.present)

    async def add_worker(self, url: str) -> None:
        self.log.append(("add", url))
        self.present.add(url)

    async def remove_worker(self, url: str) -> None:
        self.log.append(("remove", url))
        self.present.discard(url)

    async def close(self) -> None:
        return None


async def _until(cond: Any, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.05)


async def test_a_peer_routers_workers_follow_the_serving_nodes() -> None:
    """Adds before removals; a node the worker manager drains leaves the list (as a pod that is no
    longer ready leaves its Service's endpoints)."""
    s = one_node()
    s = s.model_copy(
        update={"pools": [s.pools[0].model_copy(update={"nodes": 2, "min_nodes": 1, "max_nodes": 2})]}
    )
    fleet = LiveFleet(s, seed=1)
    await fleet.start()
    stop = asyncio.Event()
    api = _Workers({"http://127.0.0.1:1"})
    errors: list[str] = []
    task = asyncio.create_task(endpoints(fleet, api, stop, errors))
    try:
        urls = fleet.urls()
        await _until(lambda: api.present == set(urls.values()))
        assert [a for a, _ in api.log] == ["add", "add", "remove"]
        drain = AutoscaleDecision(
            entity="p", reason="t", pool_id="p", current_nodes=2, desired_nodes=1, drain=("p/1",)
        )
        fleet.apply([_d(drain, 1)])
        await _until(lambda: api.present == {urls["p/0"]})
        assert errors == []
    finally:
        stop.set()
        await task
        await fleet.stop()


async def test_cost_bills_each_node_within_the_window_from_provisioning_to_removal() -> None:
    s = one_node()
    s = s.model_copy(
        update={"pools": [s.pools[0].model_copy(update={"nodes": 2, "min_nodes": 1, "max_nodes": 2})]}
    )
    fleet = LiveFleet(s, seed=1)
    await fleet.start()
    try:
        n0, n1 = fleet.live["p/0"].node, fleet.live["p/1"].node
        n0.provisioned_at, n1.provisioned_at, n1.removed_at = 0.0, 10.0, 50.0
        usd_s = n0.spec.usd_per_s
        assert fleet.cost_usd(20.0, 100.0) == pytest.approx((80.0 + 30.0) * usd_s)
        assert fleet.cost_usd(60.0, 100.0) == pytest.approx(40.0 * usd_s)  # p/1 was gone
        assert fleet.counts() == {"provisioned": 2, "serving": 2}
    finally:
        await fleet.stop()


def test_agents_counts_add_over_processes() -> None:
    a = AgentStats(tasks_started=3, tasks_succeeded=2, sent=5, ok=4, ttft_ms=[1.0, 2.0])
    b = AgentStats(tasks_started=1, tasks_failed=1, sent=2, timeouts=2, ttft_ms=[3.0])
    a.add(b)
    assert (a.tasks_started, a.tasks_succeeded, a.tasks_failed, a.sent, a.ok, a.timeouts) == (
        4,
        2,
        1,
        7,
        4,
        2,
    )
    assert a.ttft_ms == [1.0, 2.0, 3.0]


ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "bench-stack.md"
STACK_SCENARIOS = ("degraded-gpu", "prefix-heavy", "burst-cold")


def test_the_doc_lists_every_arm_and_scenario() -> None:
    """docs/bench-stack.md's arm table names every arm of the table, each once, and the stack
    scenarios it names exist and run through the bench's checks (one pool, one model, at least 24
    nodes)."""
    from fleetloop.sim.scenario import load_scenario

    text = DOC.read_text()
    listed = re.findall(
        r"`([a-z0-9-]+)`", "".join(ln.split("|")[1] for ln in text.splitlines() if ln.startswith("| `"))
    )
    assert sorted(listed) == sorted(BY_NAME), listed
    for name in STACK_SCENARIOS:
        s = load_scenario(ROOT / "scenarios" / "stack" / f"{name}.yaml")
        assert f"`{name}.yaml`" in text
        assert len(s.pools) == 1
        assert s.pools[0].nodes >= 24
        assert len({m for w in s.workload for m in w.models}) == 1
    assert "--max-lag-ms` (20)" in text
    assert f"at most {report.COST_AT_MOST:g}x" in text
    assert f"at most {report.TTFT_AT_MOST:g}x" in text


def test_the_readme_counts_the_arms_and_points_to_the_doc() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    m = re.search(
        r"`fleetloop bench stack` puts one emulated fleet of (\d+) nodes behind the routers people run, "
        r"(\d+) arms: (\w+) routers alone and (\w+) driven by fleetloop, (\w+) interleaved runs each; "
        r"\[docs/bench-stack.md\]\(docs/bench-stack.md\)",
        text,
    )
    assert m, "the README's bench stack line"
    words = {"three": 3, "four": 4, "seven": 7}
    from fleetloop.sim.scenario import load_scenario

    nodes = {
        load_scenario(ROOT / "scenarios" / "stack" / f"{n}.yaml").pools[0].nodes for n in STACK_SCENARIOS
    }
    assert nodes == {int(m.group(1))}
    assert int(m.group(2)) == len(ARMS)
    assert words[m.group(3)] == sum(not a.fleetloop for a in ARMS)
    assert words[m.group(4)] == sum(a.fleetloop for a in ARMS)
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    assert words[m.group(5)] == parser.parse_args(["stack", "--scenario", "x"]).runs
    assert DOC.exists()


def test_the_doc_reads_the_results_the_bench_writes_and_states_its_time() -> None:
    """The doc names the files the command writes under its default --out (one per scenario, by
    the scenario's name): a link where the file is committed, else the name in the sentence that
    says the full run has not been made; and the full run's bound is what the command prints."""
    from fleetloop.sim.scenario import load_scenario

    text = " ".join(DOC.read_text().split())
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    total = 0.0
    for name in STACK_SCENARIOS:
        f = ROOT / "scenarios" / "stack" / f"{name}.yaml"
        s = load_scenario(f)
        args = parser.parse_args(["stack", "--scenario", str(f)])
        if (ROOT / command.DEFAULT_OUT / f"{s.name}.md").exists():
            assert f"](../{command.DEFAULT_OUT}/{s.name}.md)" in text, s.name
        else:
            assert f"](../{command.DEFAULT_OUT}/{s.name}.md)" not in text, s.name
            not_made = re.search(
                r"The full run over the three scenarios has not been made .*?committed\.", text
            )
            assert not_made, "the doc's sentence on the full run not made"
            assert f"`{s.name}.*`" in not_made.group(0), s.name
        drain = max(w.deadline_s for w in s.workload)
        assert f"at most {drain:g} s for `{name}`" in text or f"{drain:g} s for the others" in text
        bound = command.estimate_s(len(ARMS) * args.runs, args.seconds, drain)
        assert (
            f"about {command._hm(bound)} for `{name}`" in text or f"{command._hm(bound)} for each of" in text
        )
        total += bound
    assert f"= {len(ARMS) * 3 * len(STACK_SCENARIOS)} runs" in text
    assert f"{command._hm(total)} together" in text
    assert "](../bench/results/stack/router-overhead.md)" in text
    assert (ROOT / "bench/results/stack/router-overhead.md").exists()


def test_the_doc_quotes_the_haproxy_streaming_figures_of_the_results_file() -> None:
    import json

    rows = {
        r["router"]: r
        for r in json.loads((ROOT / "bench/results/stack/router-overhead.json").read_text())["routers"]
    }
    text = " ".join(DOC.read_text().split())
    m = re.search(
        r"it added \+([\d.]+) ms to the time to first token \(p50\), against \+([\d.]+) ms with the option",
        text,
    )
    assert m, "the doc's HAProxy streaming sentence"
    without, with_ = float(m.group(1)), float(m.group(2))
    assert without == rows["haproxy-leastconn without http-no-delay"]["added_p50_ms"]
    assert with_ == rows["haproxy-leastconn"]["added_p50_ms"]
    assert without > 10 * max(with_, 1.0)  # the option is what removes the hold


def _doc(runs: list[dict[str, Any]], arms: list[str], **more: Any) -> dict[str, Any]:
    measured = [r for r in runs if "error" not in r]
    s = report.summarize(measured, arms)
    return {
        "scenario": "stack-x",
        "arms": arms,
        "summary": s,
        "targets": report.targets(measured, s, arms),
        "runs_raw": measured,
        "failed_runs": [r for r in runs if "error" in r],
        "void": [],
        **more,
    }


def test_every_run_is_listed_in_the_order_it_ran_with_its_lag_and_void_or_failed_marked() -> None:
    arms = ["vllm-cache-aware", "fleetloop-vllm"]
    runs = [
        _run("vllm-cache-aware", 1, success=0.9, cost=1.0, ttft=100.0, lag=3.0),
        _run("fleetloop-vllm", 1, success=0.95, cost=0.8, ttft=90.0, lag=4.0),
        {**_run("vllm-cache-aware", 2, success=0.5, cost=2.0, ttft=300.0, lag=40.0), "void": True},
        {"arm": "fleetloop-vllm", "run": 2, "error": "router exited"},
    ]
    voids = [
        {"arm": "fleetloop-vllm", "run": 1, "attempt": 0, "lag_p99_ms": 33.0},
        {"arm": "vllm-cache-aware", "run": 2, "attempt": 0, "lag_p99_ms": 40.0},
    ]
    rows = [ln for ln in report.runs_markdown(_doc(runs, arms, void=voids)).splitlines() if ln[2:3].isdigit()]
    cells = [[c.strip() for c in ln.split("|")[1:-1]] for ln in rows]
    assert [(c[1], c[2]) for c in cells] == [
        ("vllm-cache-aware", "1"),
        ("fleetloop-vllm", "1"),
        ("vllm-cache-aware", "2"),
        ("fleetloop-vllm", "2"),
    ]
    assert [c[8] for c in cells] == ["3.0", "4.0", "40.0", "-"]  # the emulator's lag p99, per run
    assert [c[-1] for c in cells] == ["", "after 1 void", "void", "failed"]


def test_the_terminal_table_and_the_summary_plot_show_every_arm(tmp_path: Any) -> None:
    from rich.console import Console

    arms = ["vllm-cache-aware", "haproxy-leastconn", "fleetloop-vllm"]
    runs = [
        _run(a, n, success=0.9 + 0.01 * n, cost=c, ttft=t)
        for a, c, t in (
            ("vllm-cache-aware", 1.0, 100.0),
            ("haproxy-leastconn", 1.1, 120.0),
            ("fleetloop-vllm", 0.8, 95.0),
        )
        for n in (1, 2, 3)
    ]
    doc = _doc(runs, [*arms, "vllm-p2c"])  # an arm with no valid run: a row of dashes, no point
    con = Console(record=True, width=250)
    con.print(report.terminal_table(doc))
    text = con.export_text()
    for arm in [*arms, "vllm-p2c"]:
        assert f"│ {arm}" in text, arm
    assert "median [min–max] of each arm's valid runs" in text
    assert "1.00000 [1.00000–1.00000]" in text  # vllm-cache-aware's $ / task, median [min–max]
    assert report.verdicts(doc)[0].startswith("Best fleetloop arm against best peer: `fleetloop-vllm` vs")
    png = tmp_path / "arms.png"
    report.plot_summary(doc, png)
    assert png.stat().st_size > 10_000


def test_the_progress_line_counts_runs_and_estimates_what_is_left() -> None:
    assert command.estimate_s(99, 120.0, 90.0) == 99 * (120 + 90 + command.SETUP_S)
    pace = command.Pace(6)
    assert pace.line(fallback_s=300.0) == "[1/6] about 30 min left"  # before any run: the bound
    pace.walls += [100.0, 200.0]
    assert pace.eta_s(fallback_s=300.0) == 4 * 150.0  # the runs so far
    assert pace.line(fallback_s=300.0) == "[3/6] about 10 min left"
    pace.total += 1  # a void run's repeat
    assert pace.line(fallback_s=300.0) == "[3/7] about 12 min left"


def test_the_doc_quotes_the_degraded_gpu_results_file() -> None:
    """The doc's summary of the committed degraded-GPU run: every success median, ratio and
    verdict it quotes is the results file's."""
    import json

    doc = json.loads((ROOT / "bench/results/stack/stack-degraded-gpu.json").read_text())
    med = doc["summary"]
    text = " ".join(DOC.read_text().split())
    pairs = {t["ours"]: t for t in doc["targets"]["same_router"]}
    for ours, peer, router in (
        ("fleetloop-vllm", "vllm-cache-aware", "vllm-router"),
        ("fleetloop-sglang", "sglang-cache-aware", "SGLang's router"),
        ("fleetloop-haproxy", "haproxy-leastconn", "HAProxy"),
    ):
        quoted = (
            f"{med[ours]['success']['median']:.3f} against {med[peer]['success']['median']:.3f} ({router})"
        )
        assert quoted in text, quoted
        t = pairs[ours]["targets"]
        assert all(t["success"]["per_run_ok"]), ours  # "in every run"
        assert f"{t['cost_per_task']['ratio']:.3f}x" in text, ours
        assert f"{t['ttft_p50']['ratio']:.3f}x" in text, ours
        assert t["ttft_p50"]["ratio"] > 1.0, ours  # "higher with fleetloop"
    head = doc["targets"]["headline"]
    assert (head["ours"], head["peer"]) == ("fleetloop-haproxy", "vllm-cache-aware")
    h = head["targets"]
    assert (
        f"meets success ({h['success']['ratio']:.3f}x) and TTFT p50 ({h['ttft_p50']['ratio']:.3f}x)" in text
    )
    assert all(h["success"]["per_run_ok"])
    assert all(h["ttft_p50"]["per_run_ok"])
    assert f"the cost target: {h['cost_per_task']['ratio']:.3f}x against 0.9x" in text
    assert not h["cost_per_task"]["met"]
    worst = max(s["lag_p99_max_ms"] for s in med.values())
    assert f"no run void (emulator lag p99 at most {worst:.1f} ms)" in text
    assert not doc["void"]


def test_the_doc_quotes_the_prefix_heavy_results_file() -> None:
    import json

    doc = json.loads((ROOT / "bench/results/stack/stack-prefix-heavy.json").read_text())
    text = " ".join(DOC.read_text().split())
    (pair,) = doc["targets"]["same_router"]
    assert (pair["ours"], pair["peer"]) == ("fleetloop-vllm", "vllm-cache-aware")
    t = pair["targets"]
    assert all(s["success"]["min"] == 1.0 for s in doc["summary"].values())  # "every task ... succeeds"
    cost_ok, ttft_ok = t["cost_per_task"]["per_run_ok"], t["ttft_p50"]["per_run_ok"]
    assert f"cost per successful task is {t['cost_per_task']['ratio']:.3f}x the router alone" in text
    words = {1: "one", 2: "two", 3: "three"}
    assert f"(below 0.9x in {words[sum(cost_ok)]} runs of {words[len(cost_ok)]})" in text
    assert f"TTFT p50 is {t['ttft_p50']['ratio']:.3f}x**" in text
    by_run: dict[int, dict[str, float]] = {}
    for r in doc["runs_raw"]:
        by_run.setdefault(r["run"], {})[r["arm"]] = r["latency"]["ttft_p50_ms"]
    higher = sum(x["fleetloop-vllm"] > x["vllm-cache-aware"] for x in by_run.values())
    assert f"higher in {words[higher]} runs of {words[len(ttft_ok)]}" in text
    med = doc["summary"]
    ours, peer = (round(med[a]["ttft_p50"]["median"]) for a in ("fleetloop-vllm", "vllm-cache-aware"))
    assert f"({ours:,} against {peer:,} ms)" in text
    assert not doc["void"]
    worst = max(s["lag_p99_max_ms"] for s in med.values())
    assert f"no run void, the runs' lag p99 at most {worst:.1f} ms" in text


def test_the_doc_quotes_the_emulator_lag_of_the_degraded_gpu_results_file() -> None:
    """The paragraph on what held the emulator's loop quotes the committed hour-long run: the range
    of the emulator's lag p99 over its runs (each run's node events, the results file's "emulator
    lag p99" column), how many runs, and the bar; and it holds no other figure, so none that no
    committed file holds."""
    import json

    doc = json.loads((ROOT / "bench/results/stack/stack-degraded-gpu.json").read_text())
    runs = doc["runs_raw"]
    lags = [r["realtime_lag"]["node_events"]["p99_ms"] for r in runs]
    quoted = (
        f"the emulator's lag p99 was {min(lags):.1f}-{max(lags):.1f} ms over its {len(runs)} runs, "
        f"against the bar of {doc['max_lag_ms']:g} ms"
    )
    (paragraph,) = [p for p in DOC.read_text().split("\n\n") if p.startswith("What held the emulator's loop")]
    paragraph = " ".join(paragraph.split())
    assert quoted in paragraph, paragraph
    assert not doc["void"]  # every run of the file is one of them
    figures = re.findall(r"\d[\d.,-]*\s*(?:ms|µs|s\b|%|x\b)|\d+(?:\.\d+)", paragraph)
    assert sorted(figures) == sorted([f"{min(lags):.1f}-{max(lags):.1f} ms", f"{doc['max_lag_ms']:g} ms"]), (
        figures
    )


def first_below(entries: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """A run's first autoscale record (after its start) whose target is below ``n`` nodes."""
    return next(e for e in entries if e["t_s"] > 0 and e["desired"] < n)


def test_the_doc_quotes_the_autoscale_probe_and_the_first_drains() -> None:
    """Why the HAProxy arm scales in later: the probe's autoscale records (the target fell at once
    driving vllm-router, held as tasks accumulating driving HAProxy) and the committed three-router
    run's first drain times, as the doc quotes them."""
    import json

    probe = json.loads((ROOT / "bench/results/stack/autoscale-probe/stack-degraded-gpu.json").read_text())
    by_arm = {r["arm"]: r["autoscale"] for r in probe["runs_raw"]}

    vllm = first_below(by_arm["fleetloop-vllm"], 24)
    assert (vllm["desired"], vllm["reason"]) == (18, "scale-down")
    assert not any("held" in e["reason"] for e in by_arm["fleetloop-vllm"])
    held = [e for e in by_arm["fleetloop-haproxy"] if e["reason"] == "scale-down-held-tasks-accumulating"]
    assert held
    assert held[0]["desired"] == 24
    down = first_below(by_arm["fleetloop-haproxy"], 24)
    text = " ".join(DOC.read_text().split())
    assert f"fell from 24 to 18 at {vllm['t_s']:.0f} s" in text
    assert f"from {held[0]['t_s']:.0f} s until {down['t_s']:.0f} s" in text
    runs = json.loads((ROOT / "bench/results/stack/stack-degraded-gpu.json").read_text())["runs_raw"]

    def first_drain(r: dict[str, Any]) -> float:
        tl = r["timeline"]
        return next(t for t, n in zip(tl["t"], tl["nodes_provisioned"], strict=True) if n < 24)

    def span(arms: set[str]) -> str:
        ts = [first_drain(r) for r in runs if r["arm"] in arms]
        return f"{min(ts):.0f}-{max(ts):.0f} s"

    others = span({"fleetloop-vllm", "fleetloop-sglang"})
    assert f"came {span({'fleetloop-haproxy'})} into every run, against {others}" in text


def test_the_doc_quotes_the_probe_after_the_final_call_header() -> None:
    """After callers mark a task's last call, the HAProxy arm's daemon is no longer held: both arms'
    targets fall at about the same time, and the doc quotes the times and the HAProxy arm's cost
    per successful task before and after."""
    import json

    root = ROOT / "bench/results/stack"
    after = json.loads((root / "autoscale-probe-final/stack-degraded-gpu.json").read_text())["runs_raw"]
    before = json.loads((root / "autoscale-probe/stack-degraded-gpu.json").read_text())["runs_raw"]
    by_arm = {r["arm"]: r for r in after}
    text = " ".join(DOC.read_text().split())
    for arm in ("fleetloop-haproxy", "fleetloop-vllm"):
        entries = by_arm[arm]["autoscale"]
        assert not any("held" in e["reason"] for e in entries), arm
        first = first_below(entries, 24)
        assert first["desired"] == 18
        assert f"{first['t_s']:.1f} s" in text, arm
    (old,) = [r["cost_per_successful_task_usd"] for r in before if r["arm"] == "fleetloop-haproxy"]
    new = by_arm["fleetloop-haproxy"]["cost_per_successful_task_usd"]
    assert new < old
    assert f"{new:.6f}, against {old:.6f} before" in text


def test_the_doc_quotes_the_headline_pair_after_the_fix() -> None:
    import json

    doc = json.loads((ROOT / "bench/results/stack/headline/stack-degraded-gpu.json").read_text())
    assert not doc["void"]
    head = doc["targets"]["headline"]
    assert (head["ours"], head["peer"]) == ("fleetloop-haproxy", "vllm-cache-aware")
    t = head["targets"]
    text = " ".join(DOC.read_text().split())
    assert (
        f"Task success: {t['success']['ours']:.3f} against {t['success']['peer']:.3f} "
        f"({t['success']['ratio']:.3f}x), higher in every run" in text
    )
    assert all(t["success"]["per_run_ok"])
    assert f"TTFT p50: {t['ttft_p50']['ratio']:.3f}x, within 1.1x in every run" in text
    assert all(t["ttft_p50"]["per_run_ok"])
    cost = t["cost_per_task"]
    assert f"Cost per successful task: {cost['ratio']:.3f}x at the median" in text
    assert cost["per_run_ok"] == [True, False, True]
    runs = {(r["arm"], r["run"]): r["cost_per_successful_task_usd"] for r in doc["runs_raw"]}
    second = runs[("fleetloop-haproxy", 2)] / runs[("vllm-cache-aware", 2)]
    assert f"but {second:.3f}x in the second run" in text
    assert not cost["met"]
