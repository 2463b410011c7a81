"""Checkpoints: a shard's exact state as bytes, and back (no I/O; the runtime does the Kafka part).

Why a checkpoint and not a warm-up re-read. The state behind a decision is not a function of any
bounded suffix of the inputs: the workflow ledger counts every task since the start, Envoy's
ejection count and backoff grow with every ejection, HPA keeps scale events and the predictive
autoscaler its demand history. Re-reading "the last N records" therefore gives a state that is
only close to the one a continuous run has (an ejection count that restarts lower). Instead the
runtime writes, every few seconds, each shard's fleet model and policy state together with the
input offsets and the last tick they reflect, to the compacted ``control.checkpoint`` topic; a new
owner restores the newest complete checkpoint and folds exactly the records between its offsets
and the end through the same code path (:mod:`fleetloop.core.shard`), deciding the ticks in
between again without publishing the ones already published. Restore + fold-forward is the
continuous computation, so the state is equal, not approximately equal.

Encoding (stated value by value above ``_INT_LO``). A tagged JSON tree compressed with zlib:
floats are written with the shortest repr that reads back to the same double (orjson), so values
round-trip bit for bit, and a float that is not finite as its 8 bytes (a NaN keeps its sign and
payload); ints beyond 64 bits, tuples, dicts, sets, numpy scalars and instances are tagged; a
numpy array of numbers is its raw bytes with dtype and shape. Each state class's field names are
written once per checkpoint (``"classes"``), an instance as its values in that order. Only classes
defined in ``fleetloop`` modules that are dataclasses, pydantic models, msgspec structs or listed
in ``_SLOTTED`` can be named, and decoding never calls a constructor or any code of theirs (fields
are set on a bare instance; slots a class names in ``_TRANSIENT``, state derived from the rest
such as the model's snapshot caches, are not written; a decoded instance gets the plain values
that mapping gives; a struct is built by msgspec from its values, checked), so a forged
checkpoint can at worst produce a wrong state, never run code. A dataclass field added since a
checkpoint was written decodes as its declared default (a field without a default, or one removed,
does not decode). A value that does not decode (for example written by another fleetloop version
whose state classes changed) raises :class:`CheckpointError`; the runtime then starts that shard
clean and says so. Format 1 (the earlier format: every instance with its class and field names,
every list element tagged one by one) and format 2 (this tree as one JSON document) are still
decoded.

Layout (format 3, above ``PIECE_BYTES``). The tree is written as a head and pieces of about
``PIECE_BYTES`` of JSON each, every one its own zlib stream, parsed by its own ``orjson.loads``
call: a restore decodes in a thread, and the loop gets the interpreter back between pieces instead
of waiting out one parse of the whole document (160-220 ms at 10,000 nodes).

Cost (``fleetloop bench checkpoint``): the encoder resolves each class's fields once and passes
runs of plain values (a window's row of finite floats, a struct's scalar fields) to orjson as they
are, without a Python call per element; an int beyond 64 bits makes orjson refuse that tree, and
the value is then encoded again with every int checked.

Chunking. A checkpoint larger than ``CHUNK_BYTES`` is split over several records; records are
written to one of two slots alternately (``<group>/<partition>/<slot>/<chunk>``), so a crash while
writing one slot leaves the other complete, and compaction keeps exactly the newest of each key.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import importlib
import math
import operator
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import chain
from typing import Any

import msgspec
import numpy as np
import orjson
from pydantic import BaseModel

FORMAT = 3
OLD_FORMATS = frozenset({1, 2})  # still decoded: a fleet upgraded in place restores what it wrote before
CHUNK_BYTES = 512 * 1024  # under every broker's default max message size (1 MB) with headers


class CheckpointError(ValueError):
    """A checkpoint that cannot be decoded into a state this code can use."""


# State classes that are neither dataclasses, pydantic models nor msgspec structs: their slots are
# their fields.
_SLOTTED = frozenset({"fleetloop.core.model.fleet:FleetModel", "fleetloop.core.model.windows:Window"})


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


# -- encoding: the tree --------------------------------------------------------------------------
#
# The tree is ``{"format": 2, "classes": {name: [field, ...], ...}, "v": value}`` (classes sorted by
# name; format 2 wrote it as one document, format 3 in pieces, below), where a value is written as:
# - None, a bool, a str, an int in [-2**63, 2**64): itself; any other int: ``{"$i": hex(n)}``;
# - a finite float: itself (orjson writes the shortest repr that reads back to the same double);
#   inf, -inf, NaN: ``{"$d": its 8 bytes, big-endian, in hex}`` (a NaN keeps its sign and payload);
# - a list: a JSON array of its values; a tuple: ``{"$t": [its values]}``;
# - a dict (or another Mapping): ``{"$m": [its keys], "v": [its values]}``, keys written first;
# - a set or frozenset: ``{"$s": [its values, sorted by their JSON], "frozen": bool}``;
# - a numpy scalar: ``{"$np": dtype, "v": its .item()}``; a numpy array whose dtype is numbers,
#   bools or times: ``{"$a": dtype, "shape": [..], "b": its bytes in C order, base64}``, any other
#   array: ``{"$a": dtype, "shape": [..], "v": [its values, flattened]}``;
# - an instance of a state class: ``{"$o": its class name, "f": [its values in the order the
#   class's entry in "classes" lists the fields]}``.
# ``_Encoder`` writes it with runs of plain values passed through unvisited;
# ``tests.oracles.checkpoint`` states it one value at a time (``tests/unit/test_checkpoint_codec.py``
# holds the two equal).

_INT_LO, _INT_HI = -(2**63), 2**64  # the ints orjson writes as JSON numbers
_RAW_KINDS = frozenset("biufcmM")  # array dtypes whose bytes are the values (no object pointers)
_SCALARS = frozenset({str, int, bool, type(None)})  # written as they are (an int: within 64 bits)
_NUMBERS = frozenset({float, int, bool})
_LISTS = frozenset({list})


def _bits(x: float) -> dict[str, str]:
    return {"$d": struct.pack(">d", x).hex()}


@dataclass(frozen=True, slots=True)
class _Class:
    """How the instances of one state class are written: its name and fields (read in one call)."""

    name: str
    fields: tuple[str, ...]
    get: Callable[[Any], Any]


def _ordered_fields(cls: type) -> tuple[str, ...]:
    if issubclass(cls, BaseModel):
        return tuple(cls.model_fields)
    if issubclass(cls, msgspec.Struct):
        return tuple(cls.__struct_fields__)
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    names: list[str] = []
    transient = getattr(cls, "_TRANSIENT", ())
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for s in (slots,) if isinstance(slots, str) else slots:
            if s not in names and not s.startswith("__") and s not in transient:
                names.append(s)
    return tuple(names)


def _getter(fields: tuple[str, ...]) -> Callable[[Any], Any]:
    if len(fields) >= 2:
        return operator.attrgetter(*fields)  # a tuple of the values, in one C call
    if fields:
        one = operator.attrgetter(fields[0])
        return lambda o: (one(o),)
    return lambda o: ()


_KINDS: dict[type, str | _Class] = {}


def _kind(cls: type) -> str | _Class:
    """How a value of type ``cls`` (not a plain scalar, float, list, tuple or dict) is written."""
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _KINDS[cls] = _kind_of(cls)
    return kind


def _kind_of(cls: type) -> str | _Class:
    if cls is set or cls is frozenset:
        return "set"
    if issubclass(cls, np.generic):
        return "npscalar"
    if issubclass(cls, np.ndarray):
        return "array"
    if (
        issubclass(cls, (BaseModel, msgspec.Struct))
        or dataclasses.is_dataclass(cls)
        or _name(cls) in _SLOTTED
    ):
        fields = _ordered_fields(cls)
        return _Class(_name(cls), fields, _getter(fields))
    if issubclass(cls, Mapping):  # e.g. MappingProxyType in a frozen state: kept as a dict
        return "mapping"
    return "unknown"


def _fields_of(klass: _Class, o: Any) -> Any:
    try:
        return klass.get(o)
    except AttributeError:
        raise CheckpointError(f"cannot checkpoint a {klass.name} with a field unset") from None


def _array_head(a: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {"$a": a.dtype.str, "shape": list(a.shape)}


def _set_order(encoded: Any) -> bytes:
    return orjson.dumps(encoded)


def _ints_fit(values: Iterable[Any]) -> bool:
    """Every int among ``values`` is one orjson writes as a JSON number."""
    return all(_INT_LO <= x < _INT_HI for x in values if type(x) is int)


def _plain_run(types: AbstractSet[type], values: Iterable[Any], *, check_ints: bool) -> bool:
    """True if ``values``, whose types are ``types``, are all written as they are: scalars, and
    finite floats (their sum is finite only if every one is). Ints are checked to fit in 64 bits
    only with ``check_ints`` (see :class:`_Encoder`; ``values`` is then read twice)."""
    if check_ints and int in types and not _ints_fit(values):
        return False
    if types <= _SCALARS:
        return True
    if types <= _NUMBERS:
        try:
            total = sum(values)
        except OverflowError:  # an int too large for a float among floats
            return False
        return bool(total - total == 0)
    return False


class _Encoder:
    """A value as the tree the format describes. A run of values that are all plain (None, bools,
    strs, ints, finite floats) is handed to orjson as it is, checked with a few C calls (the types
    in it; for numbers, that their sum is finite, which it is not if one of them is inf or NaN, and
    may not be when they are huge: then they are visited one by one). Ints are passed unchecked
    unless ``check_ints``: one beyond 64 bits makes ``orjson.dumps`` refuse the tree, and
    :func:`encode` then encodes again checking every int (tagging those beyond 64 bits)."""

    __slots__ = ("check_ints", "classes", "scalars")

    def __init__(self, *, check_ints: bool = False) -> None:
        self.classes: dict[str, list[str]] = {}
        self.check_ints = check_ints
        self.scalars = _SCALARS - {int} if check_ints else _SCALARS

    def enc(self, o: Any) -> Any:
        t = type(o)
        if t in self.scalars:
            return o
        if t is int:
            return o if _INT_LO <= o < _INT_HI else {"$i": hex(o)}
        if t is float:
            return o if o - o == 0.0 else _bits(o)
        if t is list:
            return self.seq(o)
        if t is tuple:
            return {"$t": self.seq(o)}
        if t is dict:
            return {"$m": self.seq(list(o)), "v": self.seq(list(o.values()))}
        kind = _KINDS.get(t)
        if type(kind) is _Class:  # the common case first: an instance of a state class seen before
            if kind.name not in self.classes:
                self.classes[kind.name] = list(kind.fields)
            return {"$o": kind.name, "f": self.seq(_fields_of(kind, o))}
        return self.other(o, t)

    def seq(self, xs: list[Any] | tuple[Any, ...]) -> Any:
        """The values of ``xs`` written in order (``xs`` itself when every one is plain)."""
        check = self.check_ints
        types = set(map(type, xs))
        if _plain_run(types, xs, check_ints=check):
            return xs
        if types == _LISTS:  # lists of plain values (a window's rows), checked in one go
            flat: Iterable[Any] = list(chain.from_iterable(xs)) if check else chain.from_iterable(xs)
            if _plain_run(set(map(type, chain.from_iterable(xs))), flat, check_ints=check):
                return xs
        enc = self.enc
        scalars = self.scalars
        return [x if (tx := type(x)) in scalars or (tx is float and x - x == 0.0) else enc(x) for x in xs]

    def other(self, o: Any, t: type) -> Any:
        kind = _kind(t)
        if isinstance(kind, _Class):
            if kind.name not in self.classes:
                self.classes[kind.name] = list(kind.fields)
            return {"$o": kind.name, "f": self.seq(_fields_of(kind, o))}
        if kind == "mapping":
            return {"$m": self.seq(list(o)), "v": self.seq(list(o.values()))}
        if kind == "set":
            return {"$s": sorted(map(self.enc, o), key=_set_order), "frozen": t is frozenset}
        if kind == "npscalar":
            return {"$np": o.dtype.str, "v": self.enc(o.item())}
        if kind == "array":
            if o.dtype.kind in _RAW_KINDS:
                return {**_array_head(o), "b": base64.b64encode(o.tobytes()).decode("ascii")}
            return {**_array_head(o), "v": self.seq(o.ravel().tolist())}
        raise CheckpointError(f"cannot checkpoint a value of type {_name(t)}")


# -- layout, format 3: the tree in pieces --------------------------------------------------------
#
# Why pieces. A restore decodes in a thread so the loop goes on deciding, but the interpreter is only
# handed back between bytecodes: one ``orjson.loads`` of a 10,000-node shard's 28 MB document held it
# for 160-220 ms in one C call (the rest of a decode is Python, which gives it back every switch
# interval; ``zlib`` inflates with it released). So the encoder, which runs in a forked child and can
# afford the work, cuts the tree into JSON documents of about ``PIECE_BYTES`` each, every one parsed
# by its own ``orjson.loads`` call: the longest hold is one piece's parse (~2 ms). The pieces are
# independent zlib streams after the head's, so none is decompressed as a whole either, and the parsed
# objects of a piece are freed piece by piece as they are decoded (freeing the whole parsed tree at
# once held it another 30 ms). Not chosen: parsing in the loop in slices (orjson has no incremental
# parser; the loop would still stall one parse), or decoding in a forked child (the objects must come
# back into this process: that is a parse again).
#
# The blob is ``zlib(head) zlib(piece 0) zlib(piece 1) ...``, where the head is
# ``{"format": 3, "classes": {...}, "pieces": [each piece's compressed length], "v": tree}`` and each
# piece a JSON array. In the tree, a list may be written ``{"$p": [i, j, ...]}``: the concatenation of
# pieces i, j, ... (each named once in the whole checkpoint; a piece's elements may name pieces too).
# :class:`_Cutter` says which lists are cut; the format only says what ``$p`` means, so a decoder
# never depends on where the cuts fall. Formats 1 and 2 were one document in one zlib stream.

PIECE_BYTES = 256 * 1024  # JSON bytes per piece, about: ~2 ms of orjson.loads on a loaded machine
_HEAD_SPARE = 4_096  # the head's bytes besides the class table and the tree: its keys, the pieces' lengths
_MANY = 64  # a list longer than this is measured element by element, not walked into
_CONTAINERS = frozenset({list, tuple, dict})


class _Cutter:
    """Cuts a tree's large lists into pieces (``self.pieces``, each the JSON of a run of elements).

    Walked from the top: a list of plain values is measured in one ``orjson.dumps`` and, above
    ``PIECE_BYTES``, cut into slices of equal count. A list of more than ``_MANY`` elements has each
    element written once (an element itself above ``PIECE_BYTES`` is cut first); a shorter list (the
    skeleton: the shard's sections, an instance's fields) has each element walked into. A list whose
    elements come to more than ``PIECE_BYTES`` goes into pieces, whole elements to a piece, the next
    piece started when one would go past ``PIECE_BYTES``; a smaller one stays where it is, as the bytes
    already written (:class:`orjson.Fragment`). So every byte is written about once. A single string
    larger than a piece (a large array's bytes) is not cut. ``limit`` stands for ``PIECE_BYTES``
    where the head's own fields must fit beside what stays in it (:func:`_pack`)."""

    __slots__ = ("limit", "pieces")

    def __init__(self, limit: int) -> None:
        self.limit = limit  # the bytes a piece, and what stays in the head, may come to
        self.pieces: list[bytes] = []

    def value(self, x: Any) -> tuple[Any, int]:
        """``x`` with its large lists moved to pieces, and the JSON size of what is left (about)."""
        t = type(x)
        if t is list or t is tuple:  # a tuple: a run of plain values, as the encoder passed it
            return self.seq(x)
        if t is dict:
            out: dict[str, Any] = {}
            size = 1
            for k, v in x.items():
                out[k], n = self.value(v)
                size += len(k) + 4 + n
            return out, size
        return x, len(orjson.dumps(x))

    def seq(self, xs: list[Any] | tuple[Any, ...]) -> tuple[Any, int]:
        types = set(map(type, xs))
        if not types & _CONTAINERS:
            raw = orjson.dumps(xs)
            if len(raw) <= self.limit:
                return orjson.Fragment(raw), len(raw)
            n = -(-len(raw) // self.limit)
            step = -(-len(xs) // n)  # n pieces of equal count
            return self.moved([orjson.dumps(xs[i : i + step]) for i in range(0, len(xs), step)])
        if len(xs) > _MANY:
            parts = []
            for x in xs:
                b = orjson.dumps(x)
                if len(b) > self.limit and type(x) in _CONTAINERS:
                    b = orjson.dumps(self.value(x)[0])
                parts.append(b)
        else:
            parts = [orjson.dumps(self.value(x)[0]) for x in xs]
        size = sum(map(len, parts)) + len(parts) + 1
        if size <= self.limit:
            return orjson.Fragment(b"[" + b",".join(parts) + b"]"), size
        runs: list[list[bytes]] = [[]]
        filled = 0
        for b in parts:
            if runs[-1] and filled + len(b) + 1 > self.limit:
                runs.append([])
                filled = 0
            runs[-1].append(b)
            filled += len(b) + 1
        return self.moved([b"[" + b",".join(run) + b"]" for run in runs])

    def moved(self, pieces: list[bytes]) -> tuple[dict[str, list[int]], int]:
        first = len(self.pieces)
        self.pieces.extend(pieces)
        ref = {"$p": list(range(first, len(self.pieces)))}
        return ref, len(orjson.dumps(ref))


def _pack(classes: dict[str, list[str]], tree: Any) -> bytes:
    """The blob of a format 2 ``tree`` (the values, as :class:`_Encoder` writes them) in format 3:
    its large lists cut into pieces, the head and each piece compressed on its own."""
    # The head carries the class table and the pieces' lengths beside what stays of the tree, so what
    # stays is held to ``PIECE_BYTES`` less those (their size known once the tree is cut: cut again,
    # tighter, in the rare case the first guess left the head over a piece).
    names = dict(sorted(classes.items()))
    floor = max(1, PIECE_BYTES // 4)
    limit = max(floor, PIECE_BYTES - len(orjson.dumps(names)) - _HEAD_SPARE)
    while True:
        cutter = _Cutter(limit)
        rest, _ = cutter.value(tree)
        pieces = [zlib.compress(p, 1) for p in cutter.pieces]
        head = orjson.dumps(
            {"format": FORMAT, "classes": names, "pieces": [len(p) for p in pieces], "v": rest}
        )
        if len(head) <= PIECE_BYTES or limit <= floor:
            return b"".join([zlib.compress(head, 1), *pieces])
        limit = max(floor, limit - (len(head) - PIECE_BYTES))


def encode(value: Any) -> bytes:
    """``value`` as compressed tagged JSON, in pieces; :func:`decode` gives an equal value back."""
    encoder = _Encoder()
    try:
        return _pack(encoder.classes, encoder.enc(value))
    except TypeError:  # an int beyond 64 bits (passed unchecked): again, every int checked
        encoder = _Encoder(check_ints=True)
        try:
            return _pack(encoder.classes, encoder.enc(value))
        except TypeError as exc:  # e.g. a str orjson cannot write (a lone surrogate)
            raise CheckpointError(f"cannot checkpoint: {exc}") from None


def encode_many(values: list[Any]) -> bytes:
    """Several values' :func:`encode` blobs in one byte string (each behind its 8-byte length)."""
    return b"".join(len(b).to_bytes(8, "big") + b for b in (encode(v) for v in values))


def split_many(data: bytes) -> list[bytes]:
    out: list[bytes] = []
    i = 0
    while i < len(data):
        n = int.from_bytes(data[i : i + 8], "big")
        out.append(data[i + 8 : i + 8 + n])
        i += 8 + n
    return out


# -- decoding -----------------------------------------------------------------------------------


@functools.cache
def _resolve(name: str) -> type:
    module, _, qual = name.partition(":")
    if not module.startswith("fleetloop.") or "<" in qual or not qual:
        raise CheckpointError(f"class {name!r} is not a fleetloop state class")
    try:
        obj: Any = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        raise CheckpointError(f"class {name!r} does not exist in this fleetloop") from None
    if not isinstance(obj, type):
        raise CheckpointError(f"{name!r} is not a class")
    if not (
        dataclasses.is_dataclass(obj) or issubclass(obj, (BaseModel, msgspec.Struct)) or name in _SLOTTED
    ):
        raise CheckpointError(f"class {name!r} is not a state class")
    return obj


def _added_defaults(cls: type, missing: AbstractSet[str]) -> dict[str, Any]:
    """Defaults of the dataclass fields in ``missing`` (fields added since the checkpoint was
    written decode as their default; a field without one, or one that went away, still fails)."""
    if not dataclasses.is_dataclass(cls):
        return {}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in missing:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


_FIELDS: dict[type, frozenset[str]] = {}


def _fields_of_class(cls: type) -> frozenset[str]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = _class_fields(cls)
    return names


def _class_fields(cls: type) -> frozenset[str]:
    if dataclasses.is_dataclass(cls):
        return frozenset(f.name for f in dataclasses.fields(cls))
    names: list[str] = []
    transient = getattr(cls, "_TRANSIENT", ())
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.extend(
            s
            for s in ((slots,) if isinstance(slots, str) else slots)
            if not s.startswith("__") and s not in transient
        )
    return frozenset(names)


def _build(cls: type, name: str, values: dict[str, Any]) -> Any:
    """An instance of ``cls`` holding ``values`` without running any code of the class."""
    if issubclass(cls, BaseModel):
        unknown = set(values) - set(cls.model_fields)
        if unknown:
            raise CheckpointError(f"{name} has no fields {sorted(unknown)}")
        return cls.model_construct(**values)
    if issubclass(cls, msgspec.Struct):
        # Builds the struct from the values (checking their types and bounds); a struct twin has
        # no code of its own (no __post_init__) to run.
        try:
            return msgspec.convert(values, cls)
        except msgspec.ValidationError as exc:
            raise CheckpointError(f"{name}: {exc}") from None
    obj = object.__new__(cls)
    expected = _fields_of_class(cls)
    if expected and set(values) != expected:
        values.update(_added_defaults(cls, expected - set(values)))
        if set(values) != expected:
            raise CheckpointError(f"{name} fields changed: {sorted(set(values) ^ expected)}")
    for k, v in values.items():
        object.__setattr__(obj, k, v)
    for k, v in getattr(cls, "_TRANSIENT", {}).items():  # derived state's starting values
        if not (v is None or type(v) is int):
            raise CheckpointError(f"{name}: transient {k!r} is not plain data")
        object.__setattr__(obj, k, v)
    return obj


def _dec1(o: Any) -> Any:
    """A format 1 tree (every instance ``{"$o": name, "f": {field: value}}``) as its value."""
    t = type(o)
    if t is list:
        # The bulk of a checkpoint is lists of numbers (window rows): returned as parsed, no copy.
        for x in o:
            if type(x) is list or type(x) is dict:
                return [_dec1(x) for x in o]
        return o
    if t is not dict:
        return o
    if "$m" in o:
        return {
            (k if type(k) is not dict and type(k) is not list else _dec1(k)): (
                v if type(v) is not dict and type(v) is not list else _dec1(v)
            )
            for k, v in o["$m"]
        }
    if "$t" in o:
        return tuple(_dec1(x) for x in o["$t"])
    if "$f" in o:
        return float(o["$f"])
    if "$s" in o:
        items = [_dec1(x) for x in o["$s"]]
        return frozenset(items) if o.get("frozen") else set(items)
    if "$np" in o:
        return np.dtype(o["$np"]).type(_dec1(o["v"]))
    if "$a" in o:
        return np.asarray(_dec1(o["v"]), dtype=np.dtype(o["$a"])).reshape(o["shape"])
    if "$o" in o:
        return _build(_resolve(o["$o"]), o["$o"], {k: _dec1(v) for k, v in o["f"].items()})
    raise CheckpointError(f"unknown tag in checkpoint: {sorted(o)[:3]}")


def _raw_array(o: dict[str, Any]) -> np.ndarray[Any, Any]:
    dtype = np.dtype(o["$a"])
    if dtype.kind not in _RAW_KINDS:
        raise CheckpointError(f"an array of dtype {dtype.str} cannot be written as bytes")
    shape = tuple(o["shape"])
    if not all(type(n) is int and n >= 0 for n in shape):
        raise CheckpointError(f"bad array shape {list(shape)[:8]}")
    try:
        raw = base64.b64decode(o["b"], validate=True)
    except (binascii.Error, TypeError) as exc:
        raise CheckpointError(f"array bytes are not base64: {exc}") from None
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise CheckpointError("array bytes do not fit its shape")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


class _Decoder:
    """A format 2 or 3 tree as its value (the classes it names resolved and checked once; ``pieces``,
    format 3's parsed pieces, each taken once, when a ``$p`` names it, and dropped once decoded)."""

    __slots__ = ("classes", "pieces")

    def __init__(self, classes: Any, pieces: list[list[Any] | None]) -> None:
        self.pieces = pieces
        if type(classes) is not dict:
            raise CheckpointError("checkpoint has no class table")
        self.classes: dict[str, tuple[type, tuple[str, ...]]] = {}
        for name, fields in classes.items():
            if (
                type(fields) is not list
                or not all(type(f) is str for f in fields)
                or len(set(fields)) != len(fields)
            ):
                raise CheckpointError(f"bad field list for {name!r}")
            self.classes[name] = (_resolve(name), tuple(fields))

    def dec(self, o: Any) -> Any:
        t = type(o)
        if t is list:
            # The bulk of a checkpoint is lists of numbers (window rows): returned as parsed, no copy.
            for x in o:
                if type(x) is list or type(x) is dict:
                    return [self.dec(x) for x in o]
            return o
        if t is not dict:
            return o
        if "$o" in o:
            name = o["$o"]
            try:
                cls, fields = self.classes[name]
            except (KeyError, TypeError):
                raise CheckpointError(f"class {name!r} is not in the checkpoint's class table") from None
            values = o["f"]
            if type(values) is dict and "$p" in values:
                values = self.joined(values["$p"])
            elif type(values) is list and len(values) == len(fields):
                values = self.dec(values)
            if type(values) is not list or len(values) != len(fields):
                raise CheckpointError(f"{name}: {len(fields)} fields named, other values given")
            return _build(cls, name, dict(zip(fields, values, strict=True)))
        if "$p" in o:
            return self.joined(o["$p"])
        if "$m" in o:
            return dict(zip(self.dec(o["$m"]), self.dec(o["v"]), strict=True))
        if "$t" in o:
            return tuple(self.dec(o["$t"]))
        if "$d" in o:
            (x,) = struct.unpack(">d", bytes.fromhex(o["$d"]))
            return float(x)
        if "$i" in o:
            return int(o["$i"], 16)
        if "$s" in o:
            items = self.dec(o["$s"])
            return frozenset(items) if o["frozen"] else set(items)
        if "$np" in o:
            return np.dtype(o["$np"]).type(self.dec(o["v"]))
        if "$a" in o:
            if "b" in o:
                return _raw_array(o)
            return np.asarray(self.dec(o["v"]), dtype=np.dtype(o["$a"])).reshape(o["shape"])
        raise CheckpointError(f"unknown tag in checkpoint: {sorted(o)[:3]}")

    def joined(self, ids: Any) -> list[Any]:
        """The decoded elements of the pieces ``ids`` names, in order. Each piece is taken once (a
        checkpoint naming one twice would decode it again each time, a cost that doubles with every
        level), and its parsed objects are freed once it is decoded, not all at the end."""
        if type(ids) is not list:
            raise CheckpointError("a piece reference is not a list")
        pieces = self.pieces
        out: list[Any] = []
        for i in ids:
            if type(i) is not int or not 0 <= i < len(pieces):
                raise CheckpointError(f"piece {i!r} is not in the checkpoint")
            part = pieces[i]
            if part is None:
                raise CheckpointError(f"piece {i} is named twice")
            pieces[i] = None
            out.extend(self.dec(part))
            del part
        return out


def _inflate(data: bytes | memoryview, what: str) -> bytes:
    try:
        return zlib.decompress(data)
    except zlib.error as exc:
        raise CheckpointError(f"{what} is not readable: {exc}") from None


def _parsed(raw: bytes, what: str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise CheckpointError(f"{what} is not readable: {exc}") from None


def _head(data: bytes) -> tuple[bytes, dict[str, Any], int]:
    """The checkpoint's first document (a format 1 or 2 checkpoint's only one) as written and
    parsed, and where the pieces after it start."""
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(data)
    except zlib.error as exc:
        raise CheckpointError(f"checkpoint is not readable: {exc}") from None
    if not inflate.eof:
        raise CheckpointError("checkpoint is not readable: it ends early")
    tree = _parsed(raw, "checkpoint")
    if not isinstance(tree, dict) or (tree.get("format") != FORMAT and tree.get("format") not in OLD_FORMATS):
        raise CheckpointError("checkpoint written in another format")
    return raw, tree, len(data) - len(inflate.unused_data)


def _spans(sizes: Any, start: int, end: int) -> list[tuple[int, int]]:
    """Where each piece's compressed bytes are, from the head's ``pieces``."""
    if type(sizes) is not list or not all(type(n) is int and n > 0 for n in sizes):
        raise CheckpointError("checkpoint's piece lengths are not a list of positive ints")
    if start + sum(sizes) != end:
        raise CheckpointError(
            f"checkpoint's pieces come to {sum(sizes)} bytes, {end - start} follow its head"
        )
    out = []
    for n in sizes:
        out.append((start, start + n))
        start += n
    return out


def documents(data: bytes) -> list[bytes]:
    """A checkpoint's JSON documents as written: its head, then each piece (format 3), or its one
    document (formats 1 and 2). For measuring and for tests; :func:`decode` reads them one at a
    time."""
    raw, tree, start = _head(data)
    out = [raw]
    if tree["format"] == FORMAT:
        view = memoryview(data)
        spans = _spans(tree.get("pieces"), start, len(data))
        out.extend(_inflate(view[a:b], f"checkpoint piece {i}") for i, (a, b) in enumerate(spans))
    return out


def decode(data: bytes) -> Any:
    """The value a checkpoint holds. The pieces of a format 3 checkpoint are each decompressed and
    parsed in their own calls, so a thread decoding gives the interpreter back between them."""
    _, tree, start = _head(data)
    try:
        if tree["format"] == 1:
            return _dec1(tree["v"])
        pieces: list[list[Any] | None] = []
        if tree["format"] == FORMAT:
            view = memoryview(data)
            for i, (a, b) in enumerate(_spans(tree["pieces"], start, len(data))):
                what = f"checkpoint piece {i}"
                piece = _parsed(_inflate(view[a:b], what), what)
                if type(piece) is not list:
                    raise CheckpointError(f"{what} is not a list")
                pieces.append(piece)
        value = _Decoder(tree["classes"], pieces).dec(tree["v"])
        unused = [i for i, p in enumerate(pieces) if p is not None]
        if unused:
            raise CheckpointError(f"checkpoint pieces {unused[:8]} are named nowhere")
        return value
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, struct.error, RecursionError) as exc:
        raise CheckpointError(f"checkpoint is malformed: {type(exc).__name__}: {exc}") from None


# -- how often ------------------------------------------------------------------------------


def gap_s(interval_s: float, cpu_s: float, share: float, max_stretch: float) -> float:
    """Seconds until a changed shard's next periodic checkpoint, after one whose encoding used
    ``cpu_s`` CPU seconds: ``interval_s``, or ``cpu_s / share`` if longer (so checkpointing costs
    about ``share`` of one core), at most ``max_stretch * interval_s``. ``share`` 0 or a CPU figure
    that is not a positive number: ``interval_s``. The trade-off: a longer gap is that many more
    seconds of records a new owner folds forward from the checkpoint after a restart or a
    rebalance."""
    if not (share > 0.0 and cpu_s > 0.0 and math.isfinite(cpu_s)):
        return interval_s
    return max(interval_s, min(cpu_s / share, max_stretch * interval_s))


# -- records on control.checkpoint ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Chunk:
    key: bytes
    value: bytes


def to_chunks(group: str, partition: int, seq: int, blob: bytes) -> list[Chunk]:
    """Split ``blob`` into records for slot ``seq % 2``; each value is ``header\\n + data``."""
    parts = [blob[i : i + CHUNK_BYTES] for i in range(0, len(blob), CHUNK_BYTES)] or [b""]
    slot = seq % 2
    return [
        Chunk(
            key=f"{group}/{partition}/{slot}/{i}".encode(),
            value=orjson.dumps({"seq": seq, "i": i, "n": len(parts), "crc": zlib.crc32(blob)}) + b"\n" + part,
        )
        for i, part in enumerate(parts)
    ]


@dataclass(frozen=True, slots=True)
class Found:
    """What control.checkpoint holds for one partition: the newest whole checkpoint, and the
    highest sequence number written (a new owner writes above it, even over a torn slot)."""

    seq: int
    blob: bytes | None
    max_seq: int


def scan(group: str, records: Iterable[tuple[bytes | None, bytes | None]]) -> dict[int, Found]:
    """From (key, value) records in log order: per partition, the newest checkpoint that is whole."""
    latest: dict[tuple[int, int, int], tuple[int, int, int, bytes]] = {}
    prefix = f"{group}/"
    for key, value in records:
        if key is None or not value:
            continue
        k = key.decode(errors="replace")
        if not k.startswith(prefix):
            continue
        try:
            partition, slot, i = (int(x) for x in k[len(prefix) :].split("/"))
            head, _, data = value.partition(b"\n")
            meta = orjson.loads(head)
            latest[(partition, slot, i)] = (int(meta["seq"]), int(meta["n"]), int(meta["crc"]), data)
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
            continue  # not ours or damaged: ignored, the other slot may still be whole
    out: dict[int, Found] = {}
    for (partition, _, _), (seq, _, _, _) in latest.items():
        prev = out.get(partition)
        out[partition] = Found(0, None, max(seq, prev.max_seq if prev else 0))
    for partition, slot in sorted({(p, s) for p, s, _ in latest}):
        first = latest.get((partition, slot, 0))
        if first is None:
            continue
        seq, n, crc, _ = first
        parts = [latest.get((partition, slot, i)) for i in range(n)]
        if any(p is None or p[0] != seq for p in parts):
            continue
        blob = b"".join(p[3] for p in parts if p is not None)
        if zlib.crc32(blob) != crc:
            continue
        found = out[partition]
        if found.blob is None or found.seq < seq:
            out[partition] = Found(seq, blob, found.max_seq)
    return out


def newest_complete(group: str, records: Iterable[tuple[bytes | None, bytes | None]]) -> dict[int, bytes]:
    """Partition -> the newest whole checkpoint blob."""
    return {p: f.blob for p, f in scan(group, records).items() if f.blob is not None}
