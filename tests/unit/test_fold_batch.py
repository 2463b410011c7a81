"""The batch folds (``FleetModel.fold_telemetries`` / ``fold_outcomes``, the one implementation) are
the per-record statements (``tests.oracles.fold``: ``fold_telemetry`` / ``fold_outcome``, run by
``fold_plain``) made fast, and nothing else: after the same records the model is the same, byte for
byte (its checkpoint encoding: every window, clock, counter, ledger entry and cap counter), and the
same records come back refused, folded in part or failed, with the same reasons. Checked on the
bench's generated fleet, on hostile sequences (tight caps, 100k new ids, far-future and late event
times, values beyond the schema's bounds that only a forged record can hold: 1e308, NaN, inf,
negative, wrong types) and on generated sequences (Hypothesis)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from fleetloop.bench.fleetgen import make_fleet, outcomes_at, telemetry_at
from fleetloop.core import checkpoint
from fleetloop.core.model.fleet import FleetModel, ModelConfig
from fleetloop.schemas.fast import OUTCOME_TWIN, TELEMETRY_TWIN, OutcomeRec, TelemetryRec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.oracles.fold import fold_plain
from tests.support.records import telemetry_fields

T0 = 1_767_225_600_000
Batch = tuple[str, Sequence[Any]]  # ("telemetry" | "outcome", items)


def _both(batches: Sequence[Batch], config: ModelConfig | None = None) -> tuple[Any, Any]:
    """Fold ``batches`` into two fresh models, one through the batch folds and one through the
    per-record folds; returns ((checkpoint bytes, reasons) of each)."""
    fast, plain = FleetModel(config), FleetModel(config)
    fast_reasons: list[tuple[int, int, str]] = []
    plain_reasons: list[tuple[int, int, str]] = []
    for k, (kind, items) in enumerate(batches):
        outcomes = kind == "outcome"
        got = fast.fold_outcomes(items) if outcomes else fast.fold_telemetries(items)
        want = fold_plain(plain, items, outcomes=outcomes)
        fast_reasons.extend((k, i, why) for i, why in got)
        plain_reasons.extend((k, i, why) for i, why in want)
    return (checkpoint.encode(fast), fast_reasons), (checkpoint.encode(plain), plain_reasons)


def _assert_same(batches: Sequence[Batch], config: ModelConfig | None = None) -> list[tuple[int, int, str]]:
    (fast_state, fast_reasons), (plain_state, plain_reasons) = _both(batches, config)
    assert fast_reasons == plain_reasons
    assert fast_state == plain_state
    return fast_reasons


def tel(node: str, pool: str, ts: int, **kw: Any) -> TelemetryRec:
    fields = telemetry_fields(node, pool, ts, model="m")
    fields.update(kw)
    return TelemetryRec(**fields)  # a struct's constructor does not validate: forged values stay


def out(node: str | None, pool: str, ts: int, n: int, **kw: Any) -> OutcomeRec:
    fields: dict[str, Any] = {
        "ts_ms": ts,
        "request_id": f"r{n}",
        "workflow_id": f"w{n // 3}",
        "step_index": 0,
        "tenant_id": f"t{n % 5}",
        "priority": n % 10,
        "latency_budget_ms": 10_000,
        "pool_id": pool,
        "node_id": node,
        "model": "m",
        "prompt_tokens": 100,
        "output_tokens": 10,
        "ttft_ms": 50.0 + n,
        "e2e_ms": 100.0,
        "outcome": "ok",
        "cost_usd": 0.0013 * (n % 7),
    }
    fields.update(kw)
    return OutcomeRec(**fields)


def test_the_bench_fleet_folds_to_the_same_model() -> None:
    fleet = make_fleet(200)
    batches: list[Batch] = []
    for s in range(20):
        ts = T0 + s * 1000
        batches.append(("telemetry", [TELEMETRY_TWIN.of(t) for t in telemetry_at(fleet, ts)]))
        batches.append(
            ("outcome", [OUTCOME_TWIN.of(o) for o in outcomes_at(fleet, ts, 2.0, workflow_base=s * 2000)])
        )
    assert _assert_same(batches) == []


TIGHT = ModelConfig(
    retention_ms=20_000,
    forget_node_after_ms=5_000,
    finished_workflow_ttl_ms=3_000,
    abandon_workflow_after_ms=4_000,
    min_handoff_ms=1_000,
    max_pools=3,
    max_nodes_per_pool=4,
    max_nodes=9,
    max_tenants=3,
    max_open_workflows=5,
    max_finished_workflows=4,
    max_unplaced_nodes=3,
)


def _hostile() -> list[Batch]:
    """Caps hit, evictions, late and far-future records, values only a forged record holds."""
    batches: list[Batch] = []
    n = 0
    for s in range(30):
        ts = T0 + s * 700
        tels = [
            tel(
                f"n{i}",
                f"p{i % 5}",
                ts + i,
                errors=i % 2,
                timeouts=i % 3,
                prompt_tokens=900 * i,
                output_tokens=7 * i,
            )
            for i in range(12)
        ]
        outs = []
        for i in range(20):
            n += 1
            kind = ("ok", "error", "timeout", "shed", "retry")[n % 5]
            outs.append(
                out(
                    f"n{i % 15}" if kind != "shed" else None,
                    f"p{i % 6}",
                    ts + (i * 37) % 900 - 450,  # out of order within the batch
                    n,
                    outcome=kind,
                    attempt=n % 3,
                    ttft_ms=None if kind != "ok" else 10.0 * (n % 40),
                    task_outcome=(None, "succeeded", "failed")[n % 3] if n % 4 == 0 else None,
                    workflow_spend_usd=0.01 * n,
                    routed_from=(None, None, f"p{(i + 1) % 6}", f"p{i % 6}", "nosuch")[n % 5],
                )
            )
        batches.append(("telemetry", tels))
        batches.append(("outcome", outs))
    hostile_t = [
        tel("n1", "p1", T0 - 3_600_000),  # an hour late
        tel("inf", "p0", T0 + 30_000, cost_rate_usd_per_h=1e308, interval_ms=600_000),
        tel("nan", "p0", T0 + 30_001, cost_rate_usd_per_h=math.nan),
        tel("neg", "p0", T0 + 30_002, cost_rate_usd_per_h=-5.0, errors=-3),
        tel("inf2", "p2", T0 + 30_003, cost_rate_usd_per_h=math.inf),
        tel("badts", "p0", "soon"),  # wrong type: the fold raises
        tel("badcost", "p1", T0 + 30_004, cost_rate_usd_per_h="1.0"),
        tel("huge", "p1", T0 + 30_005, prompt_tokens=10**12, output_tokens=10**12),  # the schema's bound
        None,  # a row the door refused: skipped
    ]
    hostile_o = [
        out("n1", "p0", T0 + 30_010, 10_001, cost_usd=1e308, task_outcome="failed", workflow_spend_usd=1e308),
        out(
            "n1",
            "p0",
            T0 + 30_011,
            10_004,
            cost_usd=math.nan,
            task_outcome="failed",
            workflow_spend_usd=math.nan,
        ),
        out("n1", "p0", T0 + 30_012, 10_007, cost_usd=math.inf, ttft_ms=math.inf),
        out("n1", "p0", T0 + 30_013, 10_010, ttft_ms=math.nan, priority=99),
        out("n1", "p0", T0 + 30_014, 10_013, ttft_ms=-1.0, priority=-4, prompt_tokens=10**30),
        out("n1", "p1", T0 - 3_600_000, 10_019),  # late
        out("n1", "p0", T0 + 30_015, 10_022, priority="3"),  # wrong type: raises mid-record
        out("n1", "p0", T0 + 30_016, 10_025, attempt=None),  # wrong type: raises after the ledger
        None,
        *(out(f"unplaced{i}", f"p{i % 3}", T0 + 30_020 + i, 10_030 + i) for i in range(40)),
        # -0.0 (the schema accepts it) then a call without a TTFT in the same second: the sum's sign.
        out("n2", "p0", T0 + 30_100, 10_100, ttft_ms=-0.0),
        out("n2", "p0", T0 + 30_101, 10_101, outcome="error", ttft_ms=None),
        # One task's calls exactly at and just past the handoff-gap buckets' edges.
        *(
            out("n2", "p0", T0 + 30_200 + at, 10_200 + k, workflow_id="w-edges")
            for k, at in enumerate((0, 1_000, 3_000, 3_001, 8_001, 18_001, 18_002))
        ),
    ]
    batches += [("telemetry", hostile_t), ("outcome", hostile_o)]
    # The schema's last millisecond: a far-future clock for one pool, then records behind it.
    # Calls moved from a pool (routed_from): far ahead of its clock, an hour late, an unknown pool,
    # the serving pool itself, a wrong type.
    batches += [
        (
            "outcome",
            [
                out("n1", "p0", T0 + 31_000, 10_400, routed_from="p2"),
                out("n1", "p0", T0 + 31_001, 10_401, routed_from="p2", prompt_tokens=10**30),
                out("n1", "p0", T0 + 31_002, 10_402, routed_from="p0"),
                out("n1", "p0", T0 + 31_003, 10_403, routed_from="new-pool"),
                out("n1", "p0", T0 + 31_004, 10_404, routed_from=5),
                out(None, "p0", T0 + 31_005, 10_405, routed_from="p2", outcome="shed"),
                out("n1", "p3", T0 + 10_000_000, 10_406, routed_from="p2"),
                out("n1", "p3", T0 + 10_000_001, 10_407, routed_from="p4"),
                out("n1", "p0", T0 - 3_600_000, 10_408, routed_from="p2"),
            ],
        )
    ]
    batches += [
        ("telemetry", [tel("far", "p1", 4_102_444_800_000), tel("n1", "p1", T0 + 50_000)]),
        ("outcome", [out("n1", "p1", 4_102_444_800_000, 10_300), out("n1", "p1", T0 + 50_000, 10_301)]),
    ]
    # 100k new ids: pools, nodes, tenants, workflows and unplaced nodes, far beyond every cap.
    many_t = [tel(f"x{i}", f"xp{i % 997}", T0 + 40_000 + i // 10) for i in range(20_000)]
    many_o = [
        out(f"u{i}", f"xp{i % 997}" if i % 2 else "p0", T0 + 40_000 + i // 50, 20_000 + i, tenant_id=f"tt{i}")
        for i in range(80_000)
    ]
    return [*batches, ("telemetry", many_t), ("outcome", many_o)]


def test_hostile_sequences_fold_to_the_same_model_with_the_same_reasons() -> None:
    reasons = _assert_same(_hostile(), TIGHT)
    kinds = {why.split(":")[0] for _, _, why in reasons}
    # The sequence reaches every refusal, partial cap and failure the fold has.
    assert kinds == {
        "capacity-pools",
        "capacity-nodes",
        "capacity-tenants",
        "capacity-unplaced-nodes",
        "fold-error",
    }


def test_the_default_caps_with_the_hostile_sequence() -> None:
    _assert_same(_hostile())


_ids = st.integers(0, 7)


@st.composite
def _sequences(draw: st.DrawFn) -> list[Batch]:
    batches: list[Batch] = []
    n = 0
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(("telemetry", "outcome")))
        items: list[Any] = []
        for _ in range(draw(st.integers(0, 25))):
            n += 1
            ts = T0 + draw(st.integers(-30_000, 60_000))
            pool, node = f"p{draw(_ids)}", f"n{draw(_ids)}"
            if kind == "telemetry":
                items.append(
                    tel(
                        node,
                        pool,
                        ts,
                        errors=draw(st.integers(0, 2)),
                        prompt_tokens=draw(st.sampled_from((0, 0, 7_000, 10**12))),
                        output_tokens=draw(st.sampled_from((0, 0, 80, 10**12))),
                        cost_rate_usd_per_h=draw(st.sampled_from((0.0, 1.5, 1e308, math.nan, -1.0))),
                    )
                )
            else:
                outcome = draw(st.sampled_from(("ok", "error", "timeout", "shed", "retry")))
                items.append(
                    out(
                        None if draw(st.booleans()) and outcome == "shed" else node,
                        pool,
                        ts,
                        n,
                        workflow_id=f"w{draw(_ids)}",
                        tenant_id=f"t{draw(_ids)}",
                        priority=draw(st.integers(0, 9)),
                        attempt=draw(st.integers(0, 2)),
                        outcome=outcome,
                        ttft_ms=draw(
                            st.one_of(st.none(), st.just(-0.0), st.floats(0.0, 1e6, allow_nan=False))
                        ),
                        cost_usd=draw(st.sampled_from((0.0, 0.0021, 3.5, 1e308, math.nan))),
                        task_outcome=draw(st.sampled_from((None, None, "succeeded", "failed"))),
                        routed_from=draw(st.sampled_from((None, None, f"p{draw(_ids)}", "zz"))),
                    )
                )
        batches.append((kind, items))
    return batches


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_sequences(), st.sampled_from((TIGHT, ModelConfig())))
def test_generated_sequences_fold_to_the_same_model(batches: list[Batch], config: ModelConfig) -> None:
    _assert_same(batches, config)


def test_a_record_whose_fold_raises_fails_alone_and_the_batch_goes_on() -> None:
    items = [tel("a", "p", T0), tel("b", "p", T0 + 1, cost_rate_usd_per_h="x"), tel("c", "p", T0 + 2)]
    model = FleetModel()
    reasons = model.fold_telemetries(items)
    assert [(i, why.split(":")[:2]) for i, why in reasons] == [(1, ["fold-error", " TypeError"])]
    assert sorted(model.nodes) == ["a", "c"]


def _folds() -> dict[str, Callable[[FleetModel, Sequence[Any]], list[tuple[int, str]]]]:
    return {"telemetry": FleetModel.fold_telemetries, "outcome": FleetModel.fold_outcomes}


def test_an_empty_batch_changes_nothing() -> None:
    model = FleetModel()
    before = checkpoint.encode(model)
    for fold in _folds().values():
        assert fold(model, []) == []
        assert fold(model, [None, None]) == []
    assert checkpoint.encode(model) == before


def test_a_ledger_held_as_an_ordered_dict_is_the_plain_dict_to_every_reader(monkeypatch: Any) -> None:
    """Past half its cap the ledger's dicts become ``OrderedDict``s (an O(1) front for the cap's
    "let go of the earliest"): the same entries in the same order, so the same state, bytes and
    reasons as a model that keeps plain dicts; a checkpoint restores plain dicts, and a model
    folding on from one ends where the continuous one does."""
    from collections import OrderedDict

    batches = _hostile()
    half = len(batches) // 2
    held = FleetModel(TIGHT)
    held_reasons = [held.fold_outcomes(b) if k == "outcome" else held.fold_telemetries(b) for k, b in batches]
    assert type(held.ledger.active) is OrderedDict
    assert type(held.ledger.finished) is OrderedDict
    with monkeypatch.context() as m:
        m.setattr(FleetModel, "_ledger_fifo", lambda self: None)
        plain = FleetModel(TIGHT)
        plain_reasons = [
            plain.fold_outcomes(b) if k == "outcome" else plain.fold_telemetries(b) for k, b in batches
        ]
        assert type(plain.ledger.active) is dict
    assert held_reasons == plain_reasons
    assert checkpoint.encode(held) == checkpoint.encode(plain)
    # Restored halfway (plain dicts again), then folded on: the continuous model's bytes.
    first = FleetModel(TIGHT)
    for k, b in batches[:half]:
        first.fold_outcomes(b) if k == "outcome" else first.fold_telemetries(b)
    restored = checkpoint.decode(checkpoint.encode(first))
    assert type(restored.ledger.active) is dict
    for k, b in batches[half:]:
        restored.fold_outcomes(b) if k == "outcome" else restored.fold_telemetries(b)
    assert checkpoint.encode(restored) == checkpoint.encode(held)
