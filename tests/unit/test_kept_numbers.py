"""The columns the model keeps for the snapshot as it folds.

The telemetry numbers (``_NodeRows``: one ``(fields, rows)`` block, written by the batch fold for
the records it makes a node's newest, checked by identity at each snapshot) are, at every
snapshot, the table's own one pass over its records (:meth:`NodeTable.numbers` of a table built
without them), bit for bit, and absent exactly when that pass cannot read them: on the bench fleet
with nodes arriving, leaving, moving pools and forgotten, with folds one record at a time between
the batches, with hostile values (None, 1e308, -0.0, NaN, integers past 2**53 and past float range,
strings, sequences) and 100k new ids. The columns policies read from the snapshot are the ones read
from fresh tables.

The node windows' bucket arrays (``WindowColumns``) are re-read by the batch folds for the rows
they wrote (``WindowColumns.refresh``), so the snapshot reads no node bucket whole in a daemon's
steady state; ``tests/unit/test_fast_snapshot.py`` holds those snapshots to the plain ones."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np
from fleetloop.bench.fleetgen import BASE_TS_MS, make_fleet, outcomes_at, telemetry_at
from fleetloop.core.model.fleet import FleetModel, ModelConfig, snapshot
from fleetloop.policies.columns import _TEL_NUMBERS, NodeTable
from fleetloop.schemas.fast import OUTCOME_TWIN, TELEMETRY_TWIN
from tests.unit.test_column_read import outcome
from tests.unit.test_fold_batch import tel


def fresh_table(table: NodeTable) -> NodeTable:
    return NodeTable(
        now_ms=table.now_ms,
        stale_after_ms=table.stale_after_ms,
        ids=table.ids,
        tels=table.tels,
        consecutive=table.consecutive,
        totals=table.totals,
        ts=table.ts,
        pool_ids=table.pool_ids,
        bounds=table.bounds,
    )


def assert_kept_as_read(model: FleetModel, now: int) -> NodeTable:
    table = snapshot(model, now).nodes
    assert isinstance(table, NodeTable)
    handed = table._numbers
    plain = fresh_table(table)
    want = plain.numbers()
    if want is None:
        assert handed is None
    else:
        assert isinstance(handed, np.ndarray)
        assert (handed.shape, handed.dtype) == (want.shape, want.dtype)
        assert handed.tobytes() == want.tobytes()
    for name in _TEL_NUMBERS:  # what a policy reads, from the kept block or not
        assert outcome(table.floats, name) == outcome(fresh_table(table).floats, name), name
        assert outcome(table.ints, name) == outcome(fresh_table(table).ints, name), name
    return table


def stale_rows(model: FleetModel) -> list[int]:
    """The rows a snapshot would have to read itself (its newest record is not the one held)."""
    kept = model._snapshots
    assert kept is not None
    assert kept.nodes is not None
    rows = kept.nodes
    return [
        r for r, (a, n) in enumerate(zip(rows.held[:-1], rows.nodes, strict=True)) if a is not n.telemetry
    ]


def test_the_bench_fleet_keeps_its_numbers_through_arrivals_departures_and_moves() -> None:
    fleet = make_fleet(400, degraded_per_1000=40.0)
    model = FleetModel(ModelConfig(forget_node_after_ms=4_000))
    ts = BASE_TS_MS
    read_by_fold = 0
    for k in range(14):
        ts += 1000
        tels = [TELEMETRY_TWIN.of(t) for t in telemetry_at(fleet, ts)]
        if k % 4 == 1:
            tels = tels[: len(tels) // 2]  # half the fleet silent this second
        if k == 6:
            tels[7] = msgspec.structs.replace(tels[7], pool_id="p-moved")
        if k == 9:  # new nodes arrive
            tels += [tel(f"new{i}", "p-new", ts, queue_depth=i) for i in range(30)]
        if k % 3 == 2:  # a few folded one at a time: the snapshot reads those itself
            for t in tels[:5]:
                model.fold_telemetry(t)
            model.fold_telemetries([None, *tels[5:]])
        else:
            model.fold_telemetries(tels)
        model.fold_outcomes([OUTCOME_TWIN.of(o) for o in outcomes_at(fleet, ts, workflow_base=k * 1000)])
        if k > 0 and k % 3 != 2:
            # The batch fold read every row it made newest: the tick reads none.
            assert stale_rows(model) == []
            read_by_fold += 1
        table = assert_kept_as_read(model, ts)
        # Later snapshot (nodes forgotten at this now): the rows still here.
        assert_kept_as_read(model, ts + 4_500)
        if k == 6:
            assert "p-moved" in table.pool_ids
    assert read_by_fold >= 6


def test_hostile_values_in_the_kept_block_read_as_the_plain_pass() -> None:
    hostile: list[dict[str, Any]] = [
        {"ttft_p50_ms": None, "tbt_p99_ms": None},
        {"hbm_free_gib": 1e308, "kv_cache_used_frac": -0.0},
        {"gpu_util_frac": math.nan, "prefix_cache_hit_frac": math.inf},
        {"queue_depth": 2**53 + 1, "queued_prompt_tokens": 10**30},
        {"max_batch_tokens": -(2**63), "gpu_count": True},
    ]
    odd: list[dict[str, Any]] = [
        {"queue_depth": "7"},  # numpy parses it, as the plain read does
        {"hbm_free_gib": 10**400},  # past float range: the pass fails, per column
        {"gpu_count": (1, 2)},  # a sequence: the pass fails, per column
        {"running_requests": "x"},
    ]
    model = FleetModel()
    ts = BASE_TS_MS
    base = [tel(f"n{i}", f"p{i % 3}", ts) for i in range(12)]
    model.fold_telemetries(base)
    assert_kept_as_read(model, ts)
    for k, kw in enumerate(hostile):
        ts += 1000
        model.fold_telemetries([tel(f"n{i}", f"p{i % 3}", ts, **(kw if i == k else {})) for i in range(12)])
        assert stale_rows(model) == []
        assert_kept_as_read(model, ts)
    for k, kw in enumerate(odd):
        ts += 1000
        batch = [tel(f"n{i}", f"p{i % 3}", ts, **(kw if i == k + 1 else {})) for i in range(12)]
        model.fold_telemetries(batch)
        table = assert_kept_as_read(model, ts)
        if k == 0:
            assert table._numbers is not None  # a string numpy reads: kept
        else:
            assert table.numbers() is None  # the odd row is left for the per-column reads
            # Only the odd row is unread: the rest of its batch was read by the fold.
            assert [table.ids[r] for r in stale_rows(model)] == [f"n{k + 1}"]
    # The odd record replaced by a plain one: the block is whole again.
    ts += 1000
    model.fold_telemetries([tel(f"n{i}", f"p{i % 3}", ts) for i in range(12)])
    assert stale_rows(model) == []
    assert isinstance(assert_kept_as_read(model, ts)._numbers, np.ndarray)


def test_a_hundred_thousand_new_ids_keep_the_block_exact() -> None:
    model = FleetModel(ModelConfig(max_nodes=100_000))
    ts = BASE_TS_MS
    for k in range(5):
        ts += 1000
        model.fold_telemetries(
            [tel(f"k{k}-{i}", f"p{i % 200}", ts, queue_depth=i, hbm_free_gib=i / 7) for i in range(20_000)]
        )
        table = snapshot(model, ts).nodes
        assert isinstance(table, NodeTable)
        want = fresh_table(table).numbers()
        assert want is not None
        assert isinstance(table._numbers, np.ndarray)
        assert table._numbers.tobytes() == want.tobytes()
        assert len(table) == 20_000 * (k + 1)


def test_a_snapshot_keeps_its_numbers_while_the_model_folds_on() -> None:
    fleet = make_fleet(200)
    model = FleetModel()
    ts = BASE_TS_MS + 1000
    model.fold_telemetries([TELEMETRY_TWIN.of(t) for t in telemetry_at(fleet, ts)])
    snapshot(model, ts)
    ts += 1000
    model.fold_telemetries([TELEMETRY_TWIN.of(t) for t in telemetry_at(fleet, ts)])
    table = snapshot(model, ts).nodes
    assert isinstance(table, NodeTable)
    before = table.numbers()
    assert before is not None
    held = before.tobytes()
    ts += 1000  # the next second's batch (every node's figures move) folded while policies read
    model.fold_telemetries([tel(t.node_id, t.pool_id, ts, queue_depth=10**6) for t in table.tels])
    assert table.numbers() is before
    assert before.tobytes() == held
    want = fresh_table(table).numbers()
    assert want is not None
    assert before.tobytes() == want.tobytes()


def _count_reads(monkeypatch: Any) -> list[tuple[int, int]]:
    from fleetloop.core.model import windows

    reads: list[tuple[int, int]] = []
    real = windows.WindowColumns._read

    def counted(self: windows.WindowColumns, b: int) -> Any:
        reads.append((self.width, b))
        return real(self, b)

    monkeypatch.setattr(windows.WindowColumns, "_read", counted)
    return reads


def test_the_tick_reads_no_node_bucket_whole_once_the_folds_keep_them(monkeypatch: Any) -> None:
    from tests.oracles.snapshot import snapshot_plain
    from tests.unit.test_fast_snapshot import assert_same

    reads = _count_reads(monkeypatch)
    fleet = make_fleet(300, degraded_per_1000=40.0)  # degraded nodes report errors: telemetry writes
    model = FleetModel()
    ts = BASE_TS_MS
    at_tick: list[int] = []
    for k in range(8):
        ts += 1000
        model.fold_telemetries([TELEMETRY_TWIN.of(t) for t in telemetry_at(fleet, ts)])
        outs = [OUTCOME_TWIN.of(o) for o in outcomes_at(fleet, ts, workflow_base=k * 1000)]
        model.fold_outcomes(outs[: len(outs) // 2])  # two batches a second, as fetches come
        model.fold_outcomes(outs[len(outs) // 2 :])
        reads.clear()
        fast = snapshot(model, ts)
        at_tick.append(sum(1 for width, _ in reads if width == 8))
        assert_same(fast, snapshot_plain(model, ts))
    assert at_tick[0] == 10  # the first snapshot reads its window's buckets
    assert at_tick[2:] == [0] * 6  # then the folds keep them


def test_a_backlog_folded_without_a_tick_keeps_two_new_buckets_at_most() -> None:
    fleet = make_fleet(100, degraded_per_1000=40.0)
    model = FleetModel()
    ts = BASE_TS_MS + 1000
    model.fold_outcomes([OUTCOME_TWIN.of(o) for o in outcomes_at(fleet, ts, workflow_base=0)])
    model.fold_telemetries([TELEMETRY_TWIN.of(t) for t in telemetry_at(fleet, ts)])
    snapshot(model, ts)
    kept = model._snapshots
    assert kept is not None
    assert kept.nodes is not None
    before = len(kept.nodes.windows.cols)
    for k in range(1, 40):  # forty seconds caught up on, no snapshot between
        ts += 1000
        model.fold_telemetries([TELEMETRY_TWIN.of(t) for t in telemetry_at(fleet, ts)])
        model.fold_outcomes([OUTCOME_TWIN.of(o) for o in outcomes_at(fleet, ts, workflow_base=k * 1000)])
    assert len(kept.nodes.windows.cols) <= before + 2
