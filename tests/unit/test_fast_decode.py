"""The msgspec twins (fleetloop.schemas.fast) keep the pydantic models' contract exactly: the same
records accepted with the same values, the same records refused with the same reasons, and the
struct shapes mypy sees match the generated ones."""

from __future__ import annotations

import ast
import json
import math
import zlib
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
from fleetloop.core import checkpoint
from fleetloop.core.model.fleet import FleetModel, snapshot
from fleetloop.daemon.observe.decode import DeadLetter, Door, decode_batch, decode_fast, reason_of
from fleetloop.schemas import fast
from fleetloop.schemas.fast import OUTCOME_TWIN, TELEMETRY_TWIN, Twin, twin_struct
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.telemetry import NodeTelemetry
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError, field_validator
from tests.support.records import bit_fields, outcome, telemetry, to_bytes

NOW = 1_767_225_600_000
TWINS: dict[str, Twin[Any]] = {"telemetry": TELEMETRY_TWIN, "outcome": OUTCOME_TWIN}


def _pydantic(model: type[BaseModel], data: bytes) -> tuple[str, Any]:
    try:
        return "ok", bit_fields(model.model_validate_json(data))
    except ValidationError as exc:
        return "refused", reason_of(exc)


def _twin(tw: Twin[Any], data: bytes) -> tuple[str, Any]:
    try:
        return "ok", bit_fields(tw.validate_json(data))
    except ValidationError as exc:
        return "refused", reason_of(exc)


# -- the shapes ----------------------------------------------------------------------------------------


def _stub_fields() -> dict[str, list[tuple[str, bool]]]:
    """The TYPE_CHECKING stubs in fast.py: class -> [(field, has a default)]."""
    tree = ast.parse(Path(fast.__file__).read_text())
    out: dict[str, list[tuple[str, bool]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in ("TelemetryRec", "OutcomeRec"):
            out[node.name] = [
                (stmt.target.id, stmt.value is not None)
                for stmt in node.body
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
            ]
    return out


@pytest.mark.parametrize("tw", TWINS.values(), ids=TWINS.keys())
def test_the_struct_has_the_models_fields_and_defaults_and_the_stub_says_the_same(tw: Twin[Any]) -> None:
    model, st_ = tw.model, tw.struct
    assert st_.__struct_fields__ == tuple(model.model_fields)
    n = len(st_.__struct_defaults__)
    defaults = dict(zip(st_.__struct_fields__[-n:], st_.__struct_defaults__, strict=True))
    for name, f in model.model_fields.items():
        if f.is_required():
            assert name not in defaults or defaults[name] is msgspec.NODEFAULT
        else:
            assert defaults[name] == f.default
    stub = _stub_fields()[st_.__name__]
    assert stub == [(name, not f.is_required()) for name, f in model.model_fields.items()]


@pytest.mark.parametrize("tw", TWINS.values(), ids=TWINS.keys())
def test_the_struct_carries_the_models_bounds(tw: Twin[Any]) -> None:
    """Every numeric and length bound of the exported JSON Schema, read back from the struct."""
    ours = msgspec.json.schema(tw.struct)
    ours = ours["$defs"][ours["$ref"].split("/")[-1]]
    theirs = tw.model.model_json_schema()
    assert set(ours.get("required", [])) == set(theirs.get("required", []))

    def bounds(prop: dict[str, Any]) -> dict[str, Any]:
        keys = ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "enum", "const")
        found: dict[str, Any] = {k: prop[k] for k in keys if k in prop}
        if "enum" in found:
            found["enum"] = sorted(found["enum"])  # the same values; msgspec sorts them
        for sub in prop.get("anyOf", []):
            found.update({f"any.{k}": v for k, v in bounds(sub).items()})
        if "items" in prop:
            found.update({f"items.{k}": v for k, v in bounds(prop["items"]).items()})
        return found

    for name, prop in theirs["properties"].items():
        mine = bounds(ours["properties"][name])
        expected = bounds(prop)
        # pydantic writes a one-value Literal as enum/const alike; msgspec as enum
        assert {k.replace("const", "enum"): v for k, v in mine.items()} == {
            k.replace("const", "enum"): ([v] if k.endswith("const") else v) for k, v in expected.items()
        }, name


def test_the_identifier_pattern_means_what_pydantics_means() -> None:
    rx = fast.python_pattern(r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]*$")
    assert rx.fullmatch("pool-1/n:0@x_y.z") is not None
    for bad in ("a\n", "-a", "", "a b", "é", "a\x00"):
        assert rx.fullmatch(bad) is None, bad
    with pytest.raises(TypeError):
        fast.python_pattern("abc")  # not anchored: a search, which the twin does not do


def test_a_model_whose_validators_have_no_mirror_cannot_be_twinned() -> None:
    class Checked(BaseModel, extra="forbid", frozen=True):
        x: int

        @field_validator("x")
        @classmethod
        def _even(cls, v: int) -> int:
            return v

    with pytest.raises(TypeError, match="validators"):
        twin_struct(Checked, "CheckedRec")

    class Lax(BaseModel):
        x: int

    with pytest.raises(TypeError, match="forbid"):
        twin_struct(Lax, "LaxRec")


# -- the values: the same records accepted, the same values, the same reasons --------------------------

_hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.sampled_from(
        [10**400, -(10**400), 2**63, 2**64 + 1, 4_102_444_800_000, 4_102_444_800_001, -1, 0, 1, 64, 65]
    ),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e308, -0.0, 5e-324, 1.0, 0.5, 604_800_000.0, 604_800_000.1, 1e-400]),
    st.text(max_size=12),
    st.sampled_from(
        ["5", "1.0", "true", "a\n", "a b", "-a", "x" * 200, "x" * 201, "warm", "ok", "shed", "é", "NaN"]
    ),
)

