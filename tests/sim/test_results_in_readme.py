"""The README's suite figures are the committed tables' (``bench/results/sim-stress.json`` and
``sim-shipped.json``): pairs meeting every target, the geometric mean, and which scenarios miss on
how many seeds. Regenerating a table without updating the README fails here."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[2]


def _checks(name: str) -> list[dict[str, Any]]:
    data = orjson.loads((ROOT / "bench" / "results" / f"sim-{name}.json").read_bytes())
    checks: list[dict[str, Any]] = data["checks"]
    return checks


def _met(c: dict[str, Any]) -> bool:
    return bool(c["cost_ok"] and c["tasks_ok"] and c["p0_ok"])


def _geomean(checks: list[dict[str, Any]]) -> float:
    return math.exp(sum(math.log(c["cost_ratio"]) for c in checks) / len(checks))


def _readme() -> str:
    return " ".join((ROOT / "docs" / "performance.md").read_text().split())


def _misses_said(text: str) -> dict[str, int]:
    """The stress sentence's list of misses: each scenario named with its count of seeds."""
    m = re.search(r"; the misses: (.*?)\. ", text)
    assert m, "the doc lost the stress suite's list of misses"
    clause = re.sub(r"\([^()]*\)", "", m.group(1))  # a miss's explanation may name figures, not misses
    return {k: int(v) for k, v in re.findall(r"`([a-z0-9-]+)` on (\d+)", clause)}


def test_stress_suite_sentence_matches_the_table() -> None:
    checks = _checks("stress")
    text = _readme()
    m = re.search(
        r"sim-stress\.md`, 5 seeds, (\d+) scenarios\) (\d+) of the (\d+) \(scenario, seed\) pairs meet every "
        r"target and the geometric mean is ([0-9.]+)x",
        text,
    )
    assert m, "the doc lost the stress-suite sentence"
    assert int(m.group(1)) == len({c["scenario"] for c in checks})
    assert (int(m.group(2)), int(m.group(3))) == (sum(map(_met, checks)), len(checks))
    assert float(m.group(4)) == round(_geomean(checks), len(m.group(4).split(".")[1]))
    assert _misses_said(text[m.end() :]) == dict(Counter(c["scenario"] for c in checks if not _met(c)))


def test_shipped_suite_sentence_matches_the_table() -> None:
    checks = _checks("shipped")
    text = _readme()
    m = re.search(
        r"sim-shipped\.md`\) (\d+) of (\d+) pairs meet every target \(geometric mean ([0-9.]+)x\)", text
    )
    assert m, "README lost the shipped-suite sentence"
    assert (int(m.group(1)), int(m.group(2))) == (sum(map(_met, checks)), len(checks))
    assert float(m.group(3)) == round(_geomean(checks), len(m.group(3).split(".")[1]))
    misses = Counter(c["scenario"] for c in checks if not _met(c))
    said = dict(re.findall(r"`([a-z0-9-]+)` (?:misses )?on (\d+)(?: seeds)?", text[m.end() : m.end() + 300]))
    assert {k: int(v) for k, v in said.items()} == dict(misses)


def _table_geomean(against: str) -> float:
    """Default's cost per successful task over ``against``'s, geometric mean over the shipped
    scenarios of ``bench/results/sim-table.json`` (each scenario's own seed)."""
    data = orjson.loads((ROOT / "bench" / "results" / "sim-table.json").read_bytes())
    usd = {(r["scenario"], r["policy"]): r["per_successful_task_usd"] for r in data["rows"]}
    ratios = [usd[s, "default"] / usd[s, against] for s, p in usd if p == "default"]
    return math.exp(sum(math.log(x) for x in ratios) / len(ratios))


def test_shipped_table_sentences_match_the_table() -> None:
    text = _readme()
    m = re.search(
        r"default policy's cost per successful task is well below classic's \(geometric mean ([0-9.]+)x\)",
        text,
    )
    assert m, "README lost the shipped-table sentence against classic"
    assert float(m.group(1)) == round(_table_geomean("classic"), len(m.group(1).split(".")[1]))
    m = re.search(r"fleetloop costs (?:more|less) per successful task \(geometric mean ([0-9.]+)x\)", text)
    assert m, "README lost the shipped-table sentence against modern"
    assert float(m.group(1)) == round(_table_geomean("modern"), len(m.group(1).split(".")[1]))


def _rows(name: str) -> list[dict[str, Any]]:
    data = orjson.loads((ROOT / "bench" / "results" / f"{name}.json").read_bytes())
    rows: list[dict[str, Any]] = data["rows"]
    return rows


def _same(said: str, value: float) -> bool:
    """The README's figure is ``value`` at the precision the README writes it."""
    digits = len(said.split(".")[1]) if "." in said else 0
    return float(said) == round(value, digits)


