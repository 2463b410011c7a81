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
