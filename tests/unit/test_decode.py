"""Batched decoding: one pass for a clean batch, exactly the bad records to dead letters otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import pytest
from fleetloop.daemon.observe.decode import MAX_REASON, DeadLetter, Decoded, decode_batch
from fleetloop.schemas import NodeTelemetry, RequestOutcome
from tests.support.records import outcome, telemetry, to_bytes

TOPIC = "fleet.telemetry"


@dataclass(frozen=True, slots=True)
class Rec:
    """What the decoder reads of a consumer record (a value object, not a broker)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int


def recs(values: Sequence[bytes | None], first_offset: int = 100, topic: str = TOPIC) -> list[Rec]:
    return [Rec(topic, 3, first_offset + i, b"p", v, 1_700_000_000_000 + i) for i, v in enumerate(values)]


def good(node: str) -> bytes:
    return to_bytes(telemetry(node))


def raw(node: str, **fields: object) -> bytes:
    """A telemetry value with ``fields`` set as is, past the model's checks."""
    return orjson.dumps({**telemetry(node).model_dump(mode="json"), **fields})


def test_an_empty_batch() -> None:
    assert decode_batch(NodeTelemetry, []) == Decoded([], [], [])


def test_a_clean_batch_decodes_with_offsets() -> None:
    expected = [telemetry(f"n{i}", queue_depth=i) for i in range(5)]
    out = decode_batch(NodeTelemetry, recs([to_bytes(t) for t in expected]))
    assert out.items == expected
    assert out.offsets == [100, 101, 102, 103, 104]
    assert out.dead == []


def test_a_mixed_batch_keeps_every_good_record_and_dead_letters_exactly_the_bad_ones() -> None:
    values: list[bytes | None] = [
        good("a"),  # 100
        b'{"ts_ms": 1, "node_id": ',  # 101 malformed JSON
        good("b"),  # 102
        raw("c", queue_depth=-4),  # 103 schema-invalid
        b"",  # 104 empty
        None,  # 105 tombstone
        raw("d", surprise=1),  # 106 unknown field
        good("e"),  # 107
    ]
    records = recs(values)
    out = decode_batch(NodeTelemetry, records)
    assert [t.node_id for t in out.items] == ["a", "b", "e"]
    assert out.offsets == [100, 102, 107]
    assert [d.offset for d in out.dead] == [101, 103, 104, 105, 106]
    for d in out.dead:
        r = records[d.offset - 100]
        assert (d.topic, d.partition, d.key, d.value, d.timestamp_ms) == (
            TOPIC,
            3,
            b"p",
            r.value,
            r.timestamp,
        )
    reasons = {d.offset: d.reason for d in out.dead}
    assert reasons[101].startswith("json_invalid: Invalid JSON: ")
    assert reasons[103] == "greater_than_equal: queue_depth: Input should be greater than or equal to 0"
    # the reason says what was wrong, and its kind (what counters group by) is not an exception's name
    assert reasons[104] == reasons[105] == "empty-value: the record has no value (a tombstone or zero bytes)"
    assert out.dead[2].kind == "empty-value"
    assert reasons[106] == "extra_forbidden: surprise: unknown field"


def test_a_record_level_rule_is_a_readable_reason() -> None:
    bad = orjson.dumps({**outcome("a").model_dump(mode="json"), "node_id": None})
    out = decode_batch(RequestOutcome, recs([to_bytes(outcome("a")), bad], topic="fleet.requests"))
    assert out.offsets == [100]
    (d,) = out.dead
    assert d.offset == 101
    assert "needs node_id" in d.reason


def test_a_value_smuggling_two_objects_cannot_shift_the_others() -> None:
    values: list[bytes | None] = [good("a"), good("x") + b"," + good("y"), good("b")]
    out = decode_batch(NodeTelemetry, recs(values))
    assert [t.node_id for t in out.items] == ["a", "b"]
    assert out.offsets == [100, 102]
    assert [d.offset for d in out.dead] == [101]
    assert out.dead[0].reason.startswith("json_invalid")


def test_a_lone_smuggling_value_is_a_dead_letter() -> None:
    out = decode_batch(NodeTelemetry, recs([good("x") + b"," + good("y")]))
    assert (out.items, out.offsets, [d.offset for d in out.dead]) == ([], [], [100])


def test_two_broken_halves_do_not_join_into_two_good_records() -> None:
    """Neither value is JSON on its own; joined with the batch's comma they would read as two
    valid objects. Each record must stand on its own bytes."""
    first = good("x") + b"," + good("y")[:-1]  # an object, then an unclosed one
    second = b'"draining": false}'  # the rest of the unclosed one
    for value in (first, second):
        with pytest.raises(ValueError):
            NodeTelemetry.model_validate_json(value)
    out = decode_batch(NodeTelemetry, recs([first, second]))
    assert out.items == []
    assert [d.offset for d in out.dead] == [100, 101]


def test_the_reason_is_capped() -> None:
    value = raw("a", **{"f" * 2_000: 1})
    (d,) = decode_batch(NodeTelemetry, recs([value])).dead
    assert len(d.reason) == MAX_REASON
    assert d.reason == ("extra_forbidden: " + "f" * 2_000)[:MAX_REASON]


def test_a_short_reason_is_not_padded_and_counts_further_errors() -> None:
    (d,) = decode_batch(NodeTelemetry, recs([raw("a", queue_depth=-1, kv_cache_used_frac=2.0)])).dead
    expected = "greater_than_equal: queue_depth: Input should be greater than or equal to 0 (and 1 more)"
    assert d.reason == expected


def test_dead_letters_carry_the_original_bytes() -> None:
    value = b"\xff\xfe not utf-8"
    (d,) = decode_batch(NodeTelemetry, recs([value])).dead
    assert d == DeadLetter(TOPIC, 3, 100, b"p", value, 1_700_000_000_000, d.reason)
    assert d.reason.startswith("json_invalid")
