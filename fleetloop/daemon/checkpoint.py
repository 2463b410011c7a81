"""Checkpoints: a shard's exact state as bytes, and back (no I/O; the runtime does the Kafka part).

Why a checkpoint and not a warm-up re-read. The state behind a decision is not a function of any
bounded suffix of the inputs: the workflow ledger counts every task since the start, Envoy's
ejection count and backoff grow with every ejection, HPA keeps scale events and the predictive
autoscaler its demand history. Re-reading "the last N records" therefore gives a state that is
only close to the one a continuous run has (the ejection counts that went 5 -> 3). Instead the
runtime writes, every few seconds, each shard's fleet model and policy state together with the
input offsets and the last tick they reflect, to the compacted ``control.checkpoint`` topic; a new
owner restores the newest complete checkpoint and folds exactly the records between its offsets
and the end through the same code path (:mod:`fleetloop.daemon.shard`), deciding the ticks in
between again without publishing the ones already published. Restore + fold-forward is the
continuous computation, so the state is equal, not approximately equal.

Encoding. A tagged JSON tree compressed with zlib: floats are written with the shortest repr that
reads back to the same double (orjson), so values round-trip bit for bit; tuples, dicts with
non-string keys, numpy scalars and instances are tagged. Only classes defined in ``fleetloop``
modules that are dataclasses, pydantic models or listed in ``_PLAIN`` can be named, and decoding
never calls a constructor or any code of theirs (fields are set on a bare instance; slots a class
names in ``_TRANSIENT``, state derived from the rest such as the model's snapshot caches, are
not written; a decoded instance gets the plain values that mapping gives), so a forged
checkpoint can at worst produce a wrong state, never run code. A dataclass field added since a
checkpoint was written decodes as its declared default (a field without a default, or one removed,
does not decode). A value that does not decode (for
example written by another fleetloop version whose state classes changed) raises
:class:`CheckpointError`; the runtime then starts that shard clean and says so.

Chunking. A checkpoint larger than ``CHUNK_BYTES`` is split over several records; records are
written to one of two slots alternately (``<group>/<partition>/<slot>/<chunk>``), so a crash while
writing one slot leaves the other complete, and compaction keeps exactly the newest of each key.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import zlib
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import orjson
from pydantic import BaseModel

FORMAT = 1
CHUNK_BYTES = 512 * 1024  # under every broker's default max message size (1 MB) with headers


class CheckpointError(ValueError):
    """A checkpoint that cannot be decoded into a state this code can use."""


def _plain_classes() -> frozenset[str]:
    return frozenset({"fleetloop.daemon.model.fleet:FleetModel", "fleetloop.daemon.model.windows:Window"})


_PLAIN = _plain_classes()


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _fields(obj: Any) -> list[str]:
    names: list[str] = []
    transient = getattr(type(obj), "_TRANSIENT", ())
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for s in (slots,) if isinstance(slots, str) else slots:
            if s not in names and not s.startswith("__") and s not in transient:
                names.append(s)
    if hasattr(obj, "__dict__"):
        names.extend(n for n in vars(obj) if n not in names)
    return names


def _enc(o: Any) -> Any:
    t = type(o)
    if o is None or t is bool or t is int or t is str:
        return o
    if t is float:
        return o if math.isfinite(o) else {"$f": repr(o)}
    if t is list:
        return [_enc(x) for x in o]
    if t is tuple:
        return {"$t": [_enc(x) for x in o]}
    if t is dict:
        return {"$m": [[_enc(k), _enc(v)] for k, v in o.items()]}
    if t is frozenset or t is set:
        return {"$s": sorted((_enc(x) for x in o), key=orjson.dumps), "frozen": t is frozenset}
    if isinstance(o, np.generic):
        return {"$np": o.dtype.str, "v": _enc(o.item())}
    if isinstance(o, np.ndarray):
        return {"$a": o.dtype.str, "shape": list(o.shape), "v": _enc(o.ravel().tolist())}
    if isinstance(o, BaseModel):
        return {"$o": _name(t), "f": {k: _enc(getattr(o, k)) for k in t.model_fields}}
    if isinstance(o, msgspec.Struct):  # decoded input records (fleetloop.schemas.fast)
        return {"$o": _name(t), "f": {k: _enc(getattr(o, k)) for k in o.__struct_fields__}}
    if dataclasses.is_dataclass(o) or _name(t) in _PLAIN:
        return {"$o": _name(t), "f": {k: _enc(getattr(o, k)) for k in _fields(o) if hasattr(o, k)}}
    if isinstance(o, Mapping):  # e.g. MappingProxyType in a frozen state: kept as a dict
        return {"$m": [[_enc(k), _enc(v)] for k, v in o.items()]}
    raise CheckpointError(f"cannot checkpoint a value of type {_name(t)}")


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
    if not (dataclasses.is_dataclass(obj) or issubclass(obj, (BaseModel, msgspec.Struct)) or name in _PLAIN):
        raise CheckpointError(f"class {name!r} is not a state class")
    return obj


def _dec(o: Any) -> Any:
    t = type(o)
    if t is list:
        # The bulk of a checkpoint is lists of numbers (window rows): returned as parsed, no copy.
        for x in o:
            if type(x) is list or type(x) is dict:
                return [_dec(x) for x in o]
        return o
    if t is not dict:
        return o
    if "$m" in o:
        return {
            (k if type(k) is not dict and type(k) is not list else _dec(k)): (
                v if type(v) is not dict and type(v) is not list else _dec(v)
            )
            for k, v in o["$m"]
        }
    if "$t" in o:
        return tuple(_dec(x) for x in o["$t"])
    if "$f" in o:
        return float(o["$f"])
    if "$s" in o:
        items = [_dec(x) for x in o["$s"]]
        return frozenset(items) if o.get("frozen") else set(items)
    if "$np" in o:
        return np.dtype(o["$np"]).type(_dec(o["v"]))
    if "$a" in o:
        return np.asarray(_dec(o["v"]), dtype=np.dtype(o["$a"])).reshape(o["shape"])
    if "$o" in o:
        cls = _resolve(o["$o"])
        values = {k: _dec(v) for k, v in o["f"].items()}
        if issubclass(cls, BaseModel):
            unknown = set(values) - set(cls.model_fields)
            if unknown:
                raise CheckpointError(f"{o['$o']} has no fields {sorted(unknown)}")
            return cls.model_construct(**values)
        if issubclass(cls, msgspec.Struct):
            # Builds the struct from the values (checking their types and bounds); a struct twin
            # has no code of its own (no __post_init__) to run.
            try:
                return msgspec.convert(values, cls)
            except msgspec.ValidationError as exc:
                raise CheckpointError(f"{o['$o']}: {exc}") from None
        obj = object.__new__(cls)
        expected = _fields_of_class(cls)
        if expected and set(values) != expected:
            values.update(_added_defaults(cls, expected - set(values)))
            if set(values) != expected:
                raise CheckpointError(f"{o['$o']} fields changed: {sorted(set(values) ^ expected)}")
        for k, v in values.items():
            object.__setattr__(obj, k, v)
        for k, v in getattr(cls, "_TRANSIENT", {}).items():  # derived state's starting values
            if not (v is None or type(v) is int):
                raise CheckpointError(f"{o['$o']}: transient {k!r} is not plain data")
            object.__setattr__(obj, k, v)
        return obj
    raise CheckpointError(f"unknown tag in checkpoint: {sorted(o)[:3]}")


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


def encode(value: Any) -> bytes:
    """``value`` as compressed tagged JSON; :func:`decode` gives an equal value back."""
    return zlib.compress(orjson.dumps({"format": FORMAT, "v": _enc(value)}), 1)


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


def decode(data: bytes) -> Any:
    try:
        tree = orjson.loads(zlib.decompress(data))
    except (zlib.error, orjson.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint is not readable: {exc}") from None
    if not isinstance(tree, dict) or tree.get("format") != FORMAT:
        raise CheckpointError("checkpoint written in another format")
    try:
        return _dec(tree["v"])
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint is malformed: {type(exc).__name__}: {exc}") from None


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
