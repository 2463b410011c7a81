"""The checkpoint encoding's statement, one value at a time: what ``checkpoint.encode`` (runs of
plain values passed to orjson unvisited) is held to, byte for byte
(``tests/unit/test_checkpoint_codec.py``)."""

from __future__ import annotations

import base64
import math
from typing import Any

from fleetloop.core.checkpoint import (
    _INT_HI,
    _INT_LO,
    _RAW_KINDS,
    CheckpointError,
    _array_head,
    _bits,
    _Class,
    _kind,
    _name,
    _pack,
    _set_order,
)


def _enc_plain(o: Any, classes: dict[str, list[str]]) -> Any:
    """The encoding's statement: ``o`` as the tree the format describes, one value at a time
    (``classes`` collects each state class's field list)."""
    t = type(o)
    if o is None or t is bool or t is str:
        return o
    if t is int:
        return o if _INT_LO <= o < _INT_HI else {"$i": hex(o)}
    if t is float:
        return o if math.isfinite(o) else _bits(o)
    if t is list:
        return [_enc_plain(x, classes) for x in o]
    if t is tuple:
        return {"$t": [_enc_plain(x, classes) for x in o]}
    kind = "mapping" if t is dict else _kind(t)
    if kind == "mapping":
        keys = [_enc_plain(k, classes) for k in o]
        return {"$m": keys, "v": [_enc_plain(v, classes) for v in o.values()]}
    if kind == "set":
        return {"$s": sorted((_enc_plain(x, classes) for x in o), key=_set_order), "frozen": t is frozenset}
    if kind == "npscalar":
        return {"$np": o.dtype.str, "v": _enc_plain(o.item(), classes)}
    if kind == "array":
        if o.dtype.kind in _RAW_KINDS:
            return {**_array_head(o), "b": base64.b64encode(o.tobytes()).decode("ascii")}
        return {**_array_head(o), "v": [_enc_plain(x, classes) for x in o.ravel().tolist()]}
    if isinstance(kind, _Class):
        classes[kind.name] = list(kind.fields)
        values = []
        for k in kind.fields:
            if not hasattr(o, k):
                raise CheckpointError(f"cannot checkpoint a {kind.name} with a field unset")
            values.append(_enc_plain(getattr(o, k), classes))
        return {"$o": kind.name, "f": values}
    raise CheckpointError(f"cannot checkpoint a value of type {_name(t)}")


def encode_plain(value: Any) -> bytes:
    """``checkpoint.encode`` as the format states it, one value at a time."""
    classes: dict[str, list[str]] = {}
    tree = _enc_plain(value, classes)
    try:
        return _pack(classes, tree)  # the layout (the tree cut into pieces) is the encoder's own
    except TypeError as exc:  # e.g. a str orjson cannot write (a lone surrogate)
        raise CheckpointError(f"cannot checkpoint: {exc}") from None
