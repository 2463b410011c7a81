"""Base class for every wire model, and the bounded field types every model is built from.

Every number on the wire is finite and within a physical range ("bounds at the door"):
a value outside it is refused at decode time, with its field named, and the record goes to the
dead-letter topic. The bounds travel in the exported JSON Schema (``minimum`` / ``maximum``), so a
producer in another language can check them before sending. They are generous on purpose (a
64-GPU node, a week-long task, a trillion tokens), only ruling out values no fleet can produce,
such as ``1e308`` dollars or ``10**400`` tokens, which would otherwise overflow arithmetic downstream.
"""

from __future__ import annotations

from typing import Annotated, Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field

# 2100-01-01T00:00:00Z. Event time beyond this is not a clock, it is a forgery or a unit error; the
# daemon additionally accepts event time only within a window around the broker's record timestamp.
MAX_EPOCH_MS: Final = 4_102_444_800_000
MAX_COUNT: Final = 1_000_000_000  # events of one kind in one interval, sequence numbers, steps
MAX_TOKENS: Final = 1_000_000_000_000  # tokens in one call or one interval
MAX_DURATION_MS: Final = 604_800_000.0  # one week: latencies, budgets
MAX_USD: Final = 1_000_000_000.0  # any sum of money on one record
MAX_USD_PER_H: Final = 100_000.0  # what one node may cost per hour (a 64-GPU node is ~$300/h)
MAX_GIB: Final = 1_000_000.0  # memory on one node
MAX_TICK_ID: Final = 2**53  # exact in every JSON implementation
MAX_FIGURE: Final = 1e15  # a decision's explanatory inputs (rates, sums, counts)

# Event time: epoch milliseconds, stamped by the producer of the record.
EpochMs = Annotated[int, Field(ge=0, le=MAX_EPOCH_MS, description="event time, epoch milliseconds")]
NonNegInt = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Tokens = Annotated[int, Field(ge=0, le=MAX_TOKENS)]
DurationMs = Annotated[float, Field(ge=0.0, le=MAX_DURATION_MS, allow_inf_nan=False)]
Usd = Annotated[float, Field(ge=0.0, le=MAX_USD, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0.0, le=MAX_FIGURE, allow_inf_nan=False)]
Figure = Annotated[float, Field(ge=-MAX_FIGURE, le=MAX_FIGURE, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Ident = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]*$")]


class Wire(BaseModel):
    """A record on the wire: immutable, strict about unknown fields, no NaN."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")


_M = TypeVar("_M", bound=BaseModel)


def assemble(cls: type[_M], values: dict[str, object], fields_set: set[str]) -> _M:
    """A model from values that are valid by construction, every field given, in declaration order.

    What ``model_construct`` builds (no validation; ``fields_set`` as given), without its per-field
    default lookup, which costs more than validating: for the hot paths that build one model per
    node per tick from parts already validated (a node id from validated telemetry, figures the
    caller has checked). Never for anything read from outside."""
    m = _new(cls)
    _set_dict(m, values)
    _set_fields_set(m, fields_set)
    _set_extra(m, None)
    _set_private(m, None)
    return m


def updated(m: _M, update: dict[str, object]) -> _M:
    """``m.model_copy(update=update)``, the same object (``__dict__`` copied then updated in place,
    so in the same key order; fields set copied and given the updated names; no extras, no private
    attributes), without ``model_copy``'s and ``__copy__``'s generic steps: for the decide tick's
    envelope, which copies hundreds of decisions a tick with a field or four changed. A model with
    extras or private attributes goes through ``model_copy`` itself. The names in ``update`` must be
    fields of the model (``model_copy`` would set them in ``__dict__`` all the same, unvalidated).
    ``tests/unit/test_fast_bodies.py`` holds the two equal."""
    if m.__pydantic_extra__ is not None or m.__pydantic_private__ is not None:
        return m.model_copy(update=update)
    values = m.__dict__.copy()
    values.update(update)
    fields_set = set(m.__pydantic_fields_set__)
    fields_set.update(update)
    return assemble(type(m), values, fields_set)


# BaseModel's slots and ``__dict__``, set through their descriptors (what ``object.__setattr__`` finds
# for them, without the lookup: ~40% of ``assemble``'s own time, and a 10k tick assembles thousands of
# bodies). Every model's ``__dict__`` is BaseModel's (``tests/unit/test_fast_bodies.py``).
_set_dict = BaseModel.__dict__["__dict__"].__set__
# ``cls.__new__``, which no model overrides (the same test), without looking it up on the class
# through pydantic's metaclass: ~170 ns, as long as the rest of an assembly.
_new = object.__new__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
