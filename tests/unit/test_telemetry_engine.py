"""``NodeTelemetry.engine``: the serving engine on the wire. Written only when set, so a record
without it is what earlier daemons read and a record from an earlier producer decodes; a name
without a runtime profile is a valid record (engine unknown); anything else malformed is a dead
letter with its reason; the fleet model keeps what each node reports, checkpoints included."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from fleetloop.core.checkpoint import decode, encode
from fleetloop.core.model import FleetModel, apply, snapshot
from fleetloop.daemon.observe.decode import decode_batch, decode_fast
from fleetloop.schemas import NodeTelemetry
from fleetloop.schemas.fast import TELEMETRY_TWIN
from tests.support.records import telemetry, telemetry_fields
from tests.unit.test_decode import Rec

NOW = 1_700_000_000_000


def _rec(value: bytes, offset: int = 0) -> Rec:
    return Rec("fleet.telemetry", 0, offset, b"p", value, NOW)


def _both(values: list[bytes]) -> list[tuple[list[Any], list[str]]]:
    """What the door decodes ``values`` into, the model's way and the fast twin's: (items, reasons)."""
    recs = [_rec(v, i) for i, v in enumerate(values)]
    slow = decode_batch(NodeTelemetry, recs)
    fast = decode_fast(TELEMETRY_TWIN, recs)
    return [
        (slow.items, [d.reason for d in slow.dead]),
        (fast.items, [d.reason for d in fast.dead]),
    ]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_an_engine_round_trips_through_the_wire(engine: str) -> None:
    t = telemetry("a", ts_ms=NOW, engine=engine)
    raw = t.model_dump_json().encode()
    assert orjson.loads(raw)["engine"] == engine
    for items, dead in _both([raw]):
        assert dead == []
        (got,) = items
        assert got.engine == engine
    assert NodeTelemetry.model_validate_json(raw) == t


def test_a_record_without_an_engine_is_written_as_before_and_an_old_record_decodes() -> None:
    plain = telemetry("a", ts_ms=NOW)
    assert plain.engine is None
    assert "engine" not in orjson.loads(plain.model_dump_json())  # what earlier daemons read
    assert "engine" not in plain.model_dump(mode="json")
    # A record as an earlier producer wrote it: every field of its day, no engine key.
    old = dict(telemetry_fields("a", ts_ms=NOW), ttft_p50_ms=None, hot_prefixes=[], errors=0)
    for items, dead in _both([json.dumps(old).encode()]):
        assert dead == []
        (got,) = items
        assert got.engine is None


def test_an_engine_without_a_runtime_profile_is_a_valid_record() -> None:
    """Well-formed but unknown to this version: kept as it is (capacity reads it as engine unknown)."""
    raw = json.dumps(telemetry_fields("a", ts_ms=NOW, engine="lmdeploy")).encode()
    for items, dead in _both([raw]):
        assert dead == []
        assert [t.engine for t in items] == ["lmdeploy"]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("vLLM", "string_pattern_mismatch"),  # engine names are lower case, as the engines write them
        ("v llm", "string_pattern_mismatch"),
        ("-vllm", "string_pattern_mismatch"),
        ("vllm\n", "string_pattern_mismatch"),
        ("e" * 33, "string_too_long"),
        ("e" * 10_000, "string_too_long"),
        ("", "string_too_short"),
        (5, "string_type"),
        (["vllm"], "string_type"),
        ({"name": "vllm"}, "string_type"),
        (True, "string_type"),
    ],
)
def test_a_malformed_engine_is_a_dead_letter_naming_the_field(value: Any, error: str) -> None:
    good = json.dumps(telemetry_fields("a", ts_ms=NOW, engine="vllm")).encode()
    bad = json.dumps(telemetry_fields("b", ts_ms=NOW, engine=value)).encode()
    for items, dead in _both([good, bad]):
        assert [t.node_id for t in items] == ["a"]  # the good record beside it is read
        assert len(dead) == 1
        assert dead[0].startswith(f"{error}: engine:"), dead[0]


def test_the_json_schema_states_the_engine_bounds() -> None:
    schema = NodeTelemetry.model_json_schema()
    assert "engine" not in schema["required"]
    (text, _) = schema["properties"]["engine"]["anyOf"]
    assert text["maxLength"] == 32
    assert text["minLength"] == 1
    assert text["pattern"] == "^[a-z0-9][a-z0-9_.-]*$"


def test_the_fleet_model_keeps_each_nodes_engine() -> None:
    model = apply(
        FleetModel(),
        [
            telemetry("a", ts_ms=NOW, engine="sglang"),
            telemetry("b", ts_ms=NOW, engine="lmdeploy"),
            telemetry("c", ts_ms=NOW),
            telemetry("a", ts_ms=NOW + 1_000, engine="trtllm"),  # the newest record's engine
        ],
    )
    snap = snapshot(model, NOW + 1_500)
    assert {n: snap.nodes[n].engine for n in ("a", "b", "c")} == {"a": "trtllm", "b": "lmdeploy", "c": None}
    # A checkpoint keeps it, from the model's records and from the fast twin's.
    back = decode(encode(model))
    assert snapshot(back, NOW + 1_500).nodes["a"].engine == "trtllm"
    fast = apply(FleetModel(), [TELEMETRY_TWIN.of(telemetry("d", ts_ms=NOW, engine="sglang"))])
    assert snapshot(decode(encode(fast)), NOW + 500).nodes["d"].engine == "sglang"
