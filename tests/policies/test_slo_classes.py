"""SLO classes (spec.slo): one source of truth, resolved per call and judged on the calls served."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleetloop.core.model import FleetModel, apply
from fleetloop.core.model import snapshot as model_snapshot
from fleetloop.policies.prefill import prefill_ms
from fleetloop.policies.registry import PolicyError, builtin_policy, compile_policy, parse_document
from fleetloop.policies.slo import Slo, SloBook
from fleetloop.schemas.policy import SloSpec
from pydantic import ValidationError
from tests.policies.snapshots import ctx, node, snapshot
from tests.support.records import outcome, telemetry

BOOK = SloBook.from_spec(
    SloSpec.model_validate(
        {
            "default": {"ttft_ms": 2000, "tbt_ms": 100},
            "classes": [
                {"priority": 0, "ttft_ms": 1500, "tbt_ms": 80},
                {"priority": 2, "ttft_ms": 5000, "tbt_ms": 150},
                {"priority": 2, "model": "llama-70b", "ttft_ms": 8000, "tbt_ms": 200},
                {"priority": 0, "pool": "docs", "ttft_ms": 6000, "tbt_ms": 90},
            ],
        }
    )
)


@pytest.mark.parametrize(
    ("priority", "model", "pool", "expected"),
    [
        (0, "llama-8b", "chat", Slo(1500, 80)),  # the class
        (0, "llama-8b", "docs", Slo(6000, 90)),  # pool-specific beats the class
        (2, "llama-70b", "big", Slo(8000, 200)),  # model-specific beats the class
        (2, "llama-8b", "chat", Slo(5000, 150)),
        (1, "llama-8b", "chat", Slo(2000, 100)),  # no class: the default
        (9, "", "", Slo(2000, 100)),
    ],
)
def test_resolution_most_specific_first(priority: int, model: str, pool: str, expected: Slo) -> None:
    assert BOOK.target(priority, model=model, pool=pool) == expected


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        ({2: 500}, Slo(5000, 150)),  # only best-effort calls: judged by the best-effort SLO
        ({0: 1, 2: 500}, Slo(1500, 80)),  # one interactive call shares the batch: its SLO binds
        ({1: 10, 2: 10}, Slo(2000, 100)),
        ({2: 0}, Slo(1500, 80)),  # nothing served: the strictest class that could come
        ({}, Slo(1500, 80)),
    ],
)
def test_a_pool_is_judged_by_the_strictest_class_it_served(served: dict[int, int], expected: Slo) -> None:
    assert BOOK.served(served, model="llama-8b", pool="chat") == expected


def test_context_reads_the_pool_served_classes() -> None:
    snap = snapshot([node("a")], pool_fields={"p": {"requests_by_priority_w": {2: 40}}})
    assert ctx(snap, slo=BOOK).pool_slo(snap) == Slo(5000, 150)
    mixed = snapshot([node("a")], pool_fields={"p": {"requests_by_priority_w": {0: 1, 2: 40}}})
    assert ctx(mixed, slo=BOOK).pool_slo(mixed) == Slo(1500, 80)


def test_spec_refuses_duplicates_and_model_with_pool() -> None:
    with pytest.raises(ValidationError, match="given twice"):
        SloSpec.model_validate({"classes": [{"priority": 0, "ttft_ms": 1000, "tbt_ms": 50}] * 2})
    with pytest.raises(ValidationError, match="not both"):
        SloSpec.model_validate(
            {"classes": [{"priority": 0, "model": "m", "pool": "p", "ttft_ms": 1000, "tbt_ms": 50}]}
        )
    with pytest.raises(ValidationError):
        SloSpec.model_validate({"classes": [{"priority": 0, "ttft_ms": 1, "tbt_ms": 50}]})  # below 50 ms


def _doc(section: str, params: dict[str, object]) -> dict[str, object]:
    doc: dict[str, dict[str, dict[str, object]]] = builtin_policy().document.model_dump(mode="json")
    doc["spec"][section] = {"type": doc["spec"][section]["type"], "params": params}
    return doc


@pytest.mark.parametrize(
    ("section", "params"),
    [
        ("admission", {"ttft_slo_ms": 1500}),
        ("batching", {"tbt_slo_ms": 80}),
        ("autoscale", {"ttft_ms": 2000}),
        ("autoscale", {"tbt_ms": 100}),
        ("breaker", {"tbt_floor_ms": 10}),
    ],
)
def test_no_algorithm_carries_its_own_slo(section: str, params: dict[str, object]) -> None:
    with pytest.raises(PolicyError, match=r"extra|not permitted|unknown"):
        compile_policy(parse_document(_doc(section, params)))


def test_default_policy_states_its_slo_classes_once() -> None:
    policy = builtin_policy()
    assert policy.slo.target(0) == Slo(2000, 100)
    assert policy.slo.target(2) == Slo(5000, 150)
    text = (Path(__file__).resolve().parents[2] / "fleetloop" / "policies" / "default.yaml").read_text()
    assert text.count("ttft_ms") == 4  # the default and three classes, nowhere else


def test_prefill_floor_from_prompt_size_and_gpu_speed() -> None:
    # 30k tokens of llama-70b on four H100s at half of peak: 2*70.6e9*3e4 + 2*80*8192*9e8 FLOP.
    ms = prefill_ms("llama-70b", "H100", 4, 30_000)
    assert ms is not None
    assert 2600 < ms < 2900  # 5.41e15 FLOP at 1.98e15 FLOP/s
    assert prefill_ms("llama-70b", "A100", 4, 30_000) == pytest.approx(ms * 989 / 312)  # 3x slower GPU
    assert prefill_ms("llama-8b", "H100", 1, 0) == 0.0
    assert prefill_ms("llama-8b", "B200", 1, 1000) is None  # unknown GPU: no guess
    assert prefill_ms("mystery", "H100", 1, 1000) is None


def test_model_counts_the_classes_a_pool_served_not_those_it_shed() -> None:
    t0 = 1_700_000_000_000
    model = apply(
        FleetModel(),
        [
            telemetry("a", ts_ms=t0),
            outcome("a", "ok", ts_ms=t0 + 100, n=1, priority=0),
            outcome("a", "ok", ts_ms=t0 + 200, n=2, priority=2),
            outcome("a", "timeout", ts_ms=t0 + 300, n=3, priority=2),
            outcome("a", "shed", ts_ms=t0 + 400, n=4, priority=1),
        ],
    )
    pool = model_snapshot(model, t0 + 1_000, window_ms=10_000).pools["p"]
    assert pool.requests_by_priority_w == {0: 1, 2: 2}