def test_burst_a100_sentence_matches_the_table() -> None:
    """The stress sentence's account of burst-a100-2x on the seeds it misses: the success gap to
    classic in points, the cost ratio, and priority-0 success under default and classic, each as a
    range over those seeds."""
    m = re.search(
        r"on those seeds ends (\d+) to (\d+) points below classic's task success, at ([0-9.]+)x to "
        r"([0-9.]+)x its cost per successful task; its priority-0 tasks, .{0,80}?, succeed far more often "
        r"than under classic, (\d+)% to (\d+)% against (\d+)% to (\d+)%",
        _readme(),
    )
    assert m, "the doc lost the burst-a100-2x sentence"
    missed = {c["seed"] for c in _checks("stress") if c["scenario"] == "burst-a100-2x" and not _met(c)}
    rows = [r for r in _rows("sim-stress") if r["scenario"] == "burst-a100-2x" and r["seed"] in missed]
    by = {(r["seed"], r["policy"]): r for r in rows}
    seeds = sorted(missed)
    gap = [100 * (by[s, "classic"]["success_rate"] - by[s, "default"]["success_rate"]) for s in seeds]
    usd = {k: r["per_successful_task_usd"] for k, r in by.items()}
    ratio = [usd[s, "default"] / usd[s, "classic"] for s in seeds]
    p0 = [100 * by[s, "default"]["p0_success_rate"] for s in seeds]
    p0_classic = [100 * by[s, "classic"]["p0_success_rate"] for s in seeds]
    figures = [min(gap), max(gap), min(ratio), max(ratio), min(p0), max(p0), min(p0_classic), max(p0_classic)]
    assert seeds
    for said, value in zip(m.groups(), figures, strict=True):
        assert _same(said, value), (said, value)


def test_shipped_table_headlines_match_the_table() -> None:
    """The one-seed table's headlines: priority 0 under overload, the prefix cache against round
    robin, and the cascade's tasks lost to timed-out calls."""
    from fleetloop.sim.table import timed_out

    text = _readme()
    t = {(r["scenario"].rsplit("/", 1)[-1].removesuffix(".yaml"), r["policy"]): r for r in _rows("sim-table")}
    m = re.search(r"priority-0 work alive under overload \((\d+)% against classic's (\d+)%\)", text)
    assert m, "README lost the overload headline"
    assert _same(m.group(1), 100 * t["overload-mixed-priorities", "default"]["p0_success_rate"])
    assert _same(m.group(2), 100 * t["overload-mixed-priorities", "classic"]["p0_success_rate"])
    m = re.search(r"prefix-heavy TTFT p99 ([0-9.]+)x lower than none", text)
    assert m, "README lost the prefix headline"
    none, default = t["prefix-heavy-copilot", "none"], t["prefix-heavy-copilot", "default"]
    assert _same(m.group(1), none["ttft_p99_ms"] / default["ttft_p99_ms"])
    m = re.search(r"classic loses (\d+) of ~([0-9,]+) tasks to timed-out calls and fleetloop (\d+)", text)
    assert m, "README lost the cascade headline"
    classic, default = t["cascade-degraded-gpu", "classic"], t["cascade-degraded-gpu", "default"]
    assert int(m.group(1)) == timed_out(classic)
    assert int(m.group(3)) == timed_out(default)
    assert round(classic["tasks_started"], -3) == int(m.group(2).replace(",", ""))


def test_what_default_buys_against_modern_matches_the_tables() -> None:
    """The pairs where default costs more than modern and its TBT p99 is within the SLO while
    modern's is over it, per suite, as recounted from the tables' rows."""
    m = re.search(
        r"default's TBT p99 is within the SLO and modern's over it on (\d+) of (\d+) shipped pairs and "
        r"(\d+) of (\d+) stress pairs",
        _readme(),
    )
    assert m, "the doc lost the sentence on what default's extra cost buys against modern"
    said = [int(x) for x in m.groups()]
    figures: list[int] = []
    for name in ("shipped", "stress"):
        t = {(r["scenario"], r["seed"], r["policy"]): r for r in _rows(f"sim-{name}")}
        pairs = [(t[(s, seed, "default")], r) for (s, seed, p), r in t.items() if p == "modern"]
        dearer = [(d, mo) for d, mo in pairs if d["per_successful_task_usd"] > mo["per_successful_task_usd"]]
        bought = [1 for d, mo in dearer if d["tbt_p99_ms"] <= d["slo_tbt_ms"] < mo["tbt_p99_ms"]]
        figures += [len(bought), len(dearer)]
    assert said == figures


