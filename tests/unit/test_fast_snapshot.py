"""The columnar snapshot (:func:`fleetloop.core.model.snapshot.snapshot`: a ``NodeTable`` of rows,
every window summed for all nodes and pools at once, bucket arrays kept between snapshots) equals
the plain one (``tests.oracles.snapshot.snapshot_plain``: a view per node, each window summed on its
own), bit for bit: every view's every field (value, type, float bits), every pool, tenant and the
ledger, the iteration order, and the columns policies read. Snapshots are taken between folds, so
the kept bucket arrays are exercised the way a daemon does: buckets written again after they were
read, late records, records going back in time, evictions, nodes leaving, coming back and moving
pools, a checkpoint restore."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import tests.support.perturbed as perturbed
from fleetloop.core import checkpoint
from fleetloop.core.model import fleet as fm
from fleetloop.core.model.fleet import FleetModel, ModelConfig, snapshot
from fleetloop.policies.base import FleetSnapshot, NodeView
from fleetloop.policies.columns import FleetColumns, NodeTable, fleet_columns
from hypothesis import HealthCheck, given, settings
from tests.oracles.snapshot import snapshot_plain
from tests.unit.test_fold_batch import T0, TIGHT, Batch, _hostile, _sequences, out, tel
from tests.unit.test_kept_numbers import fresh_table

TEXT_FIELDS = {"node_id", "pool_id", "model", "gpu_type", "weights_state", "hot_prefixes", "engine"}
NUMERIC = [f.name for f in dataclasses.fields(NodeView) if f.name not in TEXT_FIELDS]
FLOAT_TYPED = {f.name for f in dataclasses.fields(NodeView) if "float" in str(f.type)}


def _bits(v: Any) -> Any:
    if isinstance(v, float):
        return ("float", v.hex())
    if isinstance(v, dict):
        return {k: _bits(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return tuple(_bits(x) for x in v)
    return (type(v).__name__, v)


def _fields(obj: Any) -> list[tuple[str, Any]]:
    return [(f.name, _bits(getattr(obj, f.name))) for f in dataclasses.fields(obj)]


def _as_dict_snapshot(snap: FleetSnapshot) -> FleetSnapshot:
    return FleetSnapshot(snap.now_ms, snap.window_ms, dict(snap.nodes), snap.pools, snap.tenants, snap.ledger)


def assert_same(fast: FleetSnapshot, plain: FleetSnapshot) -> None:
    """Everything a policy can read of the two snapshots is the same, bit for bit."""
    assert isinstance(fast.nodes, NodeTable)
    assert (fast.now_ms, fast.window_ms) == (plain.now_ms, plain.window_ms)
    assert list(fast.nodes) == list(plain.nodes)  # node-id order
    assert len(fast.nodes) == len(plain.nodes)
    for node_id, view in plain.nodes.items():
        assert node_id in fast.nodes
        assert _fields(fast.nodes[node_id]) == _fields(view), node_id
    assert "no-such-node" not in fast.nodes
    assert fast.nodes.get("no-such-node") is None
    nan = any(v != v for n in plain.nodes.values() for v in (n.ttft_mean_ms_w,))  # forged NaN figures
    assert nan or fast.nodes == plain.nodes
    assert list(fast.pools) == list(plain.pools)
    for pool_id, pool in plain.pools.items():
        assert _fields(fast.pools[pool_id]) == _fields(pool), pool_id
        assert [_fields(v) for v in fast.pool_nodes(pool_id)] == [
            _fields(v) for v in plain.pool_nodes(pool_id)
        ]
    assert [_fields(t) for t in fast.tenants.values()] == [_fields(t) for t in plain.tenants.values()]
    assert _fields(fast.ledger) == _fields(plain.ledger)
    # The numbers the model kept as it folded (handed to the table) are the table's own one pass
    # over its records, bit for bit, and absent exactly when that pass cannot read them.
    _assert_numbers_as_read(fast.nodes)
    # The columns read from the table equal the columns read from the views.
    got, want = fleet_columns(fast), fleet_columns(_as_dict_snapshot(plain))
    assert got.table is fast.nodes
    assert want.table is None
    assert (got.pool_ids, dict(got.bounds)) == (want.pool_ids, dict(want.bounds))
    assert got.pool_of.tolist() == want.pool_of.tolist()
    assert got.starts.tolist() == want.starts.tolist()
    for name in NUMERIC:
        assert [x.hex() for x in got.floats(name).tolist()] == [
            x.hex() for x in want.floats(name).tolist()
        ], name
        if name not in FLOAT_TYPED:
            assert got.ints(name).tolist() == want.ints(name).tolist(), name
    for flag in ("warm", "stale", "draining"):
        assert getattr(got, flag).tolist() == getattr(want, flag).tolist(), flag
    assert [_fields(v) for v in got.nodes] == [_fields(v) for v in want.nodes]  # built on first use
    assert nan or got.nodes == want.nodes
    for pool_id, (a, b) in got.bounds.items():
        assert [_fields(v) for v in got.nodes[a:b]] == [_fields(v) for v in plain.pool_nodes(pool_id)]
        assert nan or got.nodes[a:b] == want.nodes[a:b] == plain.pool_nodes(pool_id)


def _assert_numbers_as_read(table: NodeTable) -> None:
    handed = table._numbers
    fresh = fresh_table(table).numbers()
    if fresh is None:
        assert handed is None or handed is False
        return
    assert isinstance(handed, np.ndarray)
    assert handed.shape == fresh.shape
    assert handed.dtype == fresh.dtype
    assert handed.tobytes() == fresh.tobytes()


def _pairs(model: FleetModel, now: int, **kw: Any) -> None:
    assert_same(snapshot(model, now, **kw), snapshot_plain(model, now, **kw))


# -- the perturbed fleet: nodes cold, draining, silent, forgotten, back; a pool silent, one late --


@pytest.fixture(scope="module")
def perturbed_pairs() -> list[tuple[FleetSnapshot, FleetSnapshot]]:
    """Every snapshot the perturbed fleet takes, with the plain one of the same model and now, and
    between them snapshots at other times and windows (which the kept bucket arrays must survive)."""
    pairs: list[tuple[FleetSnapshot, FleetSnapshot]] = []
    real = perturbed.snapshot

    def both(model: FleetModel, now: int, **kw: Any) -> FleetSnapshot:
        fast = real(model, now, **kw)
        pairs.append((fast, snapshot_plain(model, now, **kw)))
        k = len(pairs)
        other = {"window_ms": (1_000, 300_000, 4_500)[k % 3], "stale_after_ms": 1_000}
        at = now + (-4_000, 7_000, 2_500, -60_000)[k % 4]  # back in time, forgotten nodes, ahead
        pairs.append((real(model, at, **other), snapshot_plain(model, at, **other)))
        return fast

    perturbed.snapshot = both  # type: ignore[assignment]
    try:
        for _ in perturbed.perturbed_snapshots(320, 40):
            pass
    finally:
        perturbed.snapshot = real  # type: ignore[assignment]
    return pairs


def test_the_perturbed_fleets_snapshots_equal_the_plain_ones(
    perturbed_pairs: list[tuple[FleetSnapshot, FleetSnapshot]],
) -> None:
    forgotten = stale = moved_window = 0
    for fast, plain in perturbed_pairs:
        assert_same(fast, plain)
        stale += sum(n.stale for n in plain.nodes.values())
        forgotten += len(plain.nodes) < 320
        moved_window += plain.window_ms != 10_000
    # The run went through what it is meant to: stale and forgotten nodes, other windows.
    assert stale > 0
    assert forgotten > 10
    assert moved_window > 10


def test_views_are_built_only_when_asked_for_and_kept() -> None:
    from fleetloop.bench.fleetgen import make_fleet, outcomes_at, telemetry_at

    fleet = make_fleet(120)
    model = FleetModel()
    ts = T0 + 1_000
    model.fold_telemetries(list(telemetry_at(fleet, ts)))
    model.fold_outcomes(list(outcomes_at(fleet, ts, workflow_base=0)))
    fast = snapshot(model, ts)
    table = fast.nodes
    assert isinstance(table, NodeTable)
    cols = fleet_columns(fast)
    cols.floats("tbt_p50_ms"), cols.ints("requests_w"), cols.warm, fast.pools
    assert table._views.count(None) == len(table) == 120  # the columns and pools built no view
    node_id = next(iter(table))
    assert table[node_id] is table[node_id]
    assert len(table._views) - table._views.count(None) == 1


# -- hostile folds: caps, late and far-future records, forged values, 100k new ids --------------


def _fold_and_compare(batches: Sequence[Batch], config: ModelConfig | None, nows: Iterator[int]) -> int:
    model = FleetModel(config)
    compared = 0
    for kind, items in batches:
        if kind == "outcome":
            model.fold_outcomes(items)
        else:
            model.fold_telemetries(items)
        now = next(nows)
        _pairs(model, now)
        _pairs(model, now - 3_000, window_ms=30_000)
        compared += 2
    return compared


def _nows(base: int = T0) -> Iterator[int]:
    k = 0
    while True:
        k += 1
        yield base + (k * 700) % 45_000 + (4_102_444_800_000 - base if k % 29 == 0 else 0)


def test_hostile_sequences_snapshot_alike() -> None:
    assert _fold_and_compare(_hostile(), TIGHT, _nows()) > 50


def test_the_default_caps_with_the_hostile_sequence_snapshot_alike() -> None:
    _fold_and_compare(_hostile(), None, _nows())


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_sequences())
def test_generated_sequences_snapshot_alike(batches: list[Batch]) -> None:
    _fold_and_compare(batches, ModelConfig(forget_node_after_ms=20_000, retention_ms=30_000), _nows())


def test_a_bucket_written_again_after_a_snapshot_read_it_is_read_again() -> None:
    """Late records into buckets a snapshot already read, a node moving pools, one forgotten and
    back, evictions behind a pool's clock: each snapshot still equals the plain one."""
    config = ModelConfig(forget_node_after_ms=5_000, retention_ms=20_000)
    model = FleetModel(config)
    n = 0
    for s in range(60):
        ts = T0 + s * 1_000
        nodes = [f"n{i}" for i in range(6) if not (i == 3 and 20 <= s < 30)]  # n3 silent a while
        model.fold_telemetries(
            [
                tel(node, "p1" if node == "n5" and s >= 40 else f"p{i % 2}", ts, errors=s % 3)
                for i, node in enumerate(nodes)
            ]
        )
        batch = []
        for i in range(8):
            n += 1
            late = (s * 3 + i) % 7 == 0
            batch.append(
                out(
                    f"n{i % 6}",
                    f"p{i % 2}",
                    ts - (4_000 if late else 0) + i,
                    n,
                    outcome=("ok", "error")[n % 2],
                )
            )
        model.fold_outcomes(batch)
        _pairs(model, ts)
        if s % 5 == 0:
            _pairs(model, ts + 500, window_ms=3_000)  # a partial bucket, read, then written below
    snap = snapshot(model, T0 + 59_000)
    assert snap.nodes["n5"].pool_id == "p1"  # moved
    assert "n3" in snap.nodes  # forgotten while silent, back


