"""The ledger's let-go pass the fold runs (``FleetModel._let_go_workflows``: one pass over each
dict) is its statement (``tests.oracles.ledger.let_go_workflows_plain``: the front read with
``next(iter(d))`` once per entry that leaves) made fast, and nothing else: after the same pass, or
the same records folded, the model is the same byte for byte (its checkpoint encoding: the open and
finished tasks in the same order, every pool's task counts, the handed-off and evicted counters).
Checked on generated ledgers (every task older than the horizon included, where the statement's loop
wraps round to the entries it moved), on the bench's fleet, on the hostile sequences of
``test_fold_batch`` (tight caps, 100k new ids, far-future and late event times, 1e308, NaN, -0.0)
and at the cost the fast form is for."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

from fleetloop import clock
from fleetloop.bench.fleetgen import make_fleet, outcomes_at, telemetry_at
from fleetloop.core import checkpoint
from fleetloop.core.model.fleet import GAP_EDGES_MS, FleetModel, ModelConfig, _Pool, _Workflow
from fleetloop.schemas.fast import OUTCOME_TWIN, TELEMETRY_TWIN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.oracles.ledger import let_go_workflows_plain
from tests.unit.test_fold_batch import TIGHT, Batch, _hostile, out

T0 = 1_767_225_600_000
NO_GAPS = [0] * (len(GAP_EDGES_MS) + 1)  # nothing learned: the horizon is abandon_workflow_after_ms


@contextmanager
def _plain_let_go() -> Iterator[None]:
    """Every fold in the block runs the statement instead of the fast pass."""
    fast = FleetModel._let_go_workflows
    FleetModel._let_go_workflows = let_go_workflows_plain  # type: ignore[method-assign]
    try:
        yield
    finally:
        FleetModel._let_go_workflows = fast  # type: ignore[method-assign]


def _fold(batches: Sequence[Batch], config: ModelConfig | None) -> bytes:
    model = FleetModel(config)
    for kind, items in batches:
        if kind == "outcome":
            model.fold_outcomes(items)
        else:
            model.fold_telemetries(items)
    return checkpoint.encode(model)


def _assert_folds_same(batches: Sequence[Batch], config: ModelConfig | None = None) -> None:
    fast = _fold(batches, config)
    with _plain_let_go():
        plain = _fold(batches, config)
    assert fast == plain


def test_the_bench_fleet_folds_to_the_same_ledger() -> None:
    fleet = make_fleet(200)
    config = ModelConfig(
        abandon_workflow_after_ms=20_000, min_handoff_ms=2_000, finished_workflow_ttl_ms=5_000
    )
    batches: list[Batch] = []
    for s in range(40):
        ts = T0 + s * 1000
        batches.append(("telemetry", [TELEMETRY_TWIN.of(t) for t in telemetry_at(fleet, ts)]))
        outs = outcomes_at(fleet, ts, 2.0, workflow_base=(s % 7) * 300)  # tasks that call again
        batches.append(("outcome", [OUTCOME_TWIN.of(o) for o in outs]))
    _assert_folds_same(batches, config)


def test_the_hostile_sequences_fold_to_the_same_ledger() -> None:
    batches = _hostile()
    # Tasks quiet, still calling and finishing across a far-future outcome clock, ids reused.
    tail = [
        out("n1", f"p{i % 3}", T0 + 60_000 + 400 * i, 30_000 + i, workflow_id=f"q{i % 9}",
            task_outcome="succeeded" if i % 11 == 0 else None)
        for i in range(300)
    ]  # fmt: skip
    far = [out("n1", f"p{i}", 4_102_444_800_000, 31_000 + i) for i in range(3)]
    batches += [("outcome", tail), ("outcome", far), ("outcome", tail)]
    _assert_folds_same(batches, TIGHT)
    _assert_folds_same(batches)


def _ledger_model(
    entries: list[tuple[int, int, int]], finished: list[int], gaps: list[int], config: ModelConfig
) -> FleetModel:
    """A model whose ledger holds ``entries`` open ((first_ms, last_ms, pools bitmask) each, in
    that order) and ``finished`` finished tasks (finish ts each), with three pools."""
    model = FleetModel(config)
    for p in range(3):
        model.pools[f"p{p}"] = _Pool()
    for k, (first, last, mask) in enumerate(entries):
        pools = tuple(f"p{p}" for p in range(3) if mask >> p & 1)
        model.ledger.active[f"w{k}"] = _Workflow("t", 0, first, last, pools=pools)
        for p in pools:
            model.pools[p].wf_open += 1
    for k, ts in enumerate(finished):
        model.ledger.finished[f"f{k}"] = ts
    model.ledger.gaps = list(gaps)
    return model


_times = st.integers(T0 - 400_000, T0 + 10_000)


@st.composite
def _ledgers(draw: st.DrawFn) -> tuple[list[tuple[int, int, int]], list[int], list[int], int]:
    entries = []
    for _ in range(draw(st.integers(0, 40))):
        first = draw(_times)
        last = first + draw(st.integers(-5_000, 400_000))  # last before first: a skewed record
        entries.append((first, last, draw(st.integers(0, 7))))
    if draw(st.booleans()):  # every task older than the horizon: the statement wraps round
        entries = [(T0 - 500_000, last, mask) for _, last, mask in entries]
    finished = sorted(draw(st.lists(_times, max_size=20)))
    if draw(st.booleans()):
        finished = draw(st.lists(_times, max_size=20))  # out of order, as skewed finishes are
    gaps = [0] * (len(GAP_EDGES_MS) + 1)
    if draw(st.booleans()):
        gaps[draw(st.integers(0, len(gaps) - 1))] = 2_000  # a learned horizon, not the ceiling
    now = draw(st.sampled_from((T0, T0 + 300_000, T0 - 2**40, 4_102_444_800_000)))
    return entries, finished, gaps, now


@settings(max_examples=600, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_ledgers(), st.sampled_from((TIGHT, ModelConfig())))
def test_generated_ledgers_let_go_the_same(drawn: Any, config: ModelConfig) -> None:
    entries, finished, gaps, now = drawn
    fast = _ledger_model(entries, finished, gaps, config)
    plain = copy.deepcopy(fast)
    fast._let_go_workflows(now)
    let_go_workflows_plain(plain, now)
    assert list(fast.ledger.active) == list(plain.ledger.active)
    assert checkpoint.encode(fast) == checkpoint.encode(plain)


def test_tasks_and_finishes_at_the_horizons_edges_leave_as_the_statement_says() -> None:
    """Every order of open tasks opened and last calling 1 ms inside, at and 1 ms past the horizon,
    and finishes at and around the ttl: an edge read as ``>=`` instead of ``>`` shows here."""
    config = ModelConfig(abandon_workflow_after_ms=30_000, finished_workflow_ttl_ms=20_000)
    now = T0 + 100_000
    edges = (-1, 0, 1)
    kinds = [(now - 30_000 + a, now - 30_000 + b) for a in edges for b in edges if b >= a]
    finishes = [now - 20_000 + d for d in (1, 0, -1, -1, 0, 1)]
    for shift in range(len(kinds)):
        order = kinds[shift:] + kinds[:shift]
        entries = [(first, last, k % 8) for k, (first, last) in enumerate(order)]
        for cut in range(len(finishes) + 1):
            done = finishes[cut:] + finishes[:cut]
            fast = _ledger_model(entries, done, NO_GAPS, config)
            plain = _ledger_model(entries, done, NO_GAPS, config)
            fast._let_go_workflows(now)
            let_go_workflows_plain(plain, now)
            assert checkpoint.encode(fast) == checkpoint.encode(plain)


def test_every_task_older_than_the_horizon_some_quiet_wraps_round_as_the_statement_does() -> None:
    """All open tasks opened before the horizon, every third one quiet: the statement moves the
    others to the back, reaches them again with moves left (one per task let go) and moves them
    again; the fast pass hands that state to the statement's loop with the same moves left."""
    config = ModelConfig(abandon_workflow_after_ms=10_000)
    now = T0 + 100_000
    entries = [(T0, now - (20_000 if k % 3 == 0 else 1_000), k % 8) for k in range(10)]
    fast = _ledger_model(entries, [], NO_GAPS, config)
    plain = copy.deepcopy(fast)
    fast._let_go_workflows(now)
    let_go_workflows_plain(plain, now)
    assert list(plain.ledger.active) == ["w7", "w8", "w1", "w2", "w4", "w5"]  # 4 moves left: 4 moved again
    assert list(fast.ledger.active) == list(plain.ledger.active)
    assert checkpoint.encode(fast) == checkpoint.encode(plain)


def test_a_pass_costs_what_leaves_not_the_holes_earlier_passes_left() -> None:
    """30,000 open tasks, let go 200 at a time from the front: the statement's passes step over
    every hole the earlier ones left (quadratic), the fast ones read each hole once per pass. The
    fast passes take under a third of the statement's CPU (about a fifteenth measured)."""
    config = ModelConfig(abandon_workflow_after_ms=1_000)
    entries = [(T0 + k, T0 + k, 1) for k in range(30_000)]
    spent = []
    for plain in (False, True):
        model = _ledger_model(entries, [], NO_GAPS, config)
        run = partial(let_go_workflows_plain, model) if plain else model._let_go_workflows
        c0 = clock.cpu_s()
        for step in range(1, 101):
            run(T0 + 1_000 + 200 * step)
        spent.append(clock.cpu_s() - c0)
        assert len(model.ledger.active) == 30_000 - 100 * 200
    assert spent[0] < spent[1] / 3, spent