_raw_numbers = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "1E5", "1.5e12", "-0", "00", "1."])


@st.composite
def _mutated(draw: st.DrawFn, base: dict[str, Any]) -> bytes:
    data = dict(base)
    for key in draw(st.lists(st.sampled_from(sorted(base)), max_size=4, unique=True)):
        action = draw(st.sampled_from(["replace", "replace", "replace", "drop", "nest", "raw"]))
        if action == "replace":
            data[key] = draw(_hostile_scalars)
        elif action == "drop":
            del data[key]
        elif action == "nest":
            data[key] = draw(st.lists(_hostile_scalars, max_size=3))
        else:
            data[key] = f"@@{key}@@"  # replaced by a raw JSON token below
    if draw(st.booleans()):
        data[draw(st.text(max_size=6))] = draw(_hostile_scalars)
    text = json.dumps(data)
    for key in list(data):
        if data[key] == f"@@{key}@@":
            text = text.replace(f'"@@{key}@@"', draw(_raw_numbers))
    if draw(st.integers(0, 9)) == 0:  # a duplicated key: the last one counts, in both
        key = draw(st.sampled_from(sorted(base)))
        text = text[:-1] + f', "{key}": {json.dumps(draw(_hostile_scalars))}}}'
    if draw(st.integers(0, 9)) == 0:
        text = text + draw(st.sampled_from([" ", "\n", "x", ",", "}"]))
    return text.encode()


_TELEMETRY_BASES = [
    telemetry("a", ts_ms=NOW).model_dump(mode="json"),
    telemetry(
        "pool-1/n0", ts_ms=NOW, hot_prefixes=("px-1", "px-2"), ttft_p50_ms=12.5, errors=3, draining=True
    ).model_dump(mode="json"),
]
_OUTCOME_BASES = [
    outcome("a", ts_ms=NOW).model_dump(mode="json"),
    outcome(None, "shed", ts_ms=NOW, task_outcome="failed", cached_prompt_tokens=50).model_dump(mode="json"),
    outcome("n1", "retry", ts_ms=NOW, attempt=2, prefix_digest="d:1", cost_usd=0.25).model_dump(mode="json"),
]


@settings(max_examples=1500, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(*(_mutated(b) for b in _TELEMETRY_BASES), st.binary(max_size=200)))
def test_telemetry_twin_agrees_with_the_model(data: bytes) -> None:
    assert _twin(TELEMETRY_TWIN, data) == _pydantic(NodeTelemetry, data)


@settings(max_examples=1500, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(*(_mutated(b) for b in _OUTCOME_BASES), st.binary(max_size=200)))
def test_outcome_twin_agrees_with_the_model(data: bytes) -> None:
    assert _twin(OUTCOME_TWIN, data) == _pydantic(RequestOutcome, data)


_HOSTILE_VALUES: list[Any] = [
    None, True, False, -1, 0, 1, 9, 10, 64, 65, 100, 101, 2**53, 2**63, 10**400, -(10**400),
    4_102_444_800_000, 4_102_444_800_001, 1e308, -0.0, 5e-324, 0.5, 1.0, 1.5, 604_800_000.0,
    604_800_000.1, 1e9, 1e12, 1e15,
    "5", "1.0", "true", "", "a", "a\n", "\na", "a b", "-a", "a-", "x" * 200, "x" * 201, "é", "a\x00", "NaN",
    "warm", "cold", "ok", "shed", "retry", "succeeded", [], ["a"], ["a\n"], ["x"] * 257, {}, {"a": 1},
]  # fmt: skip


