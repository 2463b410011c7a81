"""The README's breaker-latency figures are the committed results' (bench/results/latency-s7-*.json):
a rerun that changes a result file without the README, or the other way round, fails here."""

from __future__ import annotations

from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]


def _result(name: str) -> dict[str, object]:
    out: dict[str, object] = orjson.loads((ROOT / "bench" / "results" / name).read_bytes())
    return out


def _ms(x: object) -> str:
    assert isinstance(x, float | int)
    return f"{int(x + 0.5):,} ms"  # half up, as the progress lines print them


def test_the_readmes_latency_figures_are_the_results_files() -> None:
    readme = (ROOT / "README.md").read_text()
    for broker, label in (("kafka", "Apache Kafka"), ("tansu", "Tansu")):
        r = _result(f"latency-s7-1000-{broker}.json")
        assert r["nodes"] == 1000
        assert r["trials"] == 20
        assert r["missed"] == 0
        assert r["met"] is True
        assert f"{label}: p50 {_ms(r['p50_ms'])}, p99 {_ms(r['p99_ms'])}" in readme
    big = _result("latency-s7-10000-kafka-4daemons.json")
    assert big["nodes"] == 10_000
    assert big["daemons"] == 4
    assert big["met"] is False
    decided = len(big["latencies_ms"])  # type: ignore[arg-type]
    assert f"{decided} of {big['trials']}" in readme
    assert f"p50 {_ms(big['p50_ms'])}, max {_ms(big['max_ms'])}" in readme
    first = big["latencies_ms"][:10]  # type: ignore[index]
    assert f"{_ms(min(first)).removesuffix(' ms')}-{_ms(max(first))}" in readme


def test_the_readmes_overload_figures_are_the_sizing_results() -> None:
    """Session 9's overload sentence: the final tree's bench sizing run against the session-start
    tree's (bench/results/latency-s9-sizing-10000-kafka-{limit2,base-first}.json)."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    now = _result("latency-s9-sizing-10000-kafka-limit2.json")
    before = _result("latency-s9-sizing-10000-kafka-base-first.json")
    assert now["nodes"] == before["nodes"] == 10_000

    def s(x: object) -> str:
        assert isinstance(x, float | int)
        return f"{x / 1000:.1f} s"

    assert f"lag of {s(now['lag_p50_ms'])} p50 / {s(now['lag_p99_ms'])} p99" in readme
    assert f"current {now['caught_up_after_s']} s after the load stopped" in readme
    assert now["ticks_overload"]  # it skipped boundaries to stay current
    assert before["caught_up_after_s"] is None  # not current 240 s later
    assert before["ticks_skipped"] == 0
    p50, p99 = (round(float(before[k]) / 1000) for k in ("lag_p50_ms", "lag_p99_ms"))  # type: ignore[arg-type]
    assert f"was {p50} s / {p99} s behind" in readme


def test_the_readmes_final_10k_trial_figures_are_the_results_files() -> None:
    """Session 9's 4-daemon 10,000-node run at its end against the same command at its start
    (bench/results/latency-s9-10000-kafka-4daemons-{final,start}.json)."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    now = _result("latency-s9-10000-kafka-4daemons-final.json")
    start = _result("latency-s9-10000-kafka-4daemons-start.json")
    for r in (now, start):
        assert r["nodes"] == 10_000
        assert r["daemons"] == 4
        assert r["trials"] == 20
        assert r["broker"] == "kafka"
        assert r["met"] is False
    missed_now, missed_start = now["missed"], start["missed"]
    behind_now, behind_start = now["daemon_behind_s_max"], start["daemon_behind_s_max"]
    assert isinstance(missed_now, int)
    assert isinstance(missed_start, int)
    assert isinstance(behind_now, float | int)
    assert isinstance(behind_start, float | int)
    assert f"decided {20 - missed_now} of 20 trials" in readme
    assert f"p50 {_ms(now['p50_ms'])}, p99 {_ms(now['p99_ms'])}" in readme
    assert f"at most {behind_now:.1f} s behind" in readme
    assert f"missed {missed_start} of 20 and ended {round(behind_start)} s behind" in readme


def test_the_readmes_session_10_loaded_run_is_the_results_file() -> None:
    """Session 10's 4-daemon run on the loaded machine (bench/results/latency-s10-10000-kafka-
    4daemons-final-loaded.json): where the cores went, and the daemons' run-queue share."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    r = _result("latency-s10-10000-kafka-4daemons-final-loaded.json")
    assert r["nodes"] == 10_000
    assert r["daemons"] == 4
    assert r["broker"] == "kafka"
    assert f"missed {r['missed']} of {r['trials']}" in readme
    cpu = r["cpu_per_s_during_trials"]
    assert isinstance(cpu, dict)
    assert f"other work took {cpu['other']:.2f} CPU-s/s" in readme
    assert f"the four daemons {cpu['daemons_with_children']:.3f} with their checkpoint children" in readme
    loops = r["daemon_loops"]
    assert isinstance(loops, list)
    runq = [round(loop["runq"] * 100) for loop in loops]
    assert f"runnable but not run {min(runq)}-{max(runq)}% of its wall time" in readme
    lo, hi = (round(float(r[k])) for k in ("load_average_min", "load_average_max"))  # type: ignore[arg-type]
    assert f"load {lo}-{hi})" in readme


def test_the_readmes_quiet_10k_figures_are_session_10s_results_file() -> None:
    """Session 10's quiet 4-daemon 10,000-node run at its end
    (bench/results/latency-s10-10000-kafka-4daemons-quiet.json)."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    r = _result("latency-s10-10000-kafka-4daemons-quiet.json")
    assert r["nodes"] == 10_000
    assert r["daemons"] == 4
    assert r["broker"] == "kafka"
    assert r["met"] is False
    trials, missed = r["trials"], r["missed"]
    assert isinstance(trials, int)
    assert isinstance(missed, int)
    assert f"{trials - missed} of {trials} trials were decided" in readme
    assert f"p50 {_ms(r['p50_ms'])}, p99 {_ms(r['p99_ms'])}" in readme
    behind = r["daemon_behind_s_max"]
    assert isinstance(behind, float | int)
    assert f"at most {behind:.1f} s behind" in readme
    over = sum(1 for x in r["latencies_ms"] if x > r["target_ms"])  # type: ignore[attr-defined,operator]
    assert f"{over} trials of {trials} over the 1,100 ms target" in readme