def test_latency_sentence_matches_the_tables() -> None:
    """The latency counts (priority-0 TTFT p99 and TBT p99 within the scenario's SLO) per policy,
    both suites, as the tables' JSON states them and as recounted from their rows."""
    from fleetloop.sim.suite import latency_counts

    m = re.search(
        r"priority-0 TTFT p99 is within the scenario's SLO on (\d+) of (\d+) shipped pairs under default, "
        r"against (\d+) under classic and (\d+) under modern, and the TBT p99 on (\d+) of (\d+), against "
        r"(\d+) and (\d+); on the stress suite the priority-0 TTFT p99 is within it on (\d+) of (\d+) pairs, "
        r"against (\d+) and (\d+), and the TBT p99 on (\d+) of (\d+), against (\d+) and (\d+)\.",
        _readme(),
    )
    assert m, "README lost the latency sentence"
    said = [int(x) for x in m.groups()]
    figures: list[int] = []
    for name in ("shipped", "stress"):
        data = orjson.loads((ROOT / "bench" / "results" / f"sim-{name}.json").read_bytes())
        counts = {p: latency_counts(data["rows"], p) for p in ("default", "classic", "modern")}
        for p, (a, an, b, bn) in counts.items():
            keys = ("p0_ttft_within_slo", "p0_ttft_pairs", "tbt_within_slo", "tbt_pairs")
            assert {k: data["latency"][p][k] for k in keys} == {
                "p0_ttft_within_slo": a,
                "p0_ttft_pairs": an,
                "tbt_within_slo": b,
                "tbt_pairs": bn,
            }
        d, c, mo = counts["default"], counts["classic"], counts["modern"]
        figures += [d[0], d[1], c[0], mo[0], d[2], d[3], c[2], mo[2]]
    assert said == figures