@pytest.mark.parametrize("base", [*_TELEMETRY_BASES, *_OUTCOME_BASES], ids=lambda b: str(sorted(b)[:1]))
def test_every_field_with_every_hostile_value(base: dict[str, Any]) -> None:
    tw = TELEMETRY_TWIN if "gpu_type" in base else OUTCOME_TWIN
    for field in base:
        for value in _HOSTILE_VALUES:
            data = json.dumps({**base, field: value}).encode()
            assert _twin(tw, data) == _pydantic(tw.model, data), (field, value)
        data = json.dumps({k: v for k, v in base.items() if k != field}).encode()
        assert _twin(tw, data) == _pydantic(tw.model, data), ("missing", field)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.floats(allow_nan=False, allow_infinity=False, min_value=0.0, max_value=604_800_000.0))
def test_floats_read_back_bit_for_bit(x: float) -> None:
    """Both parsers round every decimal to the same double (replay is byte-identical either way)."""
    for text in (repr(x), f"{x:.17g}", f"{x:.3e}", f"{x:.25f}"):
        data = to_bytes(outcome("a", ts_ms=NOW)).replace(b'"e2e_ms":100.0', b'"e2e_ms":' + text.encode())
        assert _twin(OUTCOME_TWIN, data) == _pydantic(RequestOutcome, data), text


def test_lax_values_pydantic_accepts_take_the_slow_path_to_the_same_struct() -> None:
    base = telemetry("a", ts_ms=NOW).model_dump(mode="json")
    lax = (("queue_depth", "5"), ("queue_depth", 5.0), ("draining", "true"), ("ts_ms", 1.767e12))
    for field, value in lax:
        data = json.dumps({**base, field: value}).encode()
        kind, _ = _pydantic(NodeTelemetry, data)
        assert kind == "ok", (field, value)
        assert _twin(TELEMETRY_TWIN, data) == _pydantic(NodeTelemetry, data)


def test_the_after_validator_is_mirrored() -> None:
    base = outcome("a", ts_ms=NOW).model_dump(mode="json")
    for fields in ({"cached_prompt_tokens": 101}, {"node_id": None}, {"node_id": None, "outcome": "shed"}):
        data = json.dumps({**base, **fields}).encode()
        assert _twin(OUTCOME_TWIN, data) == _pydantic(RequestOutcome, data)
    refused = json.dumps({**base, "node_id": None}).encode()
    assert _twin(OUTCOME_TWIN, refused)[0] == "refused"
    assert "needs node_id" in _twin(OUTCOME_TWIN, refused)[1]


def test_the_identifier_memo_is_bounded() -> None:
    tw = Twin(RequestOutcome, OUTCOME_TWIN.struct)
    base = outcome("a", ts_ms=NOW).model_dump(mode="json")
    for i in range(fast.MEMO_MAX + 500):
        tw.validate_json(json.dumps({**base, "workflow_id": f"wf{i}"}).encode())
    assert all(len(memo) <= fast.MEMO_MAX + 1 for memo in tw._memo.values())
    with pytest.raises(ValidationError):
        tw.validate_json(json.dumps({**base, "workflow_id": "wf 1"}).encode())


def test_request_ids_are_checked_every_time_and_never_fill_the_memo() -> None:
    """A request id is new on every record: checked against the pattern directly (a memo of them
    would only churn), still refused word for word as pydantic refuses it."""
    tw = Twin(RequestOutcome, OUTCOME_TWIN.struct)
    base = outcome("a", ts_ms=NOW).model_dump(mode="json")
    for i in range(1000):
        tw.validate_json(json.dumps({**base, "request_id": f"r{i}"}).encode())
    assert not any(f"r{i}" in memo for memo in tw._memo.values() for i in range(1000))
    for bad in ("r 1", "r1\n", "-r", "r1\u00e9"):
        data = json.dumps({**base, "request_id": bad}).encode()
        assert _twin(tw, data) == _pydantic(RequestOutcome, data)
        assert _twin(tw, data)[0] == "refused"


def test_an_unmemoized_field_must_be_a_patterned_string() -> None:
    fast._UNMEMOIZED[RequestOutcome] = frozenset({"request_id", "prompt_tokens"})
    try:
        with pytest.raises(TypeError, match="unmemoized"):
            Twin(RequestOutcome, OUTCOME_TWIN.struct)
    finally:
        fast._UNMEMOIZED[RequestOutcome] = frozenset({"request_id"})


# -- through the door: decode_fast == decode_batch --------------------------------------------------------


