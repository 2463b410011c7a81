"""Calls the router moved to another model's pool (``RequestOutcome.routed_from``): each goes out
with its copy keyed by the pool it was moved from (``diverted_to``, :func:`diverted_copy`), whose
tokens count as that pool's diverted demand (``PoolView.diverted_tokens_rate_per_s``), so its
autoscaler keeps sizing for them (:mod:`fleetloop.policies.autoscale.predictive`), in whichever
shard that pool's records land.

A copy cannot make a pool, pin buckets past the pool's retention, or count as a call; a call never
placed has no copy; both snapshot forms and both folds agree (``test_fast_snapshot``,
``test_fold_batch`` hold them equal on records with the fields)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fleetloop.core import checkpoint
from fleetloop.core.model import FleetModel, apply, snapshot
from fleetloop.schemas import RequestOutcome
from fleetloop.schemas.fast import OUTCOME_TWIN
from fleetloop.schemas.requests import diverted_copy
from tests.oracles.fold import fold_plain
from tests.oracles.snapshot import snapshot_plain
from tests.support.checkpoints import blob_of, edit_field, tree_of
from tests.support.records import outcome, telemetry

T = 1_700_000_000_000


def moved(ts_ms: int, n: int, **kw: Any) -> RequestOutcome:
    """A call the router moved from pool ``big`` to node ``s0`` of pool ``small``: 100 + 10 tokens."""
    kw.setdefault("routed_from", "big")
    return outcome("s0", "ok", pool="small", ts_ms=ts_ms, n=n, **kw)


def with_copies(records: Any) -> list[RequestOutcome]:
    """Each record followed by its copy, when it has one: what a router publishes."""
    out: list[RequestOutcome] = []
    for r in records:
        out.append(r)
        copy = diverted_copy(r) if isinstance(r, RequestOutcome) else None
        if copy is not None:
            out.append(copy)
    return out


def fleet(*records: RequestOutcome) -> FleetModel:
    base = [telemetry("b0", pool="big", ts_ms=T), telemetry("s0", pool="small", ts_ms=T)]
    return apply(FleetModel(), [*base, *with_copies(records)])


def rates(model: FleetModel, now: int = T + 10_000) -> dict[str, tuple[float, float]]:
    """Pool -> (diverted tokens/s, served tokens/s) over the default 10 s window, both snapshot forms."""
    fast, plain = snapshot(model, now), snapshot_plain(model, now)
    got = {
        p: (v.diverted_tokens_rate_per_s, v.prompt_tokens_rate_per_s + v.output_tokens_rate_per_s)
        for p, v in fast.pools.items()
    }
    assert got == {
        p: (v.diverted_tokens_rate_per_s, v.prompt_tokens_rate_per_s + v.output_tokens_rate_per_s)
        for p, v in plain.pools.items()
    }
    return got


def test_a_moved_call_counts_as_the_preferred_pools_diverted_demand() -> None:
    model = fleet(*(moved(T + 1_000 + k, k) for k in range(10)))
    # 10 calls x 110 tokens over 10 s; the serving pool served them, the preferred one did not
    assert rates(model) == {"big": (110.0, 0.0), "small": (0.0, 110.0)}
    assert rates(model, T + 30_000) == {"big": (0.0, 0.0), "small": (0.0, 0.0)}  # out of the window


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (moved(T + 1_000, 1, routed_from=None), "not moved"),
        (moved(T + 1_000, 1, routed_from="small"), "moved from the pool that served it"),
        (moved(T + 1_000, 1, routed_from="nosuch"), "a pool the model does not hold"),
        (
            outcome(None, "shed", pool="small", ts_ms=T + 1_000, n=1, routed_from="big"),
            "never placed: shed",
        ),
    ],
)
def test_what_does_not_count(record: RequestOutcome, why: str) -> None:
    model = fleet(record)
    assert rates(model)["big"][0] == 0.0, why
    assert set(model.pools) == {"big", "small"}, why  # routed_from never makes a pool


def test_a_stamp_beyond_the_preferred_pools_retention_pins_no_bucket() -> None:
    """The serving pool's clock admits a record far ahead of the preferred pool's; a bucket there
    would outlive every eviction of that pool until its own clock got there."""
    retention = FleetModel().config.retention_ms
    model = fleet(moved(T + retention + 10_000, 1), moved(T + retention - 10_000, 2))
    assert sorted(model.pools["big"].diverted.buckets) == [(T + retention - 10_000) // 1_000]


def test_a_bucket_the_preferred_pool_evicted_is_not_written_again() -> None:
    retention = FleetModel().config.retention_ms
    model = fleet(telemetry("b0", pool="big", ts_ms=T + 2 * retention), moved(T + 1_000, 1))
    assert not model.pools["big"].diverted.buckets


def test_the_twin_carries_the_field_and_both_folds_agree() -> None:
    recs = [
        OUTCOME_TWIN.validate_json(r.model_dump_json().encode()) for r in with_copies([moved(T + 1_000, 1)])
    ]
    assert [(r.pool_id, r.routed_from, r.diverted_to) for r in recs] == [
        ("small", "big", None),
        ("big", None, "small"),
    ]
    base = [telemetry("b0", pool="big", ts_ms=T), telemetry("s0", pool="small", ts_ms=T)]
    fast = apply(FleetModel(), base)
    fast.fold_outcomes(recs)
    plain = apply(FleetModel(), base)
    fold_plain(plain, recs, outcomes=True)
    assert checkpoint.encode(fast) == checkpoint.encode(plain)
    assert rates(fast) == rates(plain) == {"big": (11.0, 0.0), "small": (0.0, 11.0)}


def test_a_checkpoint_round_trips_the_diverted_window() -> None:
    model = fleet(*(moved(T + 1_000 + k, k) for k in range(3)))
    back = checkpoint.decode(checkpoint.encode(model))
    assert isinstance(back, FleetModel)
    assert back.pools["big"].diverted.buckets == model.pools["big"].diverted.buckets
    assert rates(back) == rates(model)


def _without_field(data: bytes, cls: str, name: str) -> bytes:
    """The checkpoint as a build without ``cls.name`` wrote it (the field and its values removed)."""
    tree = tree_of(data)
    edit_field(tree, cls, name)
    return blob_of(tree)


def test_a_checkpoint_from_before_the_field_restores_with_an_empty_window() -> None:
    model = fleet(*(moved(T + 1_000 + k, k) for k in range(3)))
    old = _without_field(checkpoint.encode(model), "fleetloop.core.model.fleet:_Pool", "diverted")
    back = checkpoint.decode(old)
    assert isinstance(back, FleetModel)
    assert back.pools["big"].diverted.buckets == {}
    assert back.pools["big"].diverted.width == 1
    assert rates(back)["big"] == (0.0, 0.0)
    for r in with_copies([moved(T + 2_000, 9)]):  # and folds on
        back.fold_outcome(r)
    assert rates(back)["big"] == (11.0, 0.0)


def test_a_call_that_was_not_moved_is_written_as_before_the_field() -> None:
    """Daemons refuse unknown fields, so a record without a move must not name the field: routers
    and daemons then upgrade in either order until a router moves a call."""
    plain = outcome("s0", "ok", pool="small", ts_ms=T, n=1)
    assert "routed_from" not in orjson.loads(plain.model_dump_json())
    assert "routed_from" not in plain.model_dump(mode="json")
    assert orjson.loads(moved(T, 1).model_dump_json())["routed_from"] == "big"
    assert RequestOutcome.model_validate_json(plain.model_dump_json()) == plain


def test_a_flood_of_new_routed_from_ids_makes_nothing() -> None:
    """100k records naming 100k pools the model never saw (a forged or misconfigured router): no
    pool, no bucket, no diverted demand anywhere; the records still count where they were served."""
    flood = [moved(T + 1_000 + k // 100, k, routed_from=f"ghost-{k}") for k in range(100_000)]
    model = fleet(*flood)
    assert set(model.pools) == {"big", "small"}
    assert not model.pools["big"].diverted.buckets
    assert not model.pools["small"].diverted.buckets
    assert rates(model, T + 1_000 + 1_000)["small"][1] > 0.0


def test_across_shards_the_preferred_pool_counts_the_moved_call_from_its_copy() -> None:
    """Outcomes are keyed by their ``pool_id``: with ``fleet.requests``' 4 partitions the two pools'
    records usually land in different shards. The served record reaches the serving pool's shard,
    the copy the preferred pool's; each shard counts what is its own, and the copy is no call."""
    shard_big = apply(FleetModel(), [telemetry("b0", pool="big", ts_ms=T)])
    shard_small = apply(FleetModel(), [telemetry("s0", pool="small", ts_ms=T)])
    for r in with_copies(moved(T + 1_000 + k, k) for k in range(10)):
        apply(shard_big if r.pool_id == "big" else shard_small, [r])
    assert rates(shard_big) == {"big": (110.0, 0.0)}
    assert rates(shard_small) == {"small": (0.0, 110.0)}
    assert set(shard_small.pools) == {"small"}
    assert shard_big.ledger.tasks_started == 0  # the copy is not a task's call
    assert shard_small.ledger.tasks_started == 10


def test_a_record_without_its_copy_counts_no_diverted_demand() -> None:
    """A router older than the copy (only ``routed_from``): the moved call is served and counted
    where it ran, and the preferred pool sees nothing of it, in one shard or two."""
    model = apply(
        FleetModel(),
        [telemetry("b0", pool="big", ts_ms=T), telemetry("s0", pool="small", ts_ms=T), moved(T + 1_000, 1)],
    )
    assert rates(model) == {"big": (0.0, 0.0), "small": (0.0, 11.0)}


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"diverted_to": "small", "pool_id": "small"}, "a copy names another pool"),
        ({"diverted_to": "small", "outcome": "shed", "node_id": None}, "a shed call has no copy"),
    ],
)
def test_a_copy_that_cannot_be_is_refused(fields: dict[str, Any], why: str) -> None:
    raw = orjson.loads(moved(T + 1_000, 1, routed_from=None).model_dump_json())
    raw |= {"pool_id": "big", **fields}
    with pytest.raises(ValueError, match="diverted copy"):
        RequestOutcome.model_validate(raw)
    # the twin's mirror of the check refuses it too (the record then takes the model's path)
    decode, accepts, _ = OUTCOME_TWIN.decoder()
    assert not accepts(decode(orjson.dumps(raw))), why
