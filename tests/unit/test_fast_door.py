"""The daemon's door (``decode_rows``: the msgspec twins, the generated identifier checks, the
event-time window, the shard's rows built in the same loop) refuses exactly what the plain door
(``decode_batch``: pydantic, one record at a time) refuses, with the same reason word for word, and
accepts the rest with the same values bit for bit. Checked on hostile batches: numbers at and past
their bounds (1e308, 10**400), raw NaN / Infinity tokens, far-future and far-past event times,
more new identifiers than the identifier memo holds (bad ones among them), wrong types."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fleetloop.core.shard import Row
from fleetloop.daemon.observe.decode import DeadLetter, Door, decode_batch, decode_fast, decode_rows
from fleetloop.schemas import fast
from fleetloop.schemas.fast import OUTCOME_TWIN, TELEMETRY_TWIN, Twin
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.telemetry import NodeTelemetry
from pydantic import BaseModel
from tests.support.records import bit_fields, outcome, telemetry

NOW = 1_767_225_600_000
FAR_FUTURE = 4_102_444_800_000  # the schema's last millisecond


class _Rec:
    def __init__(self, value: bytes | None, offset: int, broker_ts: int = NOW) -> None:
        self.topic, self.partition, self.offset, self.key = "fleet.in", 0, offset, f"k{offset}".encode()
        self.value, self.timestamp = value, broker_ts


def _dead(d: DeadLetter) -> tuple[Any, ...]:
    return (d.offset, d.reason, d.key, d.value, d.timestamp_ms)


def _with(base: dict[str, Any], **changes: Any) -> bytes:
    return json.dumps({**base, **changes}).encode()


def _raw(base: dict[str, Any], key: str, token: str) -> bytes:
    return json.dumps({**base, key: "@@"}).replace('"@@"', token).encode()


def _hostile(base: dict[str, Any], floats: list[str], ints: list[str], ids: list[str]) -> list[bytes]:
    out: list[bytes] = []
    for key in floats:
        out += [_with(base, **{key: v}) for v in (1e308, -1e308, 5e-324, -0.0, 1e15)]
        out += [_raw(base, key, t) for t in ("NaN", "Infinity", "-Infinity", "1e400", "-0")]
    for key in ints:
        out += [_with(base, **{key: v}) for v in (10**400, 2**63, -1, 1.0, "5", True, None)]
    for key in ids:
        out += [_with(base, **{key: v}) for v in ("", "a\n", "a b", "-a", "x" * 201, "é", 5, None, ["a"])]
    out += [
        _with(base, ts_ms=FAR_FUTURE),
        _with(base, ts_ms=FAR_FUTURE + 1),
        _with(base, ts_ms=NOW + 31_000),  # past the window's 30 s ahead
        _with(base, ts_ms=NOW - 601_000),  # past its 10 min behind
        _with(base, ts_ms=NOW + 30_000),  # its edges: accepted
        _with(base, ts_ms=NOW - 600_000),
        _with(base, ts_ms="soon"),
        _with(base, surprise=1),
        b"[]",
        b"null",
        b"{",
        json.dumps(base).encode() + b" x",
    ]
    return out


def _batch(twin: Twin[Any]) -> list[bytes]:
    if twin is TELEMETRY_TWIN:
        base = telemetry("n", ts_ms=NOW, hot_prefixes=("a", "b")).model_dump(mode="json")
        floats = ["cost_rate_usd_per_h", "kv_cache_used_frac", "ttft_p99_ms", "hbm_free_gib"]
        ints = ["queue_depth", "errors", "interval_ms", "gpu_count"]
        ids = ["node_id", "pool_id", "model", "gpu_type"]
        extra = [_with(base, hot_prefixes=v) for v in (["a\n"], ["ok", "a b"], ["x"] * 257, "ab", [1])]
    else:
        base = outcome("n", ts_ms=NOW, n=7, cost_usd=0.5).model_dump(mode="json")
        floats = ["cost_usd", "ttft_ms", "e2e_ms", "workflow_spend_usd"]
        ints = ["priority", "attempt", "prompt_tokens", "output_tokens"]
        ids = ["request_id", "workflow_id", "tenant_id", "pool_id", "node_id", "prefix_digest"]
        extra = [
            _with(base, cached_prompt_tokens=10**6),  # the mirrored after-validator
            _with(base, node_id=None),  # no node and not shed: refused by the same validator
            _with(base, node_id=None, outcome="shed"),
        ]
    return _hostile(base, floats, ints, ids) + extra


def _new_ids(twin: Twin[Any], n: int) -> list[bytes]:
    """``n`` records, each with identifiers never seen before (more than the memo holds), a bad
    one every 997th."""
    out: list[bytes] = []
    for i in range(n):
        bad = "\n" if i % 997 == 0 else ""
        if twin is TELEMETRY_TWIN:
            rec = telemetry(f"node-{i}", pool=f"pool-{i}", ts_ms=NOW).model_dump(mode="json")
            rec["node_id"] += bad
        else:
            rec = outcome(f"node-{i}", pool=f"pool-{i}", ts_ms=NOW, n=i).model_dump(mode="json")
            rec["workflow_id"] = f"wf-{i}{bad}"
            rec["tenant_id"] = f"tenant-{i}"
        out.append(json.dumps(rec).encode())
    return out


def _assert_same_door(twin: Twin[Any], model: type[BaseModel], values: list[bytes | None]) -> int:
    records = [_Rec(v, i, NOW if i % 5 else -1) for i, v in enumerate(values)]  # some without a broker time
    door = Door()
    plain = decode_batch(model, records, door)
    rows, dead = decode_rows(twin, records, door, Row)
    quick = decode_fast(twin, records, door)
    assert [_dead(d) for d in dead] == [_dead(d) for d in plain.dead]
    assert [_dead(d) for d in quick.dead] == [_dead(d) for d in plain.dead]
    assert [r.offset for r in rows] == [r.offset for r in records]
    kept = [r for r in rows if r.item is not None]
    assert [r.offset for r in kept] == plain.offsets == quick.offsets
    assert [bit_fields(r.item) for r in kept] == [bit_fields(x) for x in plain.items]
    assert [bit_fields(x) for x in quick.items] == [bit_fields(x) for x in plain.items]
    by_offset = {r.offset: r for r in records}
    for r in rows:  # the row holds the record's own bytes and broker time, or nothing if refused
        src = by_offset[r.offset]
        assert r.timestamp_ms == src.timestamp
        assert (r.key, r.value) == ((src.key, src.value) if r.item is not None else (None, None))
    return len(plain.dead)


@pytest.mark.parametrize(
    ("twin", "model"), [(TELEMETRY_TWIN, NodeTelemetry), (OUTCOME_TWIN, RequestOutcome)], ids=["tel", "out"]
)
def test_hostile_batches_are_refused_as_the_plain_door_refuses_them(
    twin: Twin[Any], model: type[BaseModel]
) -> None:
    values: list[bytes | None] = [*_batch(twin), None, b"", b"x" * (129 * 1024)]
    refused = _assert_same_door(twin, model, values)
    assert refused > len(values) // 2  # nearly all of them are refused: the batch is what it says


@pytest.mark.parametrize(
    ("twin", "model"), [(TELEMETRY_TWIN, NodeTelemetry), (OUTCOME_TWIN, RequestOutcome)], ids=["tel", "out"]
)
def test_more_new_identifiers_than_the_memo_holds(
    twin: Twin[Any], model: type[BaseModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memo's bound, shrunk to 2,048 here (the code's is 65,536), is crossed five times: what
    matters is what the door does each time the memo is full, not how many records fill it."""
    monkeypatch.setattr(fast, "MEMO_MAX", 2048)
    n = 5 * fast.MEMO_MAX + 500
    values: list[bytes | None] = list(_new_ids(twin, n))
    assert _assert_same_door(twin, model, values) == len(range(0, n, 997))
    assert all(len(memo) <= fast.MEMO_MAX + 1 for memo in twin._memo.values())  # it was cleared
