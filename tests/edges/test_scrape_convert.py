"""Fixture tests of the runtime adapters: every runtime and release, a counter reset, a renamed metric.

The fixtures (tests/edges/fixtures/<runtime>-<release>.<n>.prom) are three scrapes of one engine:
a baseline, one second later, and after the engine restarted. Their headers cite where the metric
definitions were read.
"""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest
from fleetloop.edges.scrape.convert import (
    Converter,
    ExpositionError,
    MissingMetrics,
    NodeIdentity,
    bucket_quantile,
    parse_exposition,
)
from fleetloop.edges.scrape.runtimes import RELEASES, detect
from fleetloop.schemas.telemetry import NodeTelemetry

FIXTURES = Path(__file__).parent / "fixtures"
TTFT_NEW_S = [0.05, 0.07, 0.2, 0.3, 0.6, 1.2]  # what the engine saw between scrape 1 and 2

# fixture -> (runtime, release version, expected counters over scrape 1 -> 2)
CASES = {
    "vllm-0.33.0": (
        "vllm",
        "0.33.0 (V1)",
        {
            "requests_completed": 5,
            "timeouts": 1,
            "errors": 1,
            "preemptions": 1,
            "prefix_cache_hit_frac": 0.75,
        },
    ),
    "vllm-0.8.5": (
        "vllm",
        "0.8.5 (V1, before the renames)",
        {
            "requests_completed": 5,
            "timeouts": 1,
            "errors": 0,
            "preemptions": 1,
            "prefix_cache_hit_frac": 0.75,
        },
    ),
    "vllm-0.6.6": (
        "vllm",
        "0.6.6 (V0)",
        {
            "requests_completed": 5,
            "timeouts": 0,
            "errors": 0,
            "preemptions": 1,
            "prefix_cache_hit_frac": 0.35,
        },
    ),
    "sglang-0.5.23": (
        "sglang",
        "0.5.23",
        {
            "requests_completed": 6,
            "timeouts": 1,
            "errors": 0,
            "preemptions": 1,
            "prefix_cache_hit_frac": 0.35,
        },
    ),
    "trtllm-serve": (
        "trtllm",
        "trtllm-serve (TensorRT-LLM 1.2)",
        {
            "requests_completed": 5,
            "timeouts": 0,
            "errors": 1,
            "preemptions": 0,
            "prefix_cache_hit_frac": 0.35,
        },
    ),
    "trtllm-triton": (
        "trtllm",
        "Triton tensorrtllm_backend",
        {"requests_completed": 5, "timeouts": 0, "errors": 1, "preemptions": 0, "prefix_cache_hit_frac": 0.0},
    ),
    "dynamo-1.6.1": (
        "dynamo",
        "1.6.1",
        {
            "requests_completed": 5,
            "timeouts": 0,
            "errors": 1,
            "preemptions": 0,
            "prefix_cache_hit_frac": 0.35,
        },
    ),
}


def _scrape(name: str, n: int) -> str:
    return (FIXTURES / f"{name}.{n}.prom").read_text()


def _converter(runtime: str) -> Converter:
    return Converter(
        runtime, NodeIdentity(node_id="p/n0", pool_id="p", gpu_type="H100", usd_per_h=2.5, kv_gib=40.0)
    )


def _run(name: str, runtime: str, texts: list[str]) -> list[NodeTelemetry | None]:
    conv = _converter(runtime)
    return [
        conv.update(parse_exposition(t), ts_ms=1_000_000 + 1000 * i, mono_ms=5_000 + 1000 * i)
        for i, t in enumerate(texts)
    ]


