"""docs/performance.md's figures for the daemon are the committed results' (``bench/results``): a
result made again without the doc, or the doc edited without the result, fails here."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _doc() -> str:
    return " ".join((ROOT / "docs" / "performance.md").read_text().split())


def _result(name: str) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads((ROOT / "bench" / "results" / f"{name}.json").read_bytes())
    return data


def _same(said: str, value: float) -> bool:
    """The doc's figure is ``value`` at the precision the doc writes it (thousands separators and a
    trailing ``k`` for thousands allowed)."""
    text = said.replace(",", "")
    scale = 1000.0 if text.endswith("k") else 1.0
    text = text.removesuffix("k")
    step = Decimal(1).scaleb(-len(text.split(".")[1])) if "." in text else Decimal(1)
    return Decimal(text) == (Decimal(repr(value)) / Decimal(repr(scale))).quantize(step, ROUND_HALF_UP)


def _check(pattern: str, values: list[float]) -> None:
    m = re.search(pattern, _doc())
    assert m, f"docs/performance.md lost: {pattern}"
    assert len(m.groups()) == len(values)
    for said, value in zip(m.groups(), values, strict=True):
        assert _same(said, value), (pattern, said, value)


NUM = r"([0-9][0-9,.]*k?)"


def test_decide() -> None:
    (s,) = _result("decide")["sizes"]
    _check(
        rf"one whole-fleet tick at {NUM} nodes in {NUM} pools takes {NUM} ms of CPU at p50 and {NUM} ms "
        rf"at p99 and publishes {NUM} decisions; the snapshot takes {NUM} ms and the fold of one second of "
        rf"records {NUM} ms",
        [s["nodes"], s["pools"], s["tick_cpu_p50_ms"], s["tick_cpu_p99_ms"], s["decisions_per_tick"],
         s["snapshot_cpu_p50_ms"], s["fold_1s_cpu_p50_ms"]],
    )  # fmt: skip
    assert s["gc_collections_in_ticks"] == [0, 0, 0]  # "No young collection lands inside the tick"
    _check(
        rf"the one of the rest of each second takes {NUM} ms of CPU at p50 and {NUM} ms at most",
        [s["gc_outside_tick_cpu_p50_ms"], s["gc_outside_tick_cpu_max_ms"]],
    )
    assert s["tick_cpu_p99_ms"] > _result("decide")["targets"]["p99_ms_at_10k"]  # "is not met"
    w = _result("decide-1m-workflows")["sizes"][0]["workflows"]
    _check(
        rf"the whole process holds {NUM} MiB \(limit 1 GiB\), and a new task's outcome folds in {NUM} us "
        rf"with the ledger at its cap against {NUM} us below it",
        [w["rss_total_mib"], w["new_task_us_at_cap"], w["new_task_us_below_cap"]],
    )
    assert w["open_workflows"] > 990_000


def _span(values: list[float]) -> list[float]:
    return [min(values), max(values)]


def test_ingest() -> None:
    runs = _result("ingest")["runs"]
    by = {b: [x for r in runs for x in r["brokers"] if x["broker"] == b] for b in ("tansu", "kafka")}
    rate = [x["fleetloop"]["events_per_cpu_s"] for xs in by.values() for x in xs]
    floor = {b: [x["vs_floor_cpu"] for x in xs] for b, xs in by.items()}
    faust = {b: [x["vs_faust_cpu"] for x in xs] for b, xs in by.items()}
    _check(
        rf"take in {NUM}-{NUM} events per CPU-second. Against a bare aiokafka \+ orjson consumer of the "
        rf"same records in the same run that is {NUM}-{NUM} of its rate on Tansu and {NUM}-{NUM} on Apache "
        rf"Kafka, whose floor is the faster of the two; against faust-streaming, {NUM}-{NUM}x on Tansu and "
        rf"{NUM}-{NUM}x on Apache Kafka",
        [*_span(rate), *_span(floor["tansu"]), *_span(floor["kafka"]), *_span(faust["tansu"]),
         *_span(faust["kafka"])],
    )  # fmt: skip
    fastest = {b: max(x["floor"]["events_per_cpu_s"] for x in xs) for b, xs in by.items()}
    assert fastest["kafka"] > fastest["tansu"]
    assert len(runs) == 3  # "three runs"


@pytest.mark.parametrize("nodes", [1000, 10000])
def test_latency(nodes: int) -> None:
    k, t = _result(f"latency-{nodes}-kafka"), _result(f"latency-{nodes}-tansu")
    for r in (k, t):
        assert r["trials"] == 20
        assert r["missed"] == 0  # every trial decided
    if nodes == 1000:
        _check(
            rf"on Apache Kafka p50 {NUM} ms, p99 {NUM} ms, {NUM} flaps; on Tansu p50 {NUM} ms, p99 {NUM} ms, "
            rf"{NUM} flaps",
            [k["p50_ms"], k["p99_ms"], k["flaps"], t["p50_ms"], t["p99_ms"], t["flaps"]],
        )
        _check(rf"after it the median was {NUM} ms on Kafka and {NUM} ms on Tansu",
               [k["after_boundary_p50_ms"], t["after_boundary_p50_ms"]])  # fmt: skip
        assert k["met"]
        assert t["met"]
        assert (k["nodes"], k["pools"], k["daemons"]) == (1000, 24, 1)
    else:
        _check(
            rf"on Apache Kafka at p50 {NUM} ms and p99 {NUM} ms with {NUM} flaps, on Tansu at p50 {NUM} ms "
            rf"and p99 {NUM} ms with {NUM} flaps, so the target is met at that size; after the boundary "
            rf"{NUM} / {NUM} ms \(p50 / p99\) on Kafka and {NUM} / {NUM} ms on Tansu",
            [k["p50_ms"], k["p99_ms"], k["flaps"], t["p50_ms"], t["p99_ms"], t["flaps"],
             k["after_boundary_p50_ms"], k["after_boundary_p99_ms"], t["after_boundary_p50_ms"],
             t["after_boundary_p99_ms"]],
        )  # fmt: skip
        assert k["met"]
        assert t["met"]
        assert (k["nodes"], k["pools"], k["daemons"]) == (10000, 247, 4)
        assert k["outcomes_per_node"] > 0  # "the same common case": targets served ok calls first
        assert t["outcomes_per_node"] > 0


def test_sizing() -> None:
    a, b, c = _result("sizing-1500"), _result("sizing-3000"), _result("sizing-10000")
    _check(
        rf"1,500 nodes in {NUM} pools \(~4,500 events/s.*?every one of {NUM} ticks decided, within {NUM} ms "
        rf"of its boundary at p99, at {NUM} CPU-seconds per second",
        [a["pools"], a["ticks_decided"], a["lag_p99_ms"], a["cpu_s_per_fleet_s"]],
    )
    assert a["ticks_decided"] == a["ticks_expected"]
    assert 4400 <= a["events_per_s"] <= 4600
    _check(
        rf"every one of {NUM} ticks decided, p99 {NUM} ms, {NUM} CPU-seconds per second and {NUM} more in "
        rf"the checkpoint encoders",
        [b["ticks_decided"], b["lag_p99_ms"], b["cpu_s_per_fleet_s"], b["children_cpu_s_per_fleet_s"]],
    )
    assert b["ticks_decided"] == b["ticks_expected"]
    assert a["within_rule"]
    assert a["nodes"] == 1500
    _check(
        rf"needing {NUM} CPU-seconds per second, it skipped the boundaries it could not decide in time "
        rf"\(published as skipped, `overload: ...`\), decided with a lag of {NUM} s p50 and {NUM} s p99, "
        rf"and was current {NUM} s after the load stopped",
        [c["cpu_s_per_fleet_s"], c["lag_p50_ms"] / 1000, c["lag_p99_ms"] / 1000, c["caught_up_after_s"]],
    )
    assert c["ticks_overload"] > 0
    d = _result("sizing-10000-10-minutes")
    _check(
        rf"every one of {NUM} ticks decided, p99 {NUM} ms after its boundary, {NUM} rebalances, {NUM} nodes "
        rf"per half core\. The event loop's longest stall of its own was {NUM} ms .*?and the collector's "
        rf"longest pause of its own {NUM} ms",
        [d["ticks_decided"], d["lag_p99_ms"], d["rebalances"], d["nodes_per_half_core"],
         d["loop_stall_own_max_ms"], d["gc_pause_own_max_ms"]],
    )  # fmt: skip
    assert d["ticks_decided"] == d["ticks_expected"]
    assert (d["nodes"], d["daemons"], d["seconds"]) == (10000, 3, 600.0)
    # "none is eviction now; the five longest ... are all in deciding a batch of pools"
    assert not any("evict" in s for s in d["loop_stalls_top"])
    assert all("_decide_batch" in s for s in d["loop_stalls_top"])


def test_rollup_router_fuzz_and_soak() -> None:
    k, t = _result("rollup-kafka"), _result("rollup-tansu")
    _check(
        rf"{NUM} ms p50 and {NUM} ms p99 on Apache Kafka, and {NUM} ms and {NUM} ms on Tansu",
        [k["latency_p50_ms"], k["latency_p99_ms"], t["latency_p50_ms"], t["latency_p99_ms"]],
    )
    rows = {(r["nodes"], r["picker"]): r for r in _result("router")["rows"]}
    wr = [r["pick_us"] for (_, p), r in rows.items() if p == "weighted-random"]
    p2c = [r["pick_us"] for (_, p), r in rows.items() if p == "least-request-p2c"]
    _check(
        rf"a pick takes {NUM}-{NUM} us with the weighted-random picker at 16, 1,000 and 10,000 nodes, and "
        rf"{NUM}-{NUM} us with least-request-p2c; round-robin and least-outstanding pass over the pool per "
        rf"call and take {NUM} ms and {NUM} ms at 10,000 nodes",
        [*_span(wr), *_span(p2c), rows[10000, "round-robin"]["pick_us"] / 1000,
         rows[10000, "least-outstanding"]["pick_us"] / 1000],
    )  # fmt: skip
    _check(
        rf"makes weighted-random picks {NUM}x faster at 1,000 nodes and {NUM}x at 10,000",
        [rows[1000, "weighted-random"]["speedup"], rows[10000, "weighted-random"]["speedup"]],
    )
    fuzz = _result("fuzz")
    _check(
        rf"\(`bench/results/fuzz.json`, {NUM} records: .*?floods of {NUM} node ids and {NUM} pools\): "
        rf"{NUM} crashes, {NUM} ticks missed, and {NUM} of {NUM} decisions",
        [fuzz["records"]["sent"], fuzz["records"]["by_category"]["flood-nodes"],
         fuzz["records"]["by_category"]["flood-pools"], fuzz["crashes"], fuzz["ticks"]["missed"],
         fuzz["decisions"]["different"], fuzz["decisions"]["clean"]],
    )  # fmt: skip
    soak = _result("soak")
    assert soak["samples_without_a_decided_tick"] == 0
    assert soak["ticks_failed"] == 0
    assert soak["bounded"]["rss"]
    assert soak["final_lag"] == 0
    assert soak["minutes"] == 3.0


def test_checkpoint() -> None:
    small, large = _result("checkpoint")["sizes"]
    assert (small["nodes"], large["nodes"]) == (1000, 10000)
    assert small["restore_exact"]
    assert large["restore_exact"]
    _check(
        rf"a 10,000-node shard's checkpoint is {NUM} MB compressed \({NUM} records\), encoded in {NUM} s and "
        rf"decoded in {NUM} s, and decodes to a state that encodes to the same bytes. Encoded in a forked "
        rf"child the loop goes at most {NUM} ms without running, against {NUM} ms encoded in the loop; a "
        rf"restore decoded in a thread holds it {NUM} ms with the collector held, as the daemon restores "
        rf"\(the checkpoint is {NUM} JSON documents of at most {NUM} KiB, each parsed by its own call, "
        rf"and the thread hands the loop the interpreter between them; one 28 MB document held it 128 ms\), "
        rf"{NUM} ms with the collector running and {NUM} ms decoded in the loop. At 1,000 nodes: {NUM} MB, "
        rf"and a longest stall of {NUM} ms forked against {NUM} ms in the loop",
        [large["bytes"] / 1e6, large["chunks"], large["encode_ms"] / 1000, large["decode_ms"] / 1000,
         large["loop_stall_forked_ms"], large["loop_stall_inline_ms"],
         large["restore_stall_thread_gc_held_ms"], large["json_documents"],
         large["largest_json_bytes"] / 1024, large["restore_stall_thread_ms"],
         large["restore_stall_inline_ms"], small["bytes"] / 1e6, small["loop_stall_forked_ms"],
         small["loop_stall_inline_ms"]],
    )  # fmt: skip
    from fleetloop.cli.main import build_parser

    run = build_parser(environ={}).parse_args(["run", "--bootstrap-servers", "127.0.0.1:9092"])
    _check(
        rf"more than {NUM}% of a core \(`--checkpoint-cpu-share`\), a shard is checkpointed less often, "
        rf"up to `--checkpoint-max-stretch` \({NUM}\) times `--checkpoint-interval-s` \({NUM} s\) apart",
        [100 * run.checkpoint_cpu_share, run.checkpoint_max_stretch, run.checkpoint_interval_s],
    )


def test_the_sizing_rule_is_the_bench_s_and_the_readme_s() -> None:
    from fleetloop.bench.sizing import RULE_NODES

    readme = " ".join((ROOT / "README.md").read_text().split())
    _check(r"plan \*\*about ([0-9,]+) nodes \(~4,500 events/s\) per process\*\*", [RULE_NODES])
    assert f"plan about {RULE_NODES:,} nodes per process" in readme
    assert _result("sizing-1500")["rule"]["nodes"] == RULE_NODES
