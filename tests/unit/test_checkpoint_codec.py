"""The checkpoint codec (format 3): the fast encoder writes the bytes the format's statement
(``tests.oracles.checkpoint.encode_plain``) writes, on real shard states and hostile values; every
value decodes back to itself bit for bit (types, float bits, NaN payloads, array dtypes and bytes);
the pieces a checkpoint is cut into join back into the tree the format states, and a restore never
parses more than a piece in one call; a forged checkpoint (pieces too) only ever raises
``CheckpointError``; format 1 and 2 checkpoints still decode."""

from __future__ import annotations

import dataclasses
import math
import struct
import zlib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgspec
import numpy as np
import orjson
import pytest
from fleetloop.bench.checkpoint import build
from fleetloop.core import checkpoint
from fleetloop.core.checkpoint import CheckpointError, decode, encode
from fleetloop.core.decide.engine import Engine, EngineState, envelope_of
from fleetloop.core.model.fleet import FleetModel, apply, snapshot
from fleetloop.core.shard import Shard
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas import Tick
from fleetloop.sim.fleet import FleetSim
from fleetloop.sim.runner import EPOCH_MS, under_scenario_slo
from fleetloop.sim.scenario import load_scenario
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from tests.oracles.checkpoint import _enc_plain, encode_plain
from tests.support.checkpoints import tree_of

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def same(a: Any, b: Any, path: str = "v") -> None:
    """``a`` and ``b`` are the same value bit for bit: the same types all the way down, floats with
    the same 8 bytes, arrays with the same dtype, shape and bytes, instances with the same fields."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, float):
        assert struct.pack(">d", a) == struct.pack(">d", b), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype, path
        assert a.dtype.str == b.dtype.str, path
        assert a.shape == b.shape, path
        if a.dtype.kind == "O":
            for i, (x, y) in enumerate(zip(a.ravel().tolist(), b.ravel().tolist(), strict=True)):
                same(x, y, f"{path}[{i}]")
        else:
            assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, np.generic):
        assert a.dtype.str == b.dtype.str, path
        same(a.item(), b.item(), path)
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert len(a) == len(b), path
        for (k, x), (j, y) in zip(a.items(), b.items(), strict=True):
            same(k, j, f"{path}.key")
            same(x, y, f"{path}[{k!r}]")
    elif isinstance(a, set | frozenset):
        assert sorted(map(encode_plain, a)) == sorted(map(encode_plain, b)), path  # element types too
    elif isinstance(a, BaseModel | msgspec.Struct) or dataclasses.is_dataclass(a) or hasattr(a, "__slots__"):
        fields = checkpoint._ordered_fields(type(a))
        assert fields, path
        for f in fields:
            same(getattr(a, f), getattr(b, f), f"{path}.{f}")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def round_trip(value: Any) -> Any:
    """Encode ``value`` (the fast encoder, held to the statement), decode it, check it is ``value``."""
    blob = encode(value)
    assert blob == encode_plain(value)
    back = decode(blob)
    same(back, value)
    assert encode(back) == blob
    return back


# -- real states ------------------------------------------------------------------------------


@cache
def bench_shard(n_nodes: int, seconds: int) -> Shard:
    return build(n_nodes, seconds)


def sim_state(scenario: str, ticks: int) -> dict[str, Any]:
    """The model and every pool's engine state after ``ticks`` of a scenario (the sim's own loop)."""
    sc = load_scenario(SCENARIOS / f"{scenario}.yaml")
    policy = under_scenario_slo(builtin_policy("default"), sc)
    sim = FleetSim(sc, sc.seed, start_ms=EPOCH_MS)
    engine, env, model = Engine(policy), envelope_of(policy), FleetModel()
    pools = sorted(p.id for p in sc.pools)
    for n in range(1, ticks + 1):
        t = EPOCH_MS + n * policy.tick_ms
        emitted = sim.advance_to(t)
        model = apply(model, [*emitted.telemetry, *emitted.outcomes])
        snap = snapshot(model, t, window_ms=env.window_ms, stale_after_ms=env.stale_after_ms)
        for result in engine.tick_many(snap, [Tick(ts_ms=t, tick_id=n, pool_id=p) for p in pools]):
            sim.apply(result.decisions)
    return {"model": model, "states": dict(engine.pools)}


@pytest.mark.parametrize(("n_nodes", "seconds"), [(1000, 12), (10_000, 2)])
def test_a_bench_fleets_shard_round_trips_bit_for_bit(n_nodes: int, seconds: int) -> None:
    shard = bench_shard(n_nodes, seconds)
    value = shard.checkpoint_value()
    round_trip(value)
    restored = Shard.from_checkpoint(decode(encode(value)))
    assert encode(restored.checkpoint_value()) == encode(value)


@pytest.mark.parametrize("scenario", ["cascade-degraded-gpu", "autonomous-workflows"])
def test_a_state_after_a_sim_run_round_trips_bit_for_bit(scenario: str) -> None:
    state = sim_state(scenario, 90)
    assert all(isinstance(s, EngineState) for s in state["states"].values())
    round_trip(state)


def test_a_shard_holding_hostile_values_round_trips() -> None:
    """Hostile values planted in a real shard's model and states (where the schema would let them
    in, and beyond): the fast encoder meets them mid-run, among plain values."""
    shard = Shard.from_checkpoint(decode(encode(bench_shard(1000, 12).checkpoint_value())))
    node = next(iter(shard.model.nodes.values()))
    row = next(iter(node.win.buckets.values()))
    row[1] = math.nan
    row[2] = -0.0
    row[3] = 1e308
    next(iter(shard.model.pools.values())).win.buckets[2**62] = [math.inf, -math.inf, 0.0, 1.0, 2.0, 3.0, 4.0]
    shard.model.ledger.fleet_cost_nusd = 10**400
    shard.model.watermark_ms = 2**63
    round_trip(shard.checkpoint_value())


# -- hostile values ---------------------------------------------------------------------------


def nan_with(payload: int, sign: int = 0) -> float:
    (x,) = struct.unpack(">d", ((sign << 63) | (0x7FF << 52) | payload).to_bytes(8, "big"))
    return float(x)


HOSTILE_FLOATS = [
    math.nan,
    -math.nan,
    nan_with(1),
    nan_with(0xDEADBEEF, sign=1),
    nan_with((1 << 52) - 1),
    math.inf,
    -math.inf,
    -0.0,
    0.0,
    1e308,
    -1e308,
    5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    0.1,
]
HOSTILE_INTS = [
    0,
    -1,
    2**53 + 1,
    2**62,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**63),
    -(2**63) - 1,
    10**400,
    -(10**400),
    10**5000,  # beyond int's default decimal digits limit: written in hex
]


def hostile_values() -> Iterator[Any]:
    yield from HOSTILE_FLOATS
    yield from HOSTILE_INTS
    yield [*HOSTILE_FLOATS, *HOSTILE_INTS, None, True, False, "", "é", "\x00"]
    yield [[1.0, 2.0], [3.0, math.nan]]  # rows, one not plain
    yield [[1.0, 2.0], [3.0, 4]]  # an int among float rows
    yield [[1.0, 2.0], (3.0, 4.0)]  # a tuple among rows
    yield [[1e308, 1e308], [1e308, 1.0]]  # finite values whose sum is not
    yield [[1.0, 2**64], [3.0, 4.0]]
    yield [1.0, 10**400]
    yield [True, 1, 1.0, 2**63]
    yield (1, (2, (3, ())), [], {}, set(), frozenset())
    yield {"a": 1, 2: "b", (1, "x"): [1.0], None: None, 1.5: frozenset({1, 2}), frozenset({"x"}): ()}
    yield {f"node-{i}": float(i) for i in range(100_000)}  # 100,000 new ids
    yield {f"id-{i}": (i, f"w{i}", i * 0.5) for i in range(100_000)}
    yield {1, 2, "x", (1, 2), frozenset({3}), None, math.inf}
    yield frozenset({(1, frozenset({2.0, -0.0})), "a"})
    yield [set(), frozenset(), (), [], {}]
    for dtype in (
        "<f8",
        ">f8",
        "<f4",
        "<i8",
        ">i8",
        "<i4",
        "<i2",
        "|i1",
        "|u1",
        "<u8",
        "|b1",
        "<c16",
        "<M8[ms]",
        "<m8[s]",
    ):
        base = np.arange(24).reshape(2, 3, 4)
        yield base.astype(dtype)
        yield np.zeros((0, 3), dtype=dtype)  # empty
        yield base.astype(dtype)[:, ::2, 1:]  # non-contiguous
        yield np.asfortranarray(base.astype(dtype))
        yield np.array(base.astype(dtype)[1, 2, 3])  # 0-d
        if dtype[1] not in "cmM":  # (their scalars' .item() is a complex or a datetime: no state's)
            yield base.astype(dtype).ravel()[5]  # a numpy scalar
    yield np.array([math.nan, nan_with(7, sign=1), -0.0, math.inf, 1e308])
    yield np.array(["a", "bc"])
    yield np.array([1, "x", None, (1, 2)], dtype=object)
    yield np.float64(math.nan)
    yield np.int64(-(2**63))
    yield np.uint64(2**64 - 1)
    yield np.bool_(True)
    yield [np.float64(1.5), 1.5, np.int32(3), 3]  # numpy scalars among plain ones stay numpy scalars


@pytest.mark.parametrize("value", list(hostile_values()), ids=lambda v: type(v).__name__)
def test_hostile_values_round_trip_bit_for_bit(value: Any) -> None:
    round_trip(value)


def test_another_mapping_is_kept_as_a_dict() -> None:
    """A MappingProxyType in a frozen state decodes as a dict with the same items."""
    value = {"m": MappingProxyType({"k": (1, 2), "z": [1.0, math.nan]})}
    assert encode(value) == encode_plain(value)
    back = decode(encode(value))
    same(back, {"m": {"k": (1, 2), "z": [1.0, math.nan]}})


def test_far_future_timestamps_and_extreme_values_in_a_model_round_trip() -> None:
    """The schema's limits (far-future event time, the largest latency and cost) folded in."""
    from fleetloop.schemas.base import MAX_EPOCH_MS, MAX_USD
    from tests.support.records import outcome, telemetry

    model = FleetModel()
    model.fold_telemetry(telemetry("p/a", ts_ms=MAX_EPOCH_MS, ttft_p99_ms=604_800_000.0))
    model.fold_outcome(outcome("p/a", ts_ms=MAX_EPOCH_MS - 5, cost_usd=MAX_USD))
    model.fold_telemetry(telemetry("q/b", pool="q", ts_ms=1, kv_cache_used_frac=-0.0))
    round_trip(model)


scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**62, max_value=2**66)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(width=32)
    | st.text(max_size=5)
)
hashables = st.recursive(
    scalars, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3), max_leaves=8
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.lists(st.lists(st.floats(allow_nan=True) | st.integers(), max_size=4), max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(hashables, inner, max_size=4)
        | st.sets(hashables, max_size=4)
        | st.frozensets(hashables, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(values)
def test_generated_values_encode_as_the_statement_and_round_trip(value: Any) -> None:
    round_trip(value)


# -- format 3: the tree in pieces ------------------------------------------------------------


def stated_tree(value: Any, format_: int = 3) -> dict[str, Any]:
    """The tree the format states for ``value``, as one document."""
    classes: dict[str, list[str]] = {}
    v = _enc_plain(value, classes)
    return {"format": format_, "classes": dict(sorted(classes.items())), "v": v}


def test_a_large_checkpoint_is_pieces_that_join_back_into_the_stated_tree() -> None:
    value = bench_shard(1000, 12).checkpoint_value()
    data = encode(value)
    documents = checkpoint.documents(data)
    assert len(documents) > 5
    assert max(map(len, documents)) <= checkpoint.PIECE_BYTES
    assert orjson.dumps(tree_of(data)) == orjson.dumps(stated_tree(value))


def test_a_restore_parses_no_more_than_a_piece_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """What bounds the loop's stall while a thread restores: the interpreter is handed back between
    calls, and the parse is the one long call (one 28 MB document at 10,000 nodes was 160-220 ms)."""
    value = bench_shard(1000, 12).checkpoint_value()
    data = encode(value)
    parsed: list[int] = []
    loads = orjson.loads

    def spy(raw: bytes) -> Any:
        parsed.append(len(raw))
        return loads(raw)

    monkeypatch.setattr(orjson, "loads", spy)
    back = decode(data)
    monkeypatch.undo()
    assert sum(parsed) >= len(orjson.dumps(stated_tree(value)))  # the whole tree was parsed (1.9 MB)...
    assert max(parsed) <= 256 * 1024  # ...a piece at a time (PIECE_BYTES)
    assert encode(back) == data


def test_a_format_2_checkpoint_still_restores_exactly() -> None:
    """As the format 2 encoder wrote it (the same tree, one document, one zlib stream): it decodes
    to the state, which restores a shard, and is then written in format 3, byte for byte as the
    state itself is."""
    value = bench_shard(1000, 12).checkpoint_value()
    old = zlib.compress(orjson.dumps(stated_tree(value, 2)), 1)
    assert len(checkpoint.documents(old)) == 1
    back = decode(old)
    same(back, value)
    assert encode(back) == encode(value)
    restored = Shard.from_checkpoint(back)
    assert encode(restored.checkpoint_value()) == encode(value)


@pytest.fixture
def tiny_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of a few bytes and short lists of two: the cut falls everywhere (instances' field
    lists, a piece's elements naming pieces, plain runs in slices)."""
    monkeypatch.setattr(checkpoint, "PIECE_BYTES", 40)
    monkeypatch.setattr(checkpoint, "_MANY", 2)


@pytest.mark.usefixtures("tiny_pieces")
def test_a_state_cut_everywhere_round_trips_bit_for_bit() -> None:
    value = bench_shard(64, 3).checkpoint_value()
    round_trip(value)
    data = encode(value)
    assert len(checkpoint.documents(data)) > 1000
    assert orjson.dumps(tree_of(data)) == orjson.dumps(stated_tree(value))
    assert encode(Shard.from_checkpoint(decode(data)).checkpoint_value()) == data


@settings(max_examples=300, deadline=None)
@given(values)
def test_generated_values_cut_everywhere_round_trip(value: Any) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint, "PIECE_BYTES", 24)
        mp.setattr(checkpoint, "_MANY", 2)
        round_trip(value)
        assert orjson.dumps(tree_of(encode(value))) == orjson.dumps(stated_tree(value))


# -- forged checkpoints ----------------------------------------------------------------------


def blob(tree: Any) -> bytes:
    return zlib.compress(orjson.dumps(tree))


def v2(value: Any, classes: dict[str, Any] | None = None) -> bytes:
    return blob({"format": 2, "classes": classes or {}, "v": value})


FORGED = [
    (v2({"$o": "os:system", "f": []}, {"os:system": []}), "not a fleetloop state class"),
    (v2({"$o": "builtins:eval", "f": ["1"]}, {"builtins:eval": ["x"]}), "not a fleetloop state class"),
    (
        v2({"$o": "fleetloop.clock:monotonic_s", "f": []}, {"fleetloop.clock:monotonic_s": []}),
        "not a class",
    ),
    (
        v2({"$o": "fleetloop.daemon.runtime:Daemon", "f": []}, {"fleetloop.daemon.runtime:Daemon": []}),
        "not a state class",
    ),
    (
        v2({"$o": "fleetloop.core.model.windows:Window", "f": [{}, 3]}),
        "not in the checkpoint's class table",
    ),
    (
        v2(
            {"$o": "fleetloop.core.model.windows:Window", "f": [{}]},
            {"fleetloop.core.model.windows:Window": ["buckets", "width"]},
        ),
        "2 fields named",
    ),
    (
        v2(
            {"$o": "fleetloop.core.model.windows:Window", "f": [{"$m": [], "v": []}, 3, 4]},
            {"fleetloop.core.model.windows:Window": ["buckets", "width", "x"]},
        ),
        "fields changed",
    ),
    (
        v2(
            {"$o": "fleetloop.core.model.windows:Window", "f": []},
            {"fleetloop.core.model.windows:Window": "buckets"},
        ),
        "bad field list",
    ),
    (v2({"$o": 0, "f": []}), "not in the checkpoint's class table"),
    (v2({"$a": "|O", "shape": [1], "b": "AAAAAAAAAAA="}), "cannot be written as bytes"),
    (v2({"$a": "<f8", "shape": [2], "b": "AAAAAAAAAAA="}), "do not fit its shape"),
    (v2({"$a": "<f8", "shape": [-1], "b": ""}), "bad array shape"),
    (v2({"$a": "<f8", "shape": [1], "b": "not base64!"}), "not base64"),
    (v2({"$d": "zz"}), "malformed"),
    (v2({"$d": "00"}), "malformed"),
    (v2({"$i": "ten"}), "malformed"),
    (v2({"$m": [[1]], "v": [1]}), "malformed"),  # an unhashable key
    (v2({"$m": [1, 2], "v": [1]}), "malformed"),
    (v2({"$s": [[1]], "frozen": True}), "malformed"),
    (v2({"$x": 1}), "unknown tag"),
    (blob({"format": 2, "v": 1}), "malformed"),
    (blob({"format": 4, "classes": {}, "pieces": [], "v": 1}), "another format"),
    (blob([1, 2]), "another format"),
    (b"not zlib", "not readable"),
    (zlib.compress(b"{not json"), "not readable"),
]


@pytest.mark.parametrize(("data", "message"), FORGED)
def test_a_forged_checkpoint_only_raises_checkpoint_error(data: bytes, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        decode(data)


def v3(value: Any, pieces: Any = (), classes: Any = None, sizes: Any = None) -> bytes:
    """A format 3 checkpoint: the head (``sizes``: its piece lengths, by default the true ones) and
    ``pieces`` (JSON values, or bytes written as they are)."""
    packed = [p if isinstance(p, bytes) else zlib.compress(orjson.dumps(p)) for p in pieces]
    lengths = [len(p) for p in packed] if sizes is None else sizes
    head = {"format": 3, "classes": classes or {}, "pieces": lengths, "v": value}
    return zlib.compress(orjson.dumps(head)) + b"".join(packed)


def nested(depth: int) -> bytes:
    """A list ``depth`` deep, as JSON (deeper than orjson writes)."""
    return b"[" * depth + b"1" + b"]" * depth


WINDOW = "fleetloop.core.model.windows:Window"
FORGED_PIECES = {
    "index out of range": (v3({"$p": [1]}, [[1]]), "piece 1 is not in the checkpoint"),
    "index not an int": (v3({"$p": [True]}, [[1]]), "piece True is not in the checkpoint"),
    "negative index": (v3({"$p": [-1]}, [[1]]), "piece -1 is not in the checkpoint"),
    "reference not a list": (v3({"$p": 0}, [[1]]), "piece reference is not a list"),
    "a piece named twice": (v3({"$p": [0, 0]}, [[1]]), "piece 0 is named twice"),
    "a piece named from two places": (v3([{"$p": [0]}, {"$p": [0]}], [[1]]), "piece 0 is named twice"),
    "a piece naming itself": (v3({"$p": [0]}, [[{"$p": [0]}]]), "piece 0 is named twice"),
    "a piece named nowhere": (v3(1, [[1], [2]]), r"pieces \[0, 1\] are named nowhere"),
    "a piece not a list": (v3({"$p": [0]}, [{"a": 1}]), "piece 0 is not a list"),
    "a piece not zlib": (v3({"$p": [0]}, [b"not zlib"]), "piece 0 is not readable"),
    "a piece cut short": (v3({"$p": [0]}, [zlib.compress(b"[1, 2, 3]")[:-3]]), "piece 0 is not readable"),
    "a piece not JSON": (v3({"$p": [0]}, [zlib.compress(b"[1,")]), "piece 0 is not readable"),
    "lengths short of the bytes": (v3({"$p": [0]}, [[1]]) + b"x", "pieces come to"),
    "lengths past the bytes": (v3(1, sizes=[5]), "pieces come to"),
    "a length of 0": (v3(1, sizes=[0]), "positive ints"),
    "lengths not a list": (v3(1, sizes="5"), "positive ints"),
    "no lengths": (blob({"format": 3, "classes": {}, "v": 1}), "malformed: KeyError"),
    "the head cut short": (v3(1)[:-4], "not readable"),
    "fields in a piece, too few": (
        v3({"$o": WINDOW, "f": {"$p": [0]}}, [[{"$m": [], "v": []}]], {WINDOW: ["buckets", "width"]}),
        "2 fields named",
    ),
    "pieces nested past the stack": (
        v3({"$p": [0]}, [*([{"$p": [i + 1]}] for i in range(3000)), [1]]),
        "malformed: RecursionError",
    ),
    "a format 2 tree nested past the stack": (
        zlib.compress(b'{"format":2,"classes":{},"v":' + nested(1000) + b"}"),
        "malformed: RecursionError",
    ),
}


@pytest.mark.parametrize(("data", "message"), FORGED_PIECES.values(), ids=FORGED_PIECES)
def test_forged_pieces_only_raise_checkpoint_error(data: bytes, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        decode(data)


def test_pieces_are_joined_in_the_order_named() -> None:
    """The format, not where the encoder happens to cut: a list is its pieces' elements in the order
    the reference names them, wherever a list may be (an instance's fields too)."""
    assert decode(v3({"$p": [1, 0]}, [[3, 4], [1, 2]])) == [1, 2, 3, 4]
    assert decode(v3({"$t": {"$p": [0]}}, [[1, {"$p": [1]}], [2.5, 3.5]])) == (1, [2.5, 3.5])
    window = decode(
        v3(
            {"$o": WINDOW, "f": {"$p": [1, 0]}},
            [[5], [{"$m": [7], "v": [{"$p": [2]}]}], [[1.0, 2.0]]],
            {WINDOW: ["buckets", "width"]},
        )
    )
    assert window.width == 5
    assert window.buckets == {7: [[1.0, 2.0]]}


def test_a_forged_struct_is_built_by_msgspec_with_its_checks() -> None:
    from fleetloop.schemas.fast import TELEMETRY_TWIN
    from tests.support.records import telemetry

    tree = orjson.loads(zlib.decompress(encode(TELEMETRY_TWIN.of(telemetry("a/b", ts_ms=1)))))
    fields = tree["classes"][tree["v"]["$o"]]
    tree["v"]["f"][fields.index("gpu_count")] = "many"
    with pytest.raises(CheckpointError, match="gpu_count"):
        decode(blob(tree))


def test_values_that_cannot_be_checkpointed_say_so() -> None:
    class Foreign:
        pass

    with pytest.raises(CheckpointError, match="cannot checkpoint a value of type"):
        encode([1, Foreign()])
    with pytest.raises(CheckpointError, match="cannot checkpoint a value of type"):
        encode_plain([1, Foreign()])
    with pytest.raises(CheckpointError):
        encode("\ud800")  # a lone surrogate: not UTF-8


# -- format 1 -------------------------------------------------------------------------------


def test_a_format_1_checkpoint_still_decodes() -> None:
    """As an older fleetloop wrote it: every instance with its class and field names inline, floats that are
    not finite as their repr."""
    old = {
        "format": 1,
        "v": {
            "$m": [
                [
                    "win",
                    {
                        "$o": "fleetloop.core.model.windows:Window",
                        "f": {"buckets": {"$m": [[5, [1.0, {"$f": "nan"}]]]}, "width": 2},
                    },
                ],
                ["t", {"$t": [1, {"$f": "-inf"}, {"$s": ["a"], "frozen": True}]}],
                ["a", {"$a": "<i8", "shape": [2], "v": [3, 4]}],
                ["s", {"$np": "<f8", "v": 0.5}],
            ]
        },
    }
    got = decode(blob(old))
    assert got["win"].width == 2
    assert got["win"].buckets[5][0] == 1.0
    assert math.isnan(got["win"].buckets[5][1])
    assert got["t"] == (1, -math.inf, frozenset({"a"}))
    same(got["a"], np.array([3, 4], dtype="<i8"))
    same(got["s"], np.float64(0.5))
    with pytest.raises(CheckpointError, match="not a fleetloop state class"):
        decode(blob({"format": 1, "v": {"$o": "os:system", "f": {}}}))
