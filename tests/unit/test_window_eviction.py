"""Window eviction pops the buckets from the window's ``low`` up to the horizon instead of visiting
every kept bucket: the window after it must be the one a scan of every key leaves (the same keys in
the same order, the same rows), whoever made the buckets (``Window.add``/``add_at``, the folds'
inlined writes, a checkpoint's decode), and a model folded with it must be the model folded with a
scan, byte for byte, reading the same snapshots, with its windows' memory bounded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import pytest
from fleetloop.core import checkpoint
from fleetloop.core.model import FleetModel, ModelConfig, apply, snapshot
from fleetloop.core.model.windows import Window
from fleetloop.schemas import NodeTelemetry, RequestOutcome
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.records import outcome, telemetry

T = 1_700_000_000_000
X = TypeVar("X")


def scan_evict_before(self: Window, bucket: int) -> int:
    """The eviction as it was: every key visited (the reference)."""
    for b in [b for b in self.buckets if b < bucket]:
        del self.buckets[b]
    return len(self.buckets)


def _decoded(win: Window) -> Window:
    back = checkpoint.decode(checkpoint.encode(win))
    assert isinstance(back, Window)
    return back


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(-40, 40), st.floats(-3.0, 3.0)),
        st.tuples(st.just("add_at"), st.integers(-40, 40), st.floats(-3.0, 3.0)),
        st.tuples(st.just("evict"), st.integers(-50, 50), st.just(0.0)),
        st.tuples(st.just("decode"), st.just(0), st.just(0.0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_OPS)
def test_eviction_leaves_the_window_a_scan_of_every_key_leaves(ops: list[tuple[str, int, float]]) -> None:
    win = Window(2)
    ref: dict[int, list[float]] = {}
    for op, b, v in ops:
        if op == "add":
            win.add(b, (v, 1.0))
            if b in ref:
                ref[b] = [ref[b][0] + v, ref[b][1] + 1.0]
            else:
                ref[b] = [v, 1.0]
        elif op == "add_at":
            win.add_at(b, 1, v)
            ref.setdefault(b, [0.0, 0.0])[1] += v
        elif op == "evict":
            left = win.evict_before(b)
            for k in [k for k in ref if k < b]:
                del ref[k]
            assert left == len(ref)
        else:  # a checkpoint's round trip: the decoded window does not know its low
            win = _decoded(win)
        assert list(win.buckets.items()) == list(ref.items())
        assert all(k >= win.low for k in win.buckets)


def test_a_decoded_window_evicts_every_old_bucket() -> None:
    win = Window(1)
    for b in (5, 3, 9, 1):
        win.add(b, (1.0,))
    back = _decoded(win)
    assert back.evict_before(6) == 1
    assert list(back.buckets) == [9]


def _stream(seed: int) -> list[list[NodeTelemetry | RequestOutcome]]:
    """Batches of a generated fleet over ~4 minutes of event time at a 20 s retention (many
    evictions): nodes that move between pools, calls keyed by a pool other than their node's (their
    node window written below its pool's eviction horizon), calls on nodes without telemetry, late
    records, a pool whose clock leaps ahead and one that goes silent."""
    rng = np.random.default_rng(seed)

    def pick(xs: Sequence[X]) -> X:
        return xs[int(rng.integers(len(xs)))]

    def upto(n: int) -> int:
        return int(rng.integers(n))

    pools = ["a", "b", "c", "d"]
    home = {f"n{i}": pools[i % 3] for i in range(12)}
    batches: list[list[NodeTelemetry | RequestOutcome]] = []
    n = 0
    for s in range(240):
        now = T + s * 1000
        batch: list[NodeTelemetry | RequestOutcome] = []
        lead = 40_000 if s >= 120 else 0  # pool "c" runs 40 s ahead of the others from then on
        for node, pool in sorted(home.items()):
            if rng.random() < 0.02:
                home[node] = pool = pick(pools[:3])  # the node moves
            ahead = lead if pool == "c" else 0
            errors = int(rng.random() < 0.2)
            batch.append(telemetry(node, pool, ts_ms=now + ahead + upto(1000), errors=errors))
        if s < 60:
            batch.append(telemetry("quiet", "d", ts_ms=now))  # then silent: its pool goes
        for _ in range(4 + upto(10)):
            n += 1
            node_id: str | None = pick([*sorted(home), "ghost-1", "ghost-2", None])
            pool = home.get(node_id or "", "a") if rng.random() < 0.7 else pick(pools[:3])
            back = pick([0, 0, 0, 500, 3_000, 15_000, 19_000, 26_000])  # late, some too late
            kind = "shed" if node_id is None else pick(["ok", "ok", "ok", "error", "timeout", "shed"])
            task = pick([None, None, "succeeded", "failed"])
            batch.append(outcome(node_id, kind, pool, ts_ms=now - back + upto(1000), n=n, task_outcome=task))
        batches.append([batch[i] for i in rng.permutation(len(batch)).tolist()])
    return batches


_CONFIG = ModelConfig(retention_ms=20_000, forget_node_after_ms=8_000)


def _run(batches: list[list[NodeTelemetry | RequestOutcome]]) -> tuple[list[bytes], list[Any], FleetModel]:
    model = FleetModel(_CONFIG)
    states: list[bytes] = []
    reads: list[Any] = []
    for k, batch in enumerate(batches):
        apply(model, batch)
        states.append(checkpoint.encode(model))
        now = batch[-1].ts_ms
        snap = snapshot(model, now, window_ms=30_000 if k % 7 == 0 else 10_000)  # some reach behind horizons
        reads.append((dict(snap.nodes), snap.pools, snap.tenants))
        if k == 150:  # a restore: its windows start not knowing their low
            restored = checkpoint.decode(states[-1])
            assert isinstance(restored, FleetModel)
            model = restored
    return states, reads, model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_model_evicting_from_low_is_the_model_evicting_by_scan(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = _stream(seed)
    states, reads, model = _run(batches)
    with monkeypatch.context() as m:
        m.setattr(Window, "evict_before", scan_evict_before)
        want_states, want_reads, _ = _run(batches)
    assert model.evicted["pools"] == 1  # the stream did what it says: a pool went, nodes were forgotten
    assert model.evicted["nodes"] > 0
    assert model.late_dropped > 0
    for k, (got, want) in enumerate(zip(states, want_states, strict=True)):
        assert got == want, f"batch {k}: the model differs from the scanning eviction's"
    assert reads == want_reads
    # Memory: no window keeps more than the retention and one eviction step behind its newest bucket.
    held = [n.win for n in model.nodes.values()] + [w for p in model.pools.values() for w in (p.win, p.ttft)]
    assert max(len(w.buckets) for w in held) <= _CONFIG.retention_ms // 1000 + 11 + 40


def test_a_call_keyed_by_a_pool_behind_is_evicted_from_its_nodes_window() -> None:
    """A call keyed by pool "slow" (its clock 25 s behind) lands in node x's window below the
    horizon x's own pool "fast" evicted to; x's next eviction drops it, as a scan would."""
    cfg = ModelConfig(retention_ms=20_000, forget_node_after_ms=60_000)
    model = FleetModel(cfg)
    apply(model, [telemetry("x", "fast", ts_ms=T + 30_000), telemetry("y", "slow", ts_ms=T + 5_000)])
    fast = model.pools["fast"]
    assert fast.evicted_to == (T + 10_000) // 1000
    behind = (T + 6_000) // 1000  # above slow's horizon, below fast's
    apply(model, [outcome("x", "ok", "slow", ts_ms=behind * 1000)])
    assert behind in model.nodes["x"].win.buckets
    apply(model, [telemetry("x", "fast", ts_ms=T + 41_000)])  # fast evicts again, past ``behind``
    assert fast.evicted_to > behind
    assert behind not in model.nodes["x"].win.buckets
