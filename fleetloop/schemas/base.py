"""Base class for every wire model."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# Event time: epoch milliseconds, stamped by the producer of the record.
EpochMs = Annotated[int, Field(ge=0, description="event time, epoch milliseconds")]
NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Ident = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]*$")]


class Wire(BaseModel):
    """A record on the wire: immutable, strict about unknown fields, no NaN."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")
