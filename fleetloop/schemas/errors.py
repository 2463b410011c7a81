"""One line for a validation error: what the CLI prints, dead letters carry, and policies refuse with.

``pools[0].gpu: unknown GPU 'H900'`` names the field the way a person finds it in the file
(list items as ``[i]``), says what is wrong in plain words, and counts any further errors.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError


def field_path(parts: Sequence[int | str], prefix: str = "") -> str:
    out = prefix
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else p
    return out


def one_line(exc: ValidationError, prefix: str = "", *, with_type: bool = False) -> str:
    """The first error as ``path: message (and N more)``; ``with_type`` puts pydantic's error type first."""
    first = exc.errors()[0]
    msg = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif first["type"] == "missing":
        msg = "field required"
    loc = field_path(tuple(first["loc"]), prefix)
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    text = f"{loc}: {msg}{more}" if loc else f"{msg}{more}"
    if with_type:
        text = f"{first['type']}: {text}"
    return " ".join(text.split())
