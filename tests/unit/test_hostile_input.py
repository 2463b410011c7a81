"""Bounds at the door: every number bounded in the schema (and in its JSON Schema export), record
size and event time checked before anything reaches the model, and no bytes whatever that make the
decoder or the model raise."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from fleetloop.core.model import FleetModel
from fleetloop.core.model.fleet import NANO, nano_usd
from fleetloop.daemon.act.publish import MAX_DEAD_LETTER_COPY, MAX_DEAD_LETTER_KEY, dead_letter_record
from fleetloop.daemon.observe.decode import DeadLetter, Door, decode_batch, digest
from fleetloop.schemas import NodeTelemetry, RequestOutcome, Tick
from fleetloop.schemas.export import rendered
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from tests.support.records import outcome, telemetry, tick, to_bytes
from tests.unit.test_decode import Rec

NOW = 1_700_000_000_000
MODELS: dict[str, type[BaseModel]] = {
    "fleet.telemetry": NodeTelemetry,
    "fleet.requests": RequestOutcome,
    "control.ticks": Tick,
}


def rec(value: bytes | None, broker_ts: int = NOW, offset: int = 0, topic: str = "fleet.telemetry") -> Rec:
    return Rec(topic, 0, offset, b"p", value, broker_ts)


def with_fields(record: BaseModel, **fields: Any) -> bytes:
    """A record's JSON with ``fields`` set as is (past the model's own checks), big ints included."""
    data = record.model_dump(mode="json")
    data.update(fields)
    return json.dumps(data).encode()  # the stdlib writes 10**400 and 1e308 as JSON numbers


# -- schema bounds ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "field", "value", "error"),
    [
        (telemetry("a", ts_ms=NOW), "cost_rate_usd_per_h", 1e308, "less_than_equal"),
        (telemetry("a", ts_ms=NOW), "prompt_tokens", 10**400, "less_than_equal"),
        (telemetry("a", ts_ms=NOW), "queue_depth", 10**400, "less_than_equal"),
        (telemetry("a", ts_ms=NOW), "hbm_free_gib", 1e308, "less_than_equal"),
        (telemetry("a", ts_ms=NOW), "ttft_p99_ms", 1e308, "less_than_equal"),
        (telemetry("a", ts_ms=NOW), "ts_ms", 10**400, "less_than_equal"),
        (telemetry("a", ts_ms=NOW), "ts_ms", -1, "greater_than_equal"),
        (telemetry("a", ts_ms=NOW), "errors", -5, "greater_than_equal"),
        (outcome("a", ts_ms=NOW), "cost_usd", 1e308, "less_than_equal"),
        (outcome("a", ts_ms=NOW), "workflow_spend_usd", 1e308, "less_than_equal"),
        (outcome("a", ts_ms=NOW), "prompt_tokens", 10**400, "less_than_equal"),
        (outcome("a", ts_ms=NOW), "e2e_ms", 1e308, "less_than_equal"),
        (outcome("a", ts_ms=NOW), "latency_budget_ms", 10**400, "less_than_equal"),
        (tick(1), "tick_id", 10**400, "less_than_equal"),
    ],
)
def test_values_no_fleet_produces_are_refused_naming_the_field(
    record: BaseModel, field: str, value: Any, error: str
) -> None:
    out = decode_batch(type(record), [rec(with_fields(record, **{field: value}))])
    assert out.items == []
    (d,) = out.dead
    assert d.reason.startswith(f"{error}: {field}:"), d.reason


@pytest.mark.parametrize("text", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b'"nan"', b'"inf"'])
def test_non_finite_numbers_are_refused(text: bytes) -> None:
    value = to_bytes(telemetry("a", ts_ms=NOW)).replace(b'"hbm_free_gib":20.0', b'"hbm_free_gib":' + text)
    assert value != to_bytes(telemetry("a", ts_ms=NOW))
    (d,) = decode_batch(NodeTelemetry, [rec(value)]).dead
    assert "hbm_free_gib" in d.reason


def _numeric_leaves(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if schema.get("type") in ("number", "integer"):
        out.append((path, schema))
    for key, sub in schema.items():
        if isinstance(sub, dict):
            out.extend(_numeric_leaves(sub, f"{path}.{key}" if path else key))
        elif isinstance(sub, list):
            for i, item in enumerate(sub):
                if isinstance(item, dict):
                    out.extend(_numeric_leaves(item, f"{path}.{key}[{i}]"))
    return out


@pytest.mark.parametrize("name", ["NodeTelemetry.json", "RequestOutcome.json", "Tick.json", "Decision.json"])
def test_every_number_in_the_exported_json_schema_has_both_bounds(name: str) -> None:
    leaves = _numeric_leaves(json.loads(rendered()[name]))
    assert leaves
    unbounded = [
        path
        for path, s in leaves
        if ("minimum" not in s and "exclusiveMinimum" not in s)
        or ("maximum" not in s and "exclusiveMaximum" not in s)
    ]
    assert not unbounded, f"{name}: numbers without both bounds: {unbounded}"


def test_the_policy_version_is_bounded_in_the_json_schema() -> None:
    schema = json.loads(rendered()["PolicyDocument.json"])
    version = schema["$defs"]["PolicyMetadata"]["properties"]["version"]
    assert (version["minimum"], version["maximum"]) == (1, 2**53)


# -- money ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("usd", "nano"),
    [(0.0, 0), (1.5, 1_500_000_000), (-3.0, 0), (float("nan"), 0), (1e308, 10**18), (float("inf"), 10**18)],
)
def test_money_conversion_never_overflows(usd: float, nano: int) -> None:
    assert nano_usd(usd) == nano


def test_the_largest_cost_the_schema_accepts_folds() -> None:
    model = FleetModel()
    t = telemetry("a", ts_ms=NOW, cost_rate_usd_per_h=100_000.0, interval_ms=600_000)
    assert model.fold_telemetry(t) is None
    assert model.ledger.fleet_cost_nusd == round(100_000 * 600_000 / 3_600_000 * NANO)  # $16,666.67


# -- size and event time at the door ------------------------------------------------------------------


def test_an_oversized_record_is_refused_before_it_is_parsed() -> None:
    door = Door(max_record_bytes=1000)
    huge = b"{" + b" " * 5000 + b"}"  # parsing it would take the decoder's time; it is never parsed
    out = decode_batch(NodeTelemetry, [rec(huge), rec(to_bytes(telemetry("a", ts_ms=NOW)), offset=1)], door)
    assert [t.node_id for t in out.items] == ["a"]
    (d,) = out.dead
    assert d.reason == "record-too-large: 5002 bytes > 1000"
    assert d.kind == "record-too-large"


def test_the_default_size_bound_fits_the_largest_valid_telemetry() -> None:
    biggest = telemetry("n" * 200, "p" * 200, ts_ms=NOW, hot_prefixes=tuple(f"{i:0200d}" for i in range(256)))
    value = to_bytes(biggest)
    assert len(value) < Door().max_record_bytes
    assert decode_batch(NodeTelemetry, [rec(value)], Door()).items == [biggest]


@pytest.mark.parametrize(
    ("ts_ms", "accepted", "why"),
    [
        (NOW, True, ""),
        (NOW - 600_000, True, ""),
        (NOW + 30_000, True, ""),
        (NOW - 600_001, False, "before"),
        (NOW + 30_001, False, "after"),
        (NOW // 1000, False, "before"),  # seconds, not milliseconds
        (4_102_444_800_000, False, "after"),  # the year 2100
    ],
)
def test_event_time_is_accepted_only_within_the_window_around_the_broker_timestamp(
    ts_ms: int, accepted: bool, why: str
) -> None:
    for record in (
        telemetry("a", ts_ms=ts_ms),
        outcome("a", ts_ms=ts_ms),
        Tick(ts_ms=ts_ms, tick_id=1, pool_id="p"),
    ):
        out = decode_batch(type(record), [rec(to_bytes(record))], Door())
        assert (len(out.items), len(out.dead)) == ((1, 0) if accepted else (0, 1))
        if not accepted:
            kind = "event-time-too-old" if why == "before" else "event-time-too-new"
            assert out.dead[0].reason.startswith(f"{kind}: ")
            assert f"s {why} the broker timestamp {NOW}" in out.dead[0].reason


def test_a_record_without_a_broker_timestamp_is_not_checked_and_the_window_can_be_turned_off() -> None:
    value = to_bytes(telemetry("a", ts_ms=1000))
    assert len(decode_batch(NodeTelemetry, [rec(value, broker_ts=-1)], Door()).items) == 1
    assert len(decode_batch(NodeTelemetry, [rec(value)], Door().without_window()).items) == 1
    assert len(decode_batch(NodeTelemetry, [rec(value)], Door()).dead) == 1


# -- dead-letter copies that always fit --------------------------------------------------------------


def test_a_dead_letter_too_big_to_copy_carries_a_truncated_copy_and_a_digest() -> None:
    value = b"x" * (1024 * 1024)
    key = b"k" * 5000
    d = DeadLetter("fleet.telemetry", 0, 7, key, value, NOW, "record-too-large: 1048576 bytes > 131072")
    out_key, out_value, headers = dead_letter_record(d, "decode")
    h = dict(headers)
    assert out_value == value[:MAX_DEAD_LETTER_COPY]
    assert out_key == key[:MAX_DEAD_LETTER_KEY]
    assert h["fleetloop.truncated"] == b"1048576"
    assert h["fleetloop.sha256"] == digest(value).encode()
    assert h["fleetloop.key_truncated"] == b"5000"
    assert h["fleetloop.key_sha256"] == digest(key).encode()
    assert len(out_value) + len(out_key or b"") + sum(len(k) + len(v) for k, v in headers) < 100_000


def test_a_small_dead_letter_is_copied_whole() -> None:
    d = DeadLetter("fleet.telemetry", 0, 7, b"p", b"{bad", NOW, "json_invalid: ...")
    key, value, headers = dead_letter_record(d, "decode")
    assert (key, value) == (b"p", b"{bad")
    assert "fleetloop.truncated" not in dict(headers)


# -- any bytes in: a model or a dead letter, never an exception -----------------------------------------

_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([10**400, -(10**400), 1e308, -1e308, 5e-324, 2**63, 2**64 + 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)


def _mutated(base: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """A valid record with some fields replaced by anything JSON can hold (or removed, or added)."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        data = dict(base)
        for key in draw(st.lists(st.sampled_from(sorted(base)), max_size=4, unique=True)):
            action = draw(st.sampled_from(["replace", "replace", "drop", "nest"]))
            if action == "replace":
                data[key] = draw(_json_scalars)
            elif action == "drop":
                del data[key]
            else:
                data[key] = draw(st.lists(_json_scalars, max_size=3))
        if draw(st.booleans()):
            data[draw(st.text(max_size=10))] = draw(_json_scalars)
        return json.dumps(data).encode()

    return build()