def test_a_node_arriving_with_calls_already_in_read_buckets_brings_them() -> None:
    """Calls on a node before its first telemetry (an unplaced window), a snapshot reading those
    buckets, then the node's telemetry: the rows change and the new row's calls, in buckets the
    snapshot kept, are read (the kept arrays are carried over to the new rows, not re-read)."""
    model = FleetModel()
    model.fold_telemetries([tel(f"n{i}", "p", T0 + i) for i in range(4)])
    model.fold_outcomes([out("late", "p", T0 + 100 + i, i) for i in range(5)])
    model.fold_outcomes([out("n1", "p", T0 + 200, 9)])
    _pairs(model, T0 + 2_000)
    model.fold_telemetries([tel("late", "p", T0 + 2_500), tel("n9", "p", T0 + 2_600)])
    fast = snapshot(model, T0 + 3_000)
    assert fast.nodes["late"].requests_w == 5
    assert_same(fast, snapshot_plain(model, T0 + 3_000))
    model.fold_telemetries([tel("n2", "q", T0 + 3_500)])  # a move: the same window, another row
    _pairs(model, T0 + 4_000)


# -- the checkpoint: the snapshot's kept state is not part of it -------------------------------


def test_snapshots_leave_the_checkpoint_as_it_was_and_a_restored_model_snapshots_alike() -> None:
    from fleetloop.bench.fleetgen import make_fleet, outcomes_at, telemetry_at

    fleet = make_fleet(60)
    plain_model, model = FleetModel(), FleetModel()
    for k in range(15):
        ts = T0 + k * 1_000
        batches: list[Batch] = [
            ("telemetry", list(telemetry_at(fleet, ts))),
            ("outcome", list(outcomes_at(fleet, ts - 3_000 * (k % 2), workflow_base=k * 200))),
        ]
        for kind, items in batches:
            for m in (plain_model, model):
                (m.fold_outcomes if kind == "outcome" else m.fold_telemetries)(items)
            snapshot(model, ts)  # only one of the two takes snapshots
            assert checkpoint.encode(model) == checkpoint.encode(plain_model)
    blob = checkpoint.encode(model)
    assert b"_snapshots" not in checkpoint.zlib.decompress(blob)
    restored = checkpoint.decode(blob)
    assert isinstance(restored, FleetModel)
    now = T0 + 14_000
    _pairs(restored, now)
    node, pool = fleet.node_ids[0], fleet.pools[0].pool_id
    late = [out(node, pool, now - 500, 99_001), out(node, pool, now - 9_000, 99_002)]
    restored.fold_outcomes(late)
    model.fold_outcomes(late)
    _pairs(restored, now)
    assert_same(snapshot(restored, now), snapshot_plain(model, now))
    assert checkpoint.encode(restored) == checkpoint.encode(model)


