"""Checkpoints as another build wrote them: a state class's field removed (or renamed) in a decoded
checkpoint tree (``{"classes": ..., "v": ...}``, :mod:`fleetloop.core.checkpoint`'s format 2)."""

from __future__ import annotations

from typing import Any


def edit_field(tree: dict[str, Any], cls: str, drop: str, add: str | None = None, value: Any = 1) -> None:
    """Remove ``cls``'s field ``drop`` and its value from every instance, in place; with ``add``,
    append a field of that name holding ``value`` instead (a build whose field was renamed)."""
    fields: list[str] = tree["classes"][cls]
    at = fields.index(drop)
    del fields[at]
    if add:
        fields.append(add)

    def visit(node: object) -> None:
        if isinstance(node, dict):
            if node.get("$o") == cls:
                del node["f"][at]
                if add:
                    node["f"].append(value)
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    visit(tree["v"])