def test_every_release_has_a_fixture_with_a_cited_source() -> None:
    versions = {(rt, v) for rt, v, _ in CASES.values()}
    for runtime, releases in RELEASES.items():
        for r in releases:
            assert (runtime, r.version) in versions, f"no fixture for {runtime} {r.version}"
    for name in CASES:
        head = _scrape(name, 1).splitlines()[:3]
        assert head[0].startswith("# fixture: ")
        assert head[1].startswith("# metric definitions read from: ")


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_converts(name: str) -> None:
    runtime, version, expected = CASES[name]
    first, second, third = _run(name, runtime, [_scrape(name, 1), _scrape(name, 2), _scrape(name, 3)])
    assert first is None, "the first scrape is a baseline: it publishes no rate it cannot know"
    assert second is not None
    assert third is not None
    detected = detect(runtime, parse_exposition(_scrape(name, 2)).names())
    assert detected is not None
    assert detected.version == version
    # gauges as they are
    assert second.running_requests == 5
    assert second.queue_depth == 2
    assert second.kv_cache_used_frac == pytest.approx(0.42)
    assert second.hbm_free_gib == pytest.approx(40.0 * 0.58, abs=1e-3)
    # counters: the increase over the interval
    assert second.prompt_tokens == 1500
    assert second.output_tokens == 800
    for field, want in expected.items():
        assert getattr(second, field) == pytest.approx(want), field
    assert second.interval_ms == 1000
    assert second.ts_ms == 1_001_000
    # TTFT: the true quantile lies in the bucket found, so the estimate is within that bucket
    truth_p50 = sorted(TTFT_NEW_S)[2] * 1000  # 200..300 ms: the middle pair
    assert second.ttft_p50_ms is not None
    assert second.ttft_p99_ms is not None
    assert abs(second.ttft_p50_ms - truth_p50) <= 500.0
    assert second.ttft_p50_ms <= second.ttft_p99_ms
    if runtime != "trtllm" or "serve" in version:
        assert second.tbt_p50_ms is not None
        assert second.tbt_p99_ms is not None
        assert second.tbt_p50_ms < 30.0 < second.tbt_p99_ms  # 90 tokens at 20 ms, 10 at 200 ms
    # the restart: counters went down; nothing negative, the new process' counts are the increase
    assert third.prompt_tokens == 300
    assert third.output_tokens == 100
    assert third.requests_completed >= 0
    assert third.errors >= 0
    assert third.preemptions >= 0
    assert third.ttft_p50_ms is not None
    assert third.ttft_p50_ms <= 100.0 + 1e-6