def test_the_readmes_quiet_10k_figures_are_session_11s_results_files() -> None:
    """Session 11's quiet 4-daemon 10,000-node runs at its end, both brokers, and the 10-trial
    Kafka run before them (bench/results/latency-s11-10000-*-4daemons-quiet*.json)."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    for broker, label in (("kafka", "on Apache Kafka"), ("tansu", "on Tansu")):
        r = _result(f"latency-s11-10000-{broker}-4daemons-quiet.json")
        assert r["nodes"] == 10_000
        assert r["daemons"] == 4
        assert r["broker"] == broker
        assert r["met"] is False
        trials, missed = r["trials"], r["missed"]
        assert isinstance(trials, int)
        assert isinstance(missed, int)
        over = sum(1 for x in r["latencies_ms"] if x > r["target_ms"])  # type: ignore[attr-defined,operator]
        assert f"{label} {trials - missed} of {trials}" in readme
        assert f"p50 {_ms(r['p50_ms'])}, p99 {_ms(r['p99_ms'])}" in readme
        assert f"{over} of {trials} over" in readme or f"{over} trial of {trials} over" in readme
        a50, a99 = (int(float(r[k]) + 0.5) for k in ("after_boundary_p50_ms", "after_boundary_p99_ms"))  # type: ignore[arg-type]
        after = f"{a50} / {a99} ms"
        assert after in readme
    ten = _result("latency-s11-10000-kafka-4daemons-quiet-10.json")
    assert ten["met"] is True
    assert ten["missed"] == 0
    assert f"(p50 {_ms(ten['p50_ms'])}, p99 {_ms(ten['p99_ms'])}," in readme


def test_the_readmes_hard_failure_figures_are_the_results_files() -> None:
    """The common case at 1,000 nodes, one daemon: a node that served ok calls in a loaded pool
    fails every call (bench/results/latency-hard-failure-1000-*.json), after the hard-failure rule
    and before it (the same bench with the engine and breaker of the parent commit)."""
    readme = " ".join((ROOT / "README.md").read_text().split())

    def run(name: str) -> dict[str, object]:
        r = _result(f"latency-hard-failure-1000-{name}.json")
        assert (r["nodes"], r["daemons"], r["trials"], r["outcomes_per_node"]) == (1000, 1, 20, 1.0)
        assert r["missed"] == 0
        return r

    def load(r: dict[str, object]) -> str:
        return f"load {r['load_average_min']}-{r['load_average_max']}"

    for broker, label, again in (
        ("kafka", "Apache Kafka", ("kafka-2", "kafka-3")),
        ("tansu", "Tansu", ("tansu-2",)),
    ):
        r = run(broker)
        assert r["broker"] == broker
        assert r["met"] is True
        assert r["flaps"] == 0
        assert f"{label}: p50 {_ms(r['p50_ms'])}, p99 {_ms(r['p99_ms'])}, 0 flaps ({load(r)}" in readme
        for name in again:
            o = run(name)
            assert o["flaps"] == 0
            assert f"p99 {_ms(o['p99_ms'])}" in readme
    slow = run("kafka-2")
    assert slow["met"] is False  # the miss the README explains by the machine
    assert f"p99 {_ms(slow['p99_ms'])} at {load(slow)}" in readme
    loops = slow["daemon_loops"]
    assert isinstance(loops, list)
    assert f"waited for a core {round(loops[0]['runq'] * 100)}% of its wall time" in readme
    over = [t for t in slow["per_trial"] if t["after_boundary_ms"] > 1000]  # type: ignore[attr-defined]
    assert len(over) == 2  # "two trials spent over a second after their boundary"
    kafka, tansu = run("kafka-before"), run("tansu-before")
    for r in (kafka, tansu):
        assert r["met"] is False
        assert r["trials_detected_first"] >= 19  # type: ignore[operator]
    before = (
        f"p50 {_ms(kafka['p50_ms'])}, p99 {_ms(kafka['p99_ms'])} on Kafka, with {kafka['flaps']} releases"
    )
    assert f"{before} in 20 trials" in readme
    assert (
        f"(Tansu: p50 {_ms(tansu['p50_ms'])}, p99 {_ms(tansu['p99_ms'])}, {tansu['flaps']} releases)"
        in readme
    )