def _p0_ttft_median_s(rows: list[dict[str, Any]], scenario: str, policy: str) -> float:
    """The latency section's median over seeds of the priority-0 TTFT p99, in seconds."""
    vals = sorted(r["p0_ttft_p99_ms"] for r in rows if r["scenario"] == scenario and r["policy"] == policy)
    return float(vals[len(vals) // 2]) / 1000.0


def test_latency_examples_match_the_tables() -> None:
    text = _readme()
    shipped, stress = _rows("sim-shipped"), _rows("sim-stress")
    m = re.search(
        r"host-loss-mid-decode's is ([0-9.]+) s at p99 \(median over seeds\) against classic's ([0-9.]+) s "
        r"and an SLO of ([0-9.]+) s, overload-mixed-priorities' ([0-9.]+) s against ([0-9.]+) s"
        r"\s+and ([0-9.]+) s",
        text,
    )
    assert m, "README lost the latency examples"
    m2 = re.search(
        r"autonomous-workflows' is ([0-9.]+) s against\s+classic's ([0-9.]+) s and an SLO of ([0-9.]+) s",
        text,
    )
    assert m2, "README lost the prefill-fit example"
    want = []
    for s in ("host-loss-mid-decode", "overload-mixed-priorities", "autonomous-workflows"):
        slo = next(r["slo_ttft_ms"] for r in shipped if r["scenario"] == s) / 1000.0
        want += [_p0_ttft_median_s(shipped, s, "default"), _p0_ttft_median_s(shipped, s, "classic"), slo]
    for said, value in zip(m.groups() + m2.groups(), want, strict=True):
        assert _same(said, value), (said, value)
    # the later first tokens are later, the prefill-fit example earlier, than classic's
    assert want[0] > want[1]
    assert want[3] > want[4]
    assert want[6] < want[7]
    m = re.search(r"Where classic's queues build \(([a-z0-9, -]+)\) default's are earlier", text)
    assert m, "README lost the list of scenarios where default's first tokens come earlier"
    rows = shipped + stress
    for s in m.group(1).split(", "):
        assert _p0_ttft_median_s(rows, s, "default") < _p0_ttft_median_s(rows, s, "classic"), s


def test_caller_view_sentence_matches_the_tables() -> None:
    """The first tokens as callers see them (every priority-0 call once, from its first attempt; a
    call whose task failed is a miss): the share within the SLO over every pair and the pairs where
    at least 99% were, per policy and suite, as the tables' JSON states them and as recounted."""
    from fleetloop.sim.suite import caller_ttft_counts

    m = re.search(
        r"default's priority-0 calls got their first token within the SLO ([0-9.]+)% of the time over "
        r"the shipped pairs, against classic's ([0-9.]+)% and modern's ([0-9.]+)%, and ([0-9.]+)% on the "
        r"stress suite against ([0-9.]+)% and ([0-9.]+)%; at least 99% of them did on (\d+) of (\d+) "
        r"shipped pairs \(classic (\d+), modern (\d+)\) and (\d+) of (\d+) stress pairs \((\d+), (\d+)\)",
        _readme(),
    )
    assert m, "README lost the caller-view sentence"
    shares: list[float] = []
    pairs: list[int] = []
    for name in ("shipped", "stress"):
        data = orjson.loads((ROOT / "bench" / "results" / f"sim-{name}.json").read_bytes())
        counts = {p: caller_ttft_counts(data["rows"], p) for p in ("default", "classic", "modern")}
        for p, (met, n, within, calls) in counts.items():
            got = data["latency"][p]
            assert (got["p0_caller_ttft_pairs_met"], got["p0_caller_ttft_pairs"]) == (met, n)
            assert (got["p0_calls_ttft_within_slo"], got["p0_calls"]) == (within, calls)
            assert n == len({(r["scenario"], r["seed"]) for r in data["rows"]})  # every pair has it
        shares += [100.0 * c[2] / c[3] for c in (counts["default"], counts["classic"], counts["modern"])]
        d, c, mo = counts["default"], counts["classic"], counts["modern"]
        pairs += [d[0], d[1], c[0], mo[0]]
    said = m.groups()
    for s, value in zip(said[:6], shares, strict=True):
        assert abs(float(s) - value) < 0.006, (s, value)  # two decimals
    assert [int(x) for x in said[6:]] == pairs


def test_scenarios_where_callers_see_later_first_tokens_under_default_are_named() -> None:
    """The README names every scenario (both suites) where default's share of priority-0 calls
    with a first token within the SLO, pooled over seeds, is below classic's, with both shares."""
    m = re.search(
        r"Default's share is below classic's on (.+?), where its fleet is smallest .*?, and by less than "
        r"([0-9.]+) points on ([a-z0-9, -]+) and ([a-z0-9-]+)\.",
        _readme(),
    )
    assert m, "README lost the scenarios where default's caller-view share is below classic's"
    named = {
        s: (float(d), float(c))
        for s, d, c in re.findall(r"([a-z0-9-]+) \(([0-9.]+)% against ([0-9.]+)%\)", m.group(1))
    }
    slight, within = {*m.group(3).split(", "), m.group(4)}, float(m.group(2))

    def share(rows: list[dict[str, Any]], scenario: str, policy: str) -> float:
        rs = [r for r in rows if r["scenario"] == scenario and r["policy"] == policy]
        return 100.0 * sum(r["p0_calls_ttft_within_slo"] for r in rs) / sum(r["p0_calls"] for r in rs)

    rows = _rows("sim-shipped") + _rows("sim-stress")
    gap = {s: share(rows, s, "classic") - share(rows, s, "default") for s in {r["scenario"] for r in rows}}
    assert set(named) | slight == {s for s, g in gap.items() if g > 0}
    assert all(gap[s] < within for s in slight)
    assert all(gap[s] >= within for s in named)
    for s, (d, c) in named.items():
        assert abs(d - share(rows, s, "default")) < 0.051, s  # one decimal
        assert abs(c - share(rows, s, "classic")) < 0.051, s


def test_ten_seed_sentence_matches_the_ten_seed_tables() -> None:
    """The shipped table over ten seeds (the committed five plus five more) says what the doc says,
    and the doc names, with the command that makes them, exactly the suite tables that are not
    committed for the current code (whose files are not there)."""
    from fleetloop.bench.results import RESULTS

    text = _readme()
    m = re.search(
        r"sim-shipped-10-seeds\.md`\) (\d+) of (\d+) shipped pairs meet every target, at a geometric mean "
        r"of ([0-9.]+)x",
        text,
    )
    assert m, "the doc lost the ten-seed sentence"
    shipped = _checks("shipped-10-seeds")
    assert {c["seed"] for c in shipped} > {c["seed"] for c in _checks("shipped")}  # more than the five
    assert (int(m.group(1)), int(m.group(2))) == (sum(map(_met, shipped)), len(shipped))
    assert float(m.group(3)) == round(_geomean(shipped), len(m.group(3).split(".")[1]))
    misses = Counter(c["scenario"] for c in shipped if not _met(c))
    said = dict(re.findall(r"`([a-z0-9-]+)` (?:misses )?on (\d+)(?: seeds)?", text[m.end() : m.end() + 200]))
    assert {k: int(v) for k, v in said.items()} == dict(misses)
    m = re.search(
        r"are not committed for the current node model .*?`fleetloop bench results --only ([a-z0-9,-]+)`",
        text,
    )
    assert m, "the doc lost the sentence on the tables not committed"
    missing = set(m.group(1).split(","))
    assert missing == {r.name for r in RESULTS if not r.committed and r.name.startswith("sim-")}
    for r in RESULTS:
        if r.name in missing:
            assert not any((ROOT / "bench" / "results" / f).exists() for f in r.files.values()), r.name