def test_the_fast_snapshot_is_the_plain_one_for_a_fleet_gen_fleet_with_numpy_free_views() -> None:
    """The views hold Python values (never numpy scalars): a decision serialised from them is the
    same JSON."""
    from fleetloop.bench.fleetgen import make_fleet, outcomes_at, telemetry_at

    fleet = make_fleet(200)
    model = FleetModel()
    ts = T0
    for k in range(12):
        ts += 1000
        model.fold_telemetries(list(telemetry_at(fleet, ts)))
        model.fold_outcomes(list(outcomes_at(fleet, ts, workflow_base=k * 400)))
        _pairs(model, ts)
    snap = snapshot(model, ts)
    for view in snap.nodes.values():
        for f in dataclasses.fields(view):
            assert not isinstance(getattr(view, f.name), np.generic), f.name


def test_columns_of_an_empty_model() -> None:
    snap = snapshot(FleetModel(), T0)
    assert_same(snap, snapshot_plain(FleetModel(), T0))
    cols = fleet_columns(snap)
    assert isinstance(cols, FleetColumns)
    assert len(cols) == 0
    assert cols.floats("tbt_p50_ms").shape == (0,)
    assert cols.ints("requests_w").shape == (0,)
    assert fm.snapshot(FleetModel(), 2**70).nodes == {}  # beyond int64: no row is live


def test_a_decoded_model_starts_its_transient_state_without_a_getattr_fallback() -> None:
    """A model from a checkpoint has every transient slot set (from ``_TRANSIENT``'s plain values),
    so the model needs no ``__getattr__`` fallback, which would cost every attribute access in the
    fold (a class with one is not given Python's fast attribute access)."""
    model = FleetModel()
    model.fold_telemetries([tel("a", "p", T0)])
    snapshot(model, T0)
    restored = checkpoint.decode(checkpoint.encode(model))
    assert "__getattr__" not in vars(FleetModel)
    for name, value in FleetModel._TRANSIENT.items():
        assert getattr(restored, name) == value
    assert restored._snapshots is None
    assert_same(snapshot(restored, T0), snapshot_plain(model, T0))
