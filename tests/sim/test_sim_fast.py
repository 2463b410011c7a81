"""The simulator's twin records equal the statement: ``TWIN.of(Model(**fields))``, value and type,
and a run folding twins decides exactly what a run folding the wire models decides."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np
import pytest
from fleetloop.policies.registry import builtin_policy, load_policy
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.fast import OUTCOME_TWIN, TELEMETRY_TWIN, Twin
from fleetloop.sim.accounting import Accounting, _tbt_bin
from fleetloop.sim.fleet import _OUTCOME_ACCEPTS, _TELEMETRY_ACCEPTS, FleetSim, twin_record
from fleetloop.sim.runner import EPOCH_MS, run
from fleetloop.sim.scenario import Scenario
from fleetloop.sim.table import DEFAULT_POLICY
from pydantic import ValidationError


def _typed(rec: msgspec.Struct) -> list[tuple[str, type, Any]]:
    """Every field with its type: ``1 == 1.0`` must not pass for a float field given an int."""
    out = []
    for name in rec.__struct_fields__:
        v = getattr(rec, name)
        out.append((name, type(v), repr(v)))
    return out


def _same(twin: Twin[Any], accepts: Any, fields: dict[str, Any]) -> None:
    try:
        want = twin.of(twin.model(**fields))
    except ValidationError as exc:
        refused = str(exc)
    else:
        assert _typed(twin_record(twin, accepts, fields)) == _typed(want)
        return
    with pytest.raises(ValidationError) as got:
        twin_record(twin, accepts, fields)
    assert str(got.value) == refused


def _records(scenario: Scenario) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The fields of every record a short run of ``scenario`` emits (no control plane)."""
    sim = FleetSim(scenario, scenario.seed, start_ms=EPOCH_MS)
    tel: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for k in range(1, 91):
        e = sim.advance_to(EPOCH_MS + 1000 * k)
        tel += [t.model_dump() for t in e.telemetry]
        out += [o.model_dump() for o in e.outcomes]
    return tel, out


def test_twin_records_equal_the_statement_on_a_run_and_hostile_values(tiny: Scenario) -> None:
    tel, out = _records(tiny)
    assert len(tel) > 400
    assert len(out) > 200
    for f in tel:
        _same(TELEMETRY_TWIN, _TELEMETRY_ACCEPTS, f)
    for f in out:
        _same(OUTCOME_TWIN, _OUTCOME_ACCEPTS, f)
    # Hostile values: ints for floats, extremes, NaN and infinities, -0.0, far-future times,
    # bad identifiers, inconsistent outcomes, out-of-range numbers.
    t0, o0 = tel[-1], next(o for o in out if o["outcome"] == "ok")
    tel_cases: list[dict[str, Any]] = [
        {"cost_rate_usd_per_h": 4},
        {"hbm_free_gib": 0, "kv_cache_used_frac": 1, "gpu_util_frac": 0},
        {"ttft_p50_ms": 1e308, "ttft_p99_ms": 1e308},
        {"ttft_p50_ms": math.nan},
        {"tbt_p99_ms": math.inf},
        {"hbm_free_gib": -0.0},
        {"kv_cache_used_frac": 1.5},
        {"ts_ms": 2**62},
        {"ts_ms": -1},
        {"node_id": "bad id\n"},
        {"pool_id": ""},
        {"hot_prefixes": ("x1", "bad prefix\n")},
        {"hot_prefixes": ["x1", "x2"]},
        {"queue_depth": -1},
        {"queue_depth": True},
        {"weights_state": "hot"},
    ]
    out_cases: list[dict[str, Any]] = [
        {"cost_usd": 0},
        {"e2e_ms": 1e308, "ttft_ms": -0.0},
        {"e2e_ms": math.nan},
        {"cached_prompt_tokens": o0["prompt_tokens"] + 1},
        {"node_id": None},
        {"request_id": "x" * 10_000},
        {"ts_ms": 2**62},
        {"outcome": "maybe"},
        {"priority": 2**40},
    ]
    for case in tel_cases:
        _same(TELEMETRY_TWIN, _TELEMETRY_ACCEPTS, {**t0, **case})
    for case in out_cases:
        _same(OUTCOME_TWIN, _OUTCOME_ACCEPTS, {**o0, **case})


@pytest.mark.parametrize("policy", ["default", "classic"])
def test_a_run_folding_twins_decides_what_a_run_folding_wire_records_decides(
    tiny: Scenario, policy: str
) -> None:
    compiled = load_policy(DEFAULT_POLICY) if policy == "default" else builtin_policy(policy)
    logs: dict[bool, list[tuple[int, list[Decision]]]] = {True: [], False: []}
    results = {}
    for wire in (True, False):
        log = logs[wire]

        def on_tick(n: int, ds: list[Decision], log: list[tuple[int, list[Decision]]] = log) -> None:
            log.append((n, ds))

        r = run(tiny, compiled, wire_records=wire, on_tick=on_tick)
        data = r.to_json()
        data["sim"].pop("wall_s")
        data["sim"].pop("speedup")
        results[wire] = data
    assert len(logs[True]) > 100
    assert sum(len(ds) for _, ds in logs[True]) > 100
    assert logs[True] == logs[False]
    assert results[True] == results[False]


def test_tbt_histogram_in_a_list_equals_the_numpy_accumulation() -> None:
    """``Accounting.tbt`` adds weights in a list; the statement added them into a float64 array."""
    rng = np.random.default_rng(5)
    acct = Accounting(slo_ttft_ms=1000.0)
    ref = np.zeros(len(acct.tbt_hist), dtype=np.float64)
    for k in range(300):
        ms = rng.lognormal(3.0, 2.0, size=int(rng.integers(0, 40)))
        weights = rng.integers(1, 300, size=len(ms)).astype(float) * rng.random()
        samples = [(float(a), float(b)) for a, b in zip(ms, weights, strict=True)]
        if k % 50 == 7:
            samples += [(1e300, 1e308), (0.0, -0.0), (-1.0, 1.0), (1e-300, 5e-324)]
        acct.tbt(samples)
        with np.errstate(over="ignore"):
            for a, b in samples:
                ref[_tbt_bin(a)] += b
        assert acct.tbt_hist.tobytes() == ref.tobytes()
    assert np.isinf(ref).any()  # the hostile samples reached the histogram
