"""Exact restarts, without a broker: a shard restored from a checkpoint decides what a continuous one
decides, and a shard's decisions do not depend on how its input is split into batches."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from fleetloop.core.checkpoint import (
    CHUNK_BYTES,
    CheckpointError,
    decode,
    encode,
    newest_complete,
    scan,
    to_chunks,
)
from fleetloop.core.shard import INPUTS, Row, Shard
from fleetloop.daemon.act.publish import decision_bytes
from fleetloop.policies.registry import CompiledPolicy, builtin_policy
from fleetloop.schemas import Tick
from fleetloop.schemas.topics import REQUESTS, TELEMETRY
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.records import outcome, telemetry

NODES = [f"p/{i}" for i in range(6)]
T0 = 1_700_000_000_000


def stream(seconds: int = 90, seed: int = 3) -> tuple[dict[str, list[Row]], list[tuple[Tick, int]]]:
    """Telemetry and outcomes of one pool with a node that goes bad and recovers, plus ticks.

    Broker timestamps equal event times here; each tick's cut is what arrived by its boundary."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list[Row]] = {TELEMETRY: [], REQUESTS: []}
    ticks: list[tuple[Tick, int]] = []
    n = 0
    for s in range(seconds):
        base = T0 + s * 1000
        for i, node in enumerate(NODES):
            q = int(rng.integers(0, 8 + 1)) + (30 if node == "p/5" and 20 <= s < 50 else 0)
            rows[TELEMETRY].append(
                Row(len(rows[TELEMETRY]), base + 10 + i, telemetry(node, ts_ms=base + 10 + i, queue_depth=q))
            )
        for _ in range(int(rng.integers(15, 30 + 1))):
            node = NODES[int(rng.integers(len(NODES)))]
            bad = node == "p/5" and 20 <= s < 50 and rng.random() < 0.8
            ts = base + int(rng.integers(0, 999 + 1))
            kind = "error" if bad else ("timeout" if rng.random() < 0.02 else "ok")
            wf = int(rng.integers(0, 40 + 1))
            rows[REQUESTS].append(
                Row(
                    len(rows[REQUESTS]),
                    ts,
                    outcome(
                        node,
                        kind,
                        ts_ms=ts,
                        n=n,
                        workflow_id=f"w-{s // 10}-{wf}",
                        cost_usd=0.001 * rng.random(),
                        task_outcome=("succeeded" if rng.random() < 0.2 else None) if kind == "ok" else None,
                    ),
                )
            )
            n += 1
        rows[REQUESTS].sort(key=lambda r: (r.timestamp_ms, r.offset))
        rows[REQUESTS] = [Row(i, r.timestamp_ms, r.item) for i, r in enumerate(rows[REQUESTS])]
        boundary = base + 1000
        ticks.append((Tick(ts_ms=boundary, tick_id=boundary // 1000, pool_id="p"), boundary))
    return rows, ticks


def cut_at(rows: dict[str, list[Row]], ts: int) -> dict[str, int]:
    return {k: sum(1 for r in rows[k] if r.timestamp_ms <= ts) for k in INPUTS}


def run(
    rows: dict[str, list[Row]],
    ticks: list[tuple[Tick, int]],
    policy: CompiledPolicy,
    *,
    restore_at: int | None = None,
    chunks: Iterator[int] | None = None,
) -> list[bytes]:
    """Feed the shard up to each tick's cut (in batches of ``chunks`` sizes), decide, optionally
    replacing the shard by its checkpoint before tick ``restore_at``."""
    shard = Shard(0)
    out: list[bytes] = []
    for k, (tick, ts) in enumerate(ticks):
        cut = cut_at(rows, ts)
        if restore_at is not None and k == restore_at:
            shard = Shard.from_checkpoint(decode(encode(shard.checkpoint_value())))
        for logical in INPUTS:
            pos = shard.read[logical]
            while pos < cut[logical]:
                size = next(chunks) if chunks is not None else cut[logical] - pos
                shard.add(logical, rows[logical][pos : min(cut[logical], pos + size)])
                pos = shard.read[logical]
        decided = shard.decide(tick, cut, policy)
        assert decided is not None
        out.extend(decision_bytes(d) for d in decided)
    return out


@pytest.mark.parametrize("policy_name", ["default", "classic"])
@pytest.mark.parametrize("restore_at", [1, 25, 40, 70])
def test_a_shard_restored_from_its_checkpoint_decides_exactly_as_a_continuous_one(
    policy_name: str, restore_at: int
) -> None:
    policy = builtin_policy(policy_name)
    rows, ticks = stream()
    continuous = run(rows, ticks, policy)
    restored = run(rows, ticks, policy, restore_at=restore_at)
    assert len(continuous) > 300  # breaker records are change-only
    assert restored == continuous
    # The run really exercised state that a warm-up re-read gets wrong: a breaker opened.
    assert any(b'"state":"open"' in d for d in continuous)


def test_a_checkpoint_taken_without_the_history_differs() -> None:
    """The comparison above can fail: a shard that lost its state (a fresh one) decides otherwise."""
    policy = builtin_policy("default")
    rows, ticks = stream()
    continuous = run(rows, ticks, policy)
    shard = Shard(0)
    out: list[bytes] = []
    for k, (tick, ts) in enumerate(ticks):
        cut = cut_at(rows, ts)
        if k == 40:
            fresh = Shard(0)
            fresh.start_at(shard.folded, 0)
            shard = fresh
        for logical in INPUTS:
            shard.add(logical, rows[logical][shard.read[logical] : cut[logical]])
        out.extend(decision_bytes(d) for d in shard.decide(tick, cut, policy) or ())
    assert out != continuous


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=30))
def test_decisions_do_not_depend_on_how_the_input_is_split_into_batches(sizes: list[int]) -> None:
    policy = builtin_policy("default")
    rows, ticks = stream(seconds=40, seed=5)
    whole = run(rows, ticks, policy)

    def cycle() -> Iterator[int]:
        while True:
            yield from sizes

    assert run(rows, ticks, policy, chunks=cycle()) == whole


def test_duplicate_and_old_ticks_are_not_decided_twice() -> None:
    policy = builtin_policy("default")
    rows, ticks = stream(seconds=5)
    shard = Shard(0)
    tick, ts = ticks[2]
    cut = cut_at(rows, ts)
    for logical in INPUTS:
        shard.add(logical, rows[logical][: cut[logical]])
    assert shard.decide(tick, cut, policy)
    assert shard.decide(tick, cut, policy) is None
    assert shard.decide(ticks[1][0], cut, policy) is None


def test_checkpoint_chunks_reassemble_and_a_torn_slot_falls_back_to_the_other() -> None:
    blob_a = encode({"x": list(range(10))})
    blob_b = np.random.default_rng(1).bytes(CHUNK_BYTES * 2 + 17)
    records = [(c.key, c.value) for c in to_chunks("g", 3, 1, blob_a)]
    full_b = [(c.key, c.value) for c in to_chunks("g", 3, 2, blob_b)]
    assert len(full_b) == 3
    assert newest_complete("g", [*records, *full_b]) == {3: blob_b}
    # A crash after the first chunk of seq 4 (slot 0 again) tore slot 0: slot 1 (seq 1) is whole.
    torn = [(c.key, c.value) for c in to_chunks("g", 3, 4, blob_b)][:1]
    assert newest_complete("g", [*records, *full_b, *torn]) == {3: blob_a}
    # ...and the next writer numbers above the torn one, so its checkpoint is the newest.
    assert scan("g", [*records, *full_b, *torn])[3].max_seq == 4
    assert newest_complete("other", [*records, *full_b]) == {}


def test_a_forged_checkpoint_cannot_name_a_class_outside_fleetloop() -> None:
    import zlib

    import orjson

    forged = zlib.compress(orjson.dumps({"format": 1, "v": {"$o": "os:system", "f": {}}}))
    with pytest.raises(CheckpointError, match="not a fleetloop state class"):
        decode(forged)
    not_state = zlib.compress(
        orjson.dumps({"format": 1, "v": {"$o": "fleetloop.clock:monotonic_s", "f": {}}})
    )
    with pytest.raises(CheckpointError):
        decode(not_state)
    with pytest.raises(CheckpointError):
        decode(b"not zlib")


def test_a_checkpoint_written_before_a_field_was_added_decodes_with_its_default() -> None:
    """``_Ledger.tasks_handed_off`` came after checkpoints were in use: an older checkpoint (the
    field absent) restores with it at 0; a field that went away, or one without a default, fails."""
    import orjson
    from tests.support.checkpoints import blob_of, edit_field, tree_of

    rows, _ = stream(seconds=20)
    shard = Shard(0)
    for logical in INPUTS:
        shard.add(logical, rows[logical])
    shard.fold_read()
    shard.model.ledger.tasks_handed_off = 7
    tree = tree_of(encode(shard.checkpoint_value()))

    ledger = "fleetloop.core.model.fleet:_Ledger"

    old = orjson.loads(orjson.dumps(tree))
    edit_field(old, ledger, "tasks_handed_off")
    restored = Shard.from_checkpoint(decode(blob_of(old)))
    assert restored.model.ledger.tasks_handed_off == 0
    assert restored.model.ledger.tasks_started == shard.model.ledger.tasks_started > 0
    renamed = orjson.loads(orjson.dumps(tree))
    edit_field(renamed, ledger, "tasks_handed_off", "tasks_gone")
    with pytest.raises(CheckpointError, match="fields changed"):
        decode(blob_of(renamed))
