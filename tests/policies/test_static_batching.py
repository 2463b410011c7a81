"""static-batching: a fixed per-pool cap on tokens per batch iteration."""

from __future__ import annotations

import pytest
from fleetloop.policies.batching.static import StaticBatching, StaticBatchingParams
from fleetloop.schemas.decisions import BatchingDecision
from pydantic import ValidationError
from tests.policies.snapshots import ctx, node, snapshot


@pytest.mark.parametrize(("params", "expected"), [({}, 8192), ({"max_batch_tokens": 2048}, 2048)])
def test_constant_cap(params: dict[str, int], expected: int) -> None:
    snap = snapshot([node("a", max_batch_tokens=512, tbt_p99_ms=900.0)])
    (d,) = StaticBatching().decide(snap, StaticBatchingParams(**params), None, ctx(snap)).decisions
    assert isinstance(d, BatchingDecision)
    assert (d.pool_id, d.max_batch_tokens, d.reason) == ("p", expected, "static")


def test_param_bounds() -> None:
    with pytest.raises(ValidationError):
        StaticBatchingParams(max_batch_tokens=128)
    with pytest.raises(ValidationError):
        StaticBatchingParams(max_batch_tokens=2_000_000)
