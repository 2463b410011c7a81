"""A pool's token rates when its routers' outcomes carry no tokens (a router that logs calls but not
their lengths: vllm-router and SGLang's router, read from their counters, carry none; HAProxy's log
carries the prompt tokens of fleetloop's header and no output tokens): the tokens its nodes report
(``NodeTelemetry.prompt_tokens`` and ``output_tokens``, counts per interval), kept in the pool's
``node_tokens`` window (:mod:`fleetloop.core.model.state`). Each rate on its own: outcomes win
whenever they carry any token of that kind. Both snapshot forms and both folds agree."""

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


def _records(call: tuple[int, int], node: tuple[int, int], *, ok: bool = True) -> list[Any]:
    """Two nodes of pool ``p`` reporting ``node`` (prompt, output) tokens a second for 10 s, and one
    call a second ending on them carrying ``call`` (prompt, output) tokens."""
    recs: list[Any] = []
    for s in range(10):
        ts = T + s * 1_000
        recs.extend(
            telemetry(n, ts_ms=ts, prompt_tokens=node[0], output_tokens=node[1]) for n in ("n0", "n1")
        )
        recs.append(
            outcome("n0" if s % 2 else "n1", "ok" if ok else "error", ts_ms=ts + 500, n=s,
                    prompt_tokens=call[0], output_tokens=call[1])
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


def _rates(view: PoolView) -> tuple[float, float, bool, bool]:
    return (
        view.prompt_tokens_rate_per_s,
        view.output_tokens_rate_per_s,
        view.prompt_from_nodes,
        view.output_from_nodes,
    )


def test_outcomes_without_tokens_read_the_nodes_counts() -> None:
    # 2 nodes x 10 s of (900, 300) over the 10 s window
    assert _rates(_pool(_records((0, 0), (900, 300)))) == pytest.approx((1_800.0, 600.0, True, True))


def test_outcomes_with_tokens_win_over_the_nodes_counts() -> None:
    assert _rates(_pool(_records((120, 40), (900, 300)))) == pytest.approx((120.0, 40.0, False, False))


def test_each_rate_is_read_on_its_own() -> None:
    # HAProxy's case: the prompt from fleetloop's header, no output tokens
    assert _rates(_pool(_records((120, 0), (900, 300)))) == pytest.approx((120.0, 600.0, False, True))
    assert _rates(_pool(_records((0, 40), (900, 300)))) == pytest.approx((1_800.0, 40.0, True, False))


def test_without_ok_calls_or_node_counts_the_rates_stay_zero() -> None:
    # no call ended well: no rate to stand in for
    assert _rates(_pool(_records((0, 0), (900, 300), ok=False))) == (0.0, 0.0, False, False)
    assert _rates(_pool(_records((0, 0), (0, 0)))) == (0.0, 0.0, False, False)


def test_only_the_window_counts_and_evicted_buckets_go() -> None:
    recs = _records((0, 0), (900, 300))
    assert _rates(_pool(recs, now=T + 14_500)) == pytest.approx((900.0, 300.0, True, True))  # 5 s
    model = apply(FleetModel(), recs)
    model.fold_telemetry(telemetry("n0", ts_ms=T + 400_000))  # the pool's clock moves past retention
    assert model.pools["p"].node_tokens.buckets.keys() <= {(T + 400_000) // 1_000}


def test_a_checkpoint_from_before_the_field_restores_and_folds_on() -> None:
    model = apply(FleetModel(), _records((0, 0), (900, 300)))
    tree = tree_of(checkpoint.encode(model))
    edit_field(tree, "fleetloop.core.model.fleet:_Pool", "node_tokens")
    back = checkpoint.decode(blob_of(tree))
    assert isinstance(back, FleetModel)
    assert back.pools["p"].node_tokens.buckets == {}
    assert back.pools["p"].node_tokens.width == 2
    for s in range(10, 20):
        back.fold_telemetry(telemetry("n0", ts_ms=T + s * 1_000, prompt_tokens=500, output_tokens=100))
        back.fold_outcome(
            outcome("n0", "ok", ts_ms=T + s * 1_000 + 500, n=s, prompt_tokens=0, output_tokens=0)
        )
    assert _rates(snapshot(back, T + 19_500).pools["p"]) == pytest.approx((500.0, 100.0, True, True))
