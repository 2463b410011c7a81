"""The README's sentence on which records ``bench decide`` folds quotes the committed results of
session 10's start (bench/results/decide-s10-start-{twin,model}.json, the integrator's runs of
``fleetloop bench decide --nodes 10000 --ticks 20 --json`` with ``--records twin`` and
``--records model``) and the bench's real default: changing either without the other fails here."""

from __future__ import annotations

from pathlib import Path

import orjson
from fleetloop.bench import decide as bench_decide

ROOT = Path(__file__).resolve().parents[2]


def _size(records: str) -> dict[str, float]:
    result = orjson.loads((ROOT / "bench" / "results" / f"decide-s10-start-{records}.json").read_bytes())
    assert result["records"] == records
    (size,) = result["sizes"]
    assert size["nodes"] == 10_000
    out: dict[str, float] = size
    return out


def test_the_readmes_records_sentence_is_the_start_files_and_the_default() -> None:
    readme = " ".join((ROOT / "docs" / "performance.md").read_text().split())
    twin, model = _size("twin"), _size("model")

    def ms(x: float) -> str:
        return f"{int(x + 0.5)}"

    assert (
        f"made the 10,000-node tick {ms(twin['tick_cpu_p50_ms'])} ms of CPU at p50 instead of"
        f" {ms(model['tick_cpu_p50_ms'])} ms, the snapshot {ms(twin['snapshot_cpu_p50_ms'])} ms instead of"
        f" {ms(model['snapshot_cpu_p50_ms'])} and the fold of one second {ms(twin['fold_1s_cpu_p50_ms'])} ms"
        f" instead of {ms(model['fold_1s_cpu_p50_ms'])}"
    ) in readme
    assert (
        "since session 10 `bench decide` folds what the daemon folds by default (`--records twin`" in readme
    )
    assert bench_decide.run_size.__kwdefaults__["records"] == "twin"


def test_the_readmes_session_11_tick_figures_are_the_quiet_files() -> None:
    """Session 11's quiet start and end runs of ``fleetloop bench decide --nodes 10000 --ticks 20
    --json`` (bench/results/decide-s11-{start,end}-quiet.json)."""
    readme = " ".join((ROOT / "docs" / "performance.md").read_text().split())
    sizes = []
    for name in ("start", "end"):
        result = orjson.loads((ROOT / "bench" / "results" / f"decide-s11-{name}-quiet.json").read_bytes())
        assert result["records"] == "twin"
        (size,) = result["sizes"]
        assert size["nodes"] == 10_000
        sizes.append(size)
    start, end = sizes

    def ms(x: float) -> str:
        return f"{int(x + 0.5)}"

    assert (
        f"{ms(start['tick_cpu_p50_ms'])} / {ms(start['tick_cpu_p99_ms'])} ms (p50 / p99)"
        " at the session's start"
        f" to {ms(end['tick_cpu_p50_ms'])} / {ms(end['tick_cpu_p99_ms'])} ms at its end, the snapshot from"
        f" {ms(start['snapshot_cpu_p50_ms'])} to {ms(end['snapshot_cpu_p50_ms'])} ms, the fold of one second"
        f" from {ms(start['fold_1s_cpu_p50_ms'])} to {ms(end['fold_1s_cpu_p50_ms'])} ms"
    ) in readme
    assert f"the tick's {end['decisions_per_tick']:,} decision records" in readme
