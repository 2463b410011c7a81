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
    return " ".join((ROOT / "README.md").read_text().split())


def test_stress_suite_sentence_matches_the_table() -> None:
    checks = _checks("stress")
    m = re.search(
        r"sim-stress\.md`, 5 seeds\) (\d+) of the (\d+) \(scenario, seed\) pairs meet every target and "
        r"the geometric mean is ([0-9.]+)x",
        _readme(),
    )
    assert m, "README lost the stress-suite sentence"
    assert (int(m.group(1)), int(m.group(2))) == (sum(map(_met, checks)), len(checks))
    assert float(m.group(3)) == round(_geomean(checks), len(m.group(3).split(".")[1]))
    missing = {c["scenario"] for c in checks if not _met(c)}
    assert missing == {"burst-a100-2x"}  # "the five misses are all burst-a100-2x"


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
