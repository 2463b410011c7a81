"""A pool's output rate when its routers' outcomes carry no output tokens (a router that logs calls
but not their lengths: vllm-router, SGLang's router and HAProxy, read from their logs and counters):
the tokens its nodes report generating (``NodeTelemetry.output_tokens``, a count per interval),
kept in the pool's ``node_output`` window (:mod:`fleetloop.core.model.state`). Outcomes win
whenever they carry any output token. Both snapshot forms and both folds agree."""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.core import checkpoint
from fleetloop.core.model import FleetModel, apply, snapshot
from fleetloop.policies.base import PoolView
from fleetloop.schemas import NodeTelemetry
from tests.oracles.fold import fold_outcome, fold_telemetry
from tests.oracles.snapshot import snapshot_plain
from tests.support.checkpoints import blob_of, edit_field, tree_of
from tests.support.records import outcome, telemetry

T = 1_700_000_000_000


def _records(out_per_call: int, node_out: int, *, ok: bool = True) -> list[Any]:
    """Two nodes of pool ``p`` reporting ``node_out`` output tokens a second for 10 s, and one call
    a second ending on them (``out_per_call`` output tokens each)."""
    recs: list[Any] = []
    for s in range(10):
        ts = T + s * 1_000
        recs.extend(telemetry(node, ts_ms=ts, output_tokens=node_out) for node in ("n0", "n1"))
        recs.append(
            outcome("n0" if s % 2 else "n1", "ok" if ok else "error", ts_ms=ts + 500, n=s,
                    output_tokens=out_per_call)
        )  # fmt: skip
    return recs


def _pool(records: list[Any], now: int = T + 9_500) -> PoolView:
    """Pool ``p`` as both snapshot forms see it (held equal), folded by both folds (held equal); the
    default ``now`` puts all ten seconds in the 10 s window (buckets after ``now - 10 s``)."""
    fast = apply(FleetModel(), records)
    plain = FleetModel()
    for r in records:
        (fold_telemetry if isinstance(r, NodeTelemetry) else fold_outcome)(plain, r)
    assert checkpoint.encode(fast) == checkpoint.encode(plain)
    view = snapshot(fast, now).pools["p"]
    assert view == snapshot_plain(fast, now).pools["p"]
    return view


def test_outcomes_without_output_tokens_read_the_nodes_counts() -> None:
    view = _pool(_records(out_per_call=0, node_out=300))
    assert view.output_from_nodes
    assert view.output_tokens_rate_per_s == pytest.approx(2 * 300 * 10 / 10.0)  # 2 nodes, 10 s


def test_outcomes_with_output_tokens_win_over_the_nodes_counts() -> None:
    view = _pool(_records(out_per_call=40, node_out=300))
    assert not view.output_from_nodes
    assert view.output_tokens_rate_per_s == pytest.approx(40 * 10 / 10.0)


def test_without_ok_calls_or_node_counts_the_rate_stays_zero() -> None:
    failed = _pool(_records(out_per_call=0, node_out=300, ok=False))
    assert not failed.output_from_nodes  # no call ended well: no rate to stand in for
    assert failed.output_tokens_rate_per_s == 0.0
    silent = _pool(_records(out_per_call=0, node_out=0))
    assert not silent.output_from_nodes
    assert silent.output_tokens_rate_per_s == 0.0


def test_only_the_window_counts_and_evicted_buckets_go() -> None:
    recs = _records(out_per_call=0, node_out=300)
    assert _pool(recs, now=T + 14_500).output_tokens_rate_per_s == pytest.approx(2 * 300 * 5 / 10.0)
    model = apply(FleetModel(), recs)
    model.fold_telemetry(telemetry("n0", ts_ms=T + 400_000))  # the pool's clock moves past retention
    assert model.pools["p"].node_output.buckets.keys() <= {(T + 400_000) // 1_000}


def test_a_checkpoint_from_before_the_field_restores_and_folds_on() -> None:
    model = apply(FleetModel(), _records(out_per_call=0, node_out=300))
    tree = tree_of(checkpoint.encode(model))
    edit_field(tree, "fleetloop.core.model.fleet:_Pool", "node_output")
    back = checkpoint.decode(blob_of(tree))
    assert isinstance(back, FleetModel)
    assert back.pools["p"].node_output.buckets == {}
    assert back.pools["p"].node_output.width == 1
    for s in range(10, 20):
        back.fold_telemetry(telemetry("n0", ts_ms=T + s * 1_000, output_tokens=100))
        back.fold_outcome(outcome("n0", "ok", ts_ms=T + s * 1_000 + 500, n=s, output_tokens=0))
    view = snapshot(back, T + 19_500).pools["p"]
    assert view.output_from_nodes
    assert view.output_tokens_rate_per_s == pytest.approx(100.0)