_any_bytes = st.one_of(
    st.binary(max_size=300),
    _mutated(telemetry("a", ts_ms=NOW).model_dump(mode="json")),
    _mutated(outcome("a", ts_ms=NOW).model_dump(mode="json")),
    _mutated(tick(1).model_dump(mode="json")),
    st.sampled_from([b"[]", b"{}", b"null", b"0", b'""', b"[" * 10_000, b'{"a":' * 5_000]),
)


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_any_bytes, min_size=1, max_size=8), st.sampled_from(sorted(MODELS)))
def test_any_bytes_become_a_model_or_a_dead_letter_and_folding_never_raises(
    values: list[bytes], topic: str
) -> None:
    records = [rec(v, offset=i, topic=topic) for i, v in enumerate(values)]
    model_cls = MODELS[topic]
    out = decode_batch(model_cls, records, Door())
    assert sorted([*out.offsets, *(d.offset for d in out.dead)]) == list(range(len(values)))
    assert all(d.reason for d in out.dead)
    model = FleetModel()
    for item in out.items:
        if isinstance(item, NodeTelemetry):
            model.fold_telemetry(item)
        elif isinstance(item, RequestOutcome):
            model.fold_outcome(item)
    from fleetloop.core.model import snapshot

    snapshot(model, NOW)  # and what was folded can be read back


def test_orjson_refuses_what_the_decoder_refuses() -> None:
    """The dead letter keeps the original bytes, whatever they are (not re-encoded)."""
    value = with_fields(telemetry("a", ts_ms=NOW), prompt_tokens=10**400)
    (d,) = decode_batch(NodeTelemetry, [rec(value)]).dead
    assert d.value == value
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(value)


# -- fleetloop run's door flags --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--event-time-window", "ten"], "--event-time-window wants PAST_S,FUTURE_S"),
        (["--event-time-window", "600"], "--event-time-window wants PAST_S,FUTURE_S"),
        (["--event-time-window=-1,30"], "--event-time-window: PAST_S 0..2592000"),
        (["--max-record-bytes", "10"], "--max-record-bytes must be between 1024"),
    ],
)
def test_run_refuses_a_bad_door_flag_in_one_line(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetloop.cli.main import main

    assert main(["run", "--bootstrap-servers", "127.0.0.1:1", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_the_door_flags_make_the_door() -> None:
    from fleetloop.cli.commands import door_from

    assert door_from("600,30", 131072) == Door()
    assert door_from("off", 4096) == Door(4096, None, None)
    assert door_from("3600,5", 131072) == Door(131072, 3_600_000, 5_000)