class _Rec:
    def __init__(self, value: bytes | None, offset: int, broker_ts: int = NOW) -> None:
        self.topic, self.partition, self.offset, self.key = "fleet.telemetry", 0, offset, b"p"
        self.value, self.timestamp = value, broker_ts


def _dead(d: DeadLetter) -> tuple[Any, ...]:
    return (d.offset, d.reason, d.value, d.timestamp_ms)


def test_decode_fast_keeps_decode_batchs_offsets_dead_letters_and_reasons() -> None:
    good = to_bytes(telemetry("a", ts_ms=NOW))
    values: list[bytes | None] = [
        good,
        b'{"ts_ms": 1, "node_id": ',
        None,
        b"",
        b"x" * (200 * 1024),
        to_bytes(telemetry("old", ts_ms=NOW - 3_600_000)),
        to_bytes(telemetry("new", ts_ms=NOW + 3_600_000)),
        json.dumps({**json.loads(good), "queue_depth": -1}).encode(),
        json.dumps({**json.loads(good), "node_id": "a\n"}).encode(),
        json.dumps({**json.loads(good), "surprise": 1}).encode(),
        to_bytes(telemetry("b", ts_ms=NOW, hot_prefixes=("p1", "p2"))),
    ]
    records = [_Rec(v, i) for i, v in enumerate(values)]
    for door in (Door(), Door().without_window()):
        slow = decode_batch(NodeTelemetry, records, door)
        quick = decode_fast(TELEMETRY_TWIN, records, door)
        assert quick.offsets == slow.offsets
        assert [bit_fields(x) for x in quick.items] == [bit_fields(x) for x in slow.items]
        assert [_dead(d) for d in quick.dead] == [_dead(d) for d in slow.dead]
        assert all(type(x) is TELEMETRY_TWIN.struct for x in quick.items)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(st.binary(max_size=200), *(_mutated(b) for b in _OUTCOME_BASES)), min_size=1, max_size=6
    )
)
def test_any_bytes_become_a_struct_or_a_dead_letter_and_folding_never_raises(values: list[bytes]) -> None:
    records = [_Rec(v, i) for i, v in enumerate(values)]
    out = decode_fast(OUTCOME_TWIN, records, Door())
    assert sorted([*out.offsets, *(d.offset for d in out.dead)]) == list(range(len(values)))
    model = FleetModel()
    for item in out.items:
        model.fold(item)
    snapshot(model, NOW)


# -- the model folds either form into the same state ----------------------------------------------------


def _records() -> list[NodeTelemetry | RequestOutcome]:
    out: list[NodeTelemetry | RequestOutcome] = []
    for s in range(30):
        ts = NOW + s * 1000
        for n in range(4):
            pool = f"p{n % 2}"
            out.append(telemetry(f"n{n}", pool=pool, ts_ms=ts, ttft_p50_ms=10.0 + n * 0.1, errors=s % 3))
            kind = ("ok", "error", "timeout", "retry", "shed")[(s + n) % 5]
            out.append(
                outcome(
                    None if kind == "shed" else f"n{n}",
                    kind,
                    pool=f"p{n % 2}",
                    ts_ms=ts + n,
                    n=s * 10 + n,
                    attempt=n % 2,
                    cost_usd=0.001 * (n + 1),
                    ttft_ms=None if kind != "ok" else 33.3 + s,
                    task_outcome="succeeded" if n == 3 else None,
                )
            )
    return out


def test_folding_structs_or_models_gives_the_same_snapshot_and_checkpoint_round_trips() -> None:
    models = _records()
    structs = [(TELEMETRY_TWIN if isinstance(r, NodeTelemetry) else OUTCOME_TWIN).of(r) for r in models]
    a, b = FleetModel(), FleetModel()
    for r in models:
        a.fold(r)
    for s in structs:
        b.fold(s)
    now = NOW + 30_000
    assert snapshot(a, now) == snapshot(b, now)
    restored = checkpoint.decode(checkpoint.encode(b))
    assert snapshot(restored, now) == snapshot(b, now)
    assert all(type(n.telemetry) is TELEMETRY_TWIN.struct for n in restored.nodes.values())


def test_a_forged_struct_in_a_checkpoint_is_refused_not_built() -> None:
    tree = orjson.loads(zlib.decompress(checkpoint.encode(TELEMETRY_TWIN.of(telemetry("a", ts_ms=NOW)))))
    fields = tree["classes"][tree["v"]["$o"]]
    tree["v"]["f"][fields.index("queue_depth")] = -5  # beyond the bounds
    with pytest.raises(checkpoint.CheckpointError, match="queue_depth"):
        checkpoint.decode(zlib.compress(orjson.dumps(tree)))
    assert math.isfinite(1.0)