# fixture -> the engine its records name (Dynamo's page does not say which engine serves behind it)
ENGINE_NAMED = {
    "vllm-0.33.0": "vllm",
    "vllm-0.8.5": "vllm",
    "vllm-0.6.6": "vllm",
    "sglang-0.5.23": "sglang",
    "trtllm-serve": "trtllm",
    "trtllm-triton": "trtllm",
    "dynamo-1.6.1": None,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_runtimes_records_name_the_engine_it_reads(name: str) -> None:
    assert set(ENGINE_NAMED) == set(CASES)
    runtime = CASES[name][0]
    _, second, third = _run(name, runtime, [_scrape(name, 1), _scrape(name, 2), _scrape(name, 3)])
    assert second is not None
    assert third is not None
    assert second.engine == third.engine == ENGINE_NAMED[name]
    wire = orjson.loads(second.model_dump_json())
    assert wire.get("engine") == ENGINE_NAMED[name]
    assert ("engine" in wire) == (ENGINE_NAMED[name] is not None)  # none named: the record as before


@pytest.mark.parametrize(("runtime", "name"), [("dynamo", "dynamo-1.6.1"), ("vllm", "vllm-0.33.0")])
def test_a_stated_engine_is_what_the_records_name(runtime: str, name: str) -> None:
    """``fleetloop scrape --engine``: Dynamo's backend, or the engine an emulated vLLM page stands for."""
    conv = Converter(runtime, NodeIdentity(node_id="p/n0", pool_id="p", engine="sglang"))
    recs = _feed(conv, [_scrape(name, 1), _scrape(name, 2)])
    assert recs[1] is not None
    assert recs[1].engine == "sglang"


def test_vllm_v1_exact_quantiles_and_model_label() -> None:
    _, second, _ = _run("vllm-0.33.0", "vllm", [_scrape("vllm-0.33.0", n) for n in (1, 2, 3)])
    assert second is not None
    # rank 3 of 6 falls in (0.08, 0.25] holding 1 request above 2 below: 0.08 + 0.17 x 1/1
    assert second.ttft_p50_ms == pytest.approx(250.0)
    # rank 5.94 in (1.0, 2.5] holding the 6th: 1.0 + 1.5 x 0.94 (truth 1.2 s: within the 1.5 s bucket)
    assert second.ttft_p99_ms == pytest.approx(2410.0)
    # 90 of 100 tokens at 20 ms: rank 50 in (0.01, 0.025]: 0.01 + 0.015 x 50 / 90
    assert second.tbt_p50_ms == pytest.approx(18.333, abs=1e-3)
    assert second.tbt_p99_ms == pytest.approx(195.0)
    assert second.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert second.gpu_type == "H100"
    assert second.cost_rate_usd_per_h == 2.5


def test_renamed_metrics_read_the_same_field() -> None:
    """vLLM V0 -> V1 renames: kv_cache_usage_perc / gpu_cache_usage_perc feed the same field."""
    new = parse_exposition(_scrape("vllm-0.33.0", 2))
    old = parse_exposition(_scrape("vllm-0.8.5", 2))
    assert "vllm:kv_cache_usage_perc" in new.samples
    assert "vllm:kv_cache_usage_perc" not in old.samples
    assert "vllm:gpu_cache_usage_perc" in old.samples
    assert "vllm:inter_token_latency_seconds_bucket" in new.samples
    assert "vllm:time_per_output_token_seconds_bucket" in old.samples
    a = _run("x", "vllm", [_scrape("vllm-0.33.0", 1), _scrape("vllm-0.33.0", 2)])[1]
    b = _run("x", "vllm", [_scrape("vllm-0.8.5", 1), _scrape("vllm-0.8.5", 2)])[1]
    assert a is not None
    assert b is not None
    assert a.kv_cache_used_frac == b.kv_cache_used_frac == pytest.approx(0.42)
    assert a.tbt_p99_ms == b.tbt_p99_ms
    assert a.prefix_cache_hit_frac == b.prefix_cache_hit_frac == pytest.approx(0.75)


def test_counter_reset_without_a_process_start_gauge() -> None:
    """A counter that went down is a reset even when nothing else says the engine restarted."""
    strip = lambda t: "\n".join(ln for ln in t.splitlines() if "process_start" not in ln) + "\n"  # noqa: E731
    conv = _converter("vllm")
    texts = [strip(_scrape("vllm-0.33.0", n)) for n in (1, 2, 3)]
    recs = [
        conv.update(parse_exposition(t), ts_ms=10 + i, mono_ms=1000 * (i + 1)) for i, t in enumerate(texts)
    ]
    third = recs[2]
    assert third is not None
    assert third.prompt_tokens == 300
    assert third.output_tokens == 100
    assert third.requests_completed == 2
    assert conv.resets > 0


def test_bad_exposition_is_an_error_not_a_crash() -> None:
    for bad in (
        "vllm:num_requests_running{engine=0 3\n",
        "<html>502 Bad Gateway</html>\n",
        "\x00\x01",
        "a b c\n",
    ):
        with pytest.raises(ExpositionError):
            parse_exposition(bad)
    # what parses but makes no sense (a bucket bound that is no number) is skipped, not fatal
    conv = _converter("vllm")
    odd = parse_exposition(
        "vllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n"
        'vllm:time_to_first_token_seconds_bucket{le="a"} 1\n'
    )
    assert conv.update(odd, ts_ms=1, mono_ms=1000) is None
    rec = conv.update(odd, ts_ms=2, mono_ms=2000)
    assert rec is not None
    assert rec.ttft_p50_ms is None


def test_hostile_values_stay_in_bounds() -> None:
    text = (
        "vllm:num_requests_running -3\nvllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc 7.5\n"
        "vllm:prompt_tokens_total +Inf\nvllm:generation_tokens_total 1e300\n"
    )
    conv = _converter("vllm")
    assert conv.update(parse_exposition(text), ts_ms=1, mono_ms=1000) is None
    rec = conv.update(parse_exposition(text), ts_ms=2, mono_ms=2000)
    assert rec is not None
    assert rec.running_requests == 0
    assert rec.queue_depth == 0
    assert rec.kv_cache_used_frac == 1.0
    assert rec.prompt_tokens == 0
    assert rec.output_tokens == 0


def test_bucket_quantile_bounds() -> None:
    assert bucket_quantile(0.5, []) is None
    assert bucket_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None
    # everything above the last finite bound: the bound is a lower bound of the truth
    assert bucket_quantile(0.99, [(1.0, 0.0), (2.0, 0.0), (math.inf, 10.0)]) == 2.0
    assert bucket_quantile(0.5, [(1.0, 10.0), (math.inf, 10.0)]) == pytest.approx(0.5)


def test_long_gap_rebaselines() -> None:
    conv = _converter("vllm")
    t1, t2 = parse_exposition(_scrape("vllm-0.33.0", 1)), parse_exposition(_scrape("vllm-0.33.0", 2))
    assert conv.update(t1, ts_ms=1, mono_ms=1000) is None
    assert conv.update(t2, ts_ms=2, mono_ms=1000 + 700_000) is None  # > 600 s: a new baseline


def test_readme_carries_the_generated_tables() -> None:
    from fleetloop.edges.scrape.runtimes import RUNTIMES, field_table

    readme = (Path(__file__).parents[2] / "docs" / "integrations" / "scrape.md").read_text()
    for runtime in RUNTIMES:
        assert field_table(runtime) in readme, f"the {runtime} table drifted: regenerate it"


NODE_EXPORTER = """# HELP node_load1 1m load average.
# TYPE node_load1 gauge
node_load1 0.42
# HELP node_cpu_seconds_total Seconds the CPUs spent in each mode.
# TYPE node_cpu_seconds_total counter
node_cpu_seconds_total{cpu="0",mode="idle"} 12345.6
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.7e+09
"""


@pytest.mark.parametrize("runtime", sorted(RELEASES))
def test_a_page_without_the_runtimes_metrics_is_no_record(runtime: str) -> None:
    """Another server's page (node_exporter here) is a failed scrape, never an idle node; no release
    is made up for it."""
    expo = parse_exposition(NODE_EXPORTER)
    assert detect(runtime, expo.names()) is None
    conv = _converter(runtime)
    for i in range(3):
        with pytest.raises(MissingMetrics, match=rf"^no {runtime} metrics$"):
            conv.update(expo, ts_ms=1 + i, mono_ms=1000 * (i + 1))
    assert conv.release is None


@pytest.mark.parametrize("other", ["vllm-0.33.0", "dynamo-1.6.1", "trtllm-serve"])
def test_another_runtimes_page_is_no_record(other: str) -> None:
    """``--runtime sglang`` pointed at a vLLM (or Dynamo, trtllm-serve) engine reads nothing from it."""
    conv = _converter("sglang")
    for n in (1, 2):
        with pytest.raises(MissingMetrics, match=r"^no sglang metrics$"):
            conv.update(parse_exposition(_scrape(other, n)), ts_ms=n, mono_ms=1000 * n)
    assert conv.release is None


def test_a_failed_page_between_good_ones_keeps_the_baseline() -> None:
    conv = _converter("vllm")
    assert conv.update(parse_exposition(_scrape("vllm-0.33.0", 1)), ts_ms=1, mono_ms=1000) is None
    with pytest.raises(MissingMetrics):
        conv.update(parse_exposition(NODE_EXPORTER), ts_ms=2, mono_ms=2000)
    rec = conv.update(parse_exposition(_scrape("vllm-0.33.0", 2)), ts_ms=3, mono_ms=3000)
    assert rec is not None
    assert rec.prompt_tokens == 1500  # the increase since the last good page
    assert rec.interval_ms == 2000
    assert conv.release is not None
    assert conv.release.version == "0.33.0 (V1)"


def _without(text: str, *prefixes: str) -> str:
    """``text`` without the samples, HELP and TYPE lines of metrics whose names start with ``prefixes``."""

    def name(line: str) -> str:
        return line.split()[2] if line.startswith(("# HELP ", "# TYPE ")) else line

    return "".join(ln + "\n" for ln in text.splitlines() if not name(ln).startswith(prefixes))


def test_no_request_gauges_is_no_record() -> None:
    """A page that is the runtime's but lacks both request gauges would claim an idle node: a Dynamo
    worker's own port (``dynamo_component_*`` only, its load is on the frontend's page)."""
    worker = _without(_scrape("dynamo-1.6.1", 2), "dynamo_frontend_")
    assert "dynamo_component_gpu_cache_usage_percent" in worker
    conv = _converter("dynamo")
    with pytest.raises(MissingMetrics, match="no dynamo request gauges") as info:
        conv.update(parse_exposition(worker), ts_ms=1, mono_ms=1000)
    assert "dynamo_frontend_inflight_requests" in str(info.value)
    assert conv.release is not None  # the runtime was told; only the load is missing
    # one request gauge is enough: the other reads 0, as a missing counter does
    conv = _converter("vllm")
    page = _without(_scrape("vllm-0.33.0", 2), "vllm:num_requests_waiting")
    assert conv.update(parse_exposition(page), ts_ms=1, mono_ms=1000) is None
    rec = conv.update(parse_exposition(page), ts_ms=2, mono_ms=2000)
    assert rec is not None
    assert rec.running_requests == 5
    assert rec.queue_depth == 0


def _only(text: str, *prefixes: str) -> str:
    """``text`` with only the metrics whose names start with ``prefixes`` (and the process' start)."""

    def name(line: str) -> str:
        return line.split()[2] if line.startswith(("# HELP ", "# TYPE ")) else line

    keep = (*prefixes, "process_start_time_seconds")
    return "".join(ln + "\n" for ln in text.splitlines() if name(ln).startswith(keep))


def _feed(conv: Converter, pages: list[str]) -> list[NodeTelemetry | None]:
    return [
        conv.update(parse_exposition(t), ts_ms=1 + i, mono_ms=1000 * (i + 1)) for i, t in enumerate(pages)
    ]


VLLM_ANY = "release unknown: 0.33.0 (V1) or 0.8.5 (V1, before the renames) or 0.6.6 (V0)"
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


@pytest.mark.parametrize("name", ["vllm-0.33.0", "vllm-0.8.5", "vllm-0.6.6"])
def test_a_page_with_only_the_request_gauges_claims_no_release(name: str) -> None:
    """Every vLLM release spells the request gauges alike: a page with only those (a proxy's
    re-export, a scrape allow-list) is no particular release, whichever engine served it."""
    pages = [_only(_scrape(name, n), *GAUGES) for n in (1, 2)]
    expo = parse_exposition(pages[1])
    assert expo.names() >= set(GAUGES)
    assert not expo.names() - {*GAUGES, "process_start_time_seconds"}
    rel = detect("vllm", expo.names())
    assert rel is not None
    assert rel.version == VLLM_ANY
    assert [r.version for r in rel.candidates] == [r.version for r in RELEASES["vllm"]]
    conv = _converter("vllm")
    # the load is measured, but a record would claim an empty KV cache: a failed scrape instead
    with pytest.raises(MissingMetrics, match="no vllm KV-cache gauge") as info:
        conv.update(expo, ts_ms=1, mono_ms=1000)
    assert "vllm:gpu_cache_usage_perc, vllm:kv_cache_usage_perc" in str(info.value)
    assert conv.release is not None
    assert conv.release.version == VLLM_ANY


def test_an_unknown_release_reads_what_its_releases_read_alike() -> None:
    """A V0 page without the names that tell it from 0.8.5 (the prefix hit rate, TBT): both
    releases read its KV usage, tokens, TTFT and ``finished_reason=stop/length`` completions alike."""
    strip = ("vllm:gpu_prefix_cache", "vllm:time_per_output_token")
    pages = [_without(_scrape("vllm-0.6.6", n), *strip) for n in (1, 2)]
    conv = _converter("vllm")
    recs = _feed(conv, pages)
    assert conv.release is not None
    assert conv.release.version == "release unknown: 0.8.5 (V1, before the renames) or 0.6.6 (V0)"
    rec = recs[1]
    assert rec is not None
    assert (rec.running_requests, rec.queue_depth) == (5, 2)
    assert rec.kv_cache_used_frac == 0.42
    assert (rec.prompt_tokens, rec.output_tokens, rec.preemptions) == (1500, 800, 1)
    assert rec.requests_completed == 5
    assert rec.ttft_p50_ms is not None
    assert rec.tbt_p50_ms is None


def test_an_unknown_release_that_would_read_a_field_differently_is_no_record() -> None:
    """A 0.8.5 page without its prefix counters and TBT histogram, so it could as well be V0: V1 counts
    ``finished_reason=abort`` as a timeout, the V0 mapping counts it as completed. Either number would
    be a guess, so the page is a failed scrape."""
    strip = ("vllm:gpu_prefix_cache", "vllm:time_per_output_token")
    conv = _converter("vllm")
    for n in (1, 2):
        page = _without(_scrape("vllm-0.8.5", n), *strip)
        assert 'finished_reason="abort"' in page
        with pytest.raises(MissingMetrics, match=r"^vllm release unknown: .* requests_completed") as info:
            conv.update(parse_exposition(page), ts_ms=n, mono_ms=1000 * n)
        assert str(info.value).endswith("differently")
        assert "timeouts" in str(info.value)
        assert "tell those releases apart" in info.value.hint
    assert conv.release is not None
    assert conv.release.version == "release unknown: 0.8.5 (V1, before the renames) or 0.6.6 (V0)"
    # the baseline is untouched: the next full page is a baseline, then a record
    assert conv.update(parse_exposition(_scrape("vllm-0.8.5", 1)), ts_ms=3, mono_ms=3000) is None
    rec = conv.update(parse_exposition(_scrape("vllm-0.8.5", 2)), ts_ms=4, mono_ms=4000)
    assert rec is not None
    assert rec.timeouts == 1
    assert conv.release is not None
    assert conv.release.version == "0.8.5 (V1, before the renames)"


def test_a_histogram_name_tells_releases_apart() -> None:
    """``time_per_output_token_seconds`` (a histogram: only its ``_bucket``/``_count``/``_sum`` are on
    the page) is V0's and 0.8.5's spelling, not 0.33's: the page is one of those two, and its TBT is read."""
    keep = (*GAUGES, "vllm:gpu_cache_usage_perc", "vllm:time_per_output_token")
    pages = [_only(_scrape("vllm-0.8.5", n), *keep) for n in (1, 2)]
    rel = detect("vllm", parse_exposition(pages[1]).names())
    assert rel is not None
    assert rel.version == "release unknown: 0.8.5 (V1, before the renames) or 0.6.6 (V0)"
    conv = _converter("vllm")
    recs = _feed(conv, pages)
    rec = recs[1]
    assert rec is not None
    assert rec.tbt_p50_ms is not None
    assert rec.tbt_p50_ms < 30.0 < (rec.tbt_p99_ms or 0.0)
    # and a full page of each release is still that release: every fixture case above says so
    for name in ("vllm-0.33.0", "vllm-0.8.5", "vllm-0.6.6"):
        full = detect("vllm", parse_exposition(_scrape(name, 2)).names())
        assert full is not None
        assert not full.candidates
