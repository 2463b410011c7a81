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
    readme = " ".join((ROOT / "README.md").read_text().split())
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
