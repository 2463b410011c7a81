"""Checkpoints as another build wrote them: a checkpoint's tree as one document (its pieces joined
back where the head names them), a state class's field removed (or renamed) in it, and the tree
written as a checkpoint again (:mod:`fleetloop.core.checkpoint`'s formats 2 and 3)."""

from __future__ import annotations

from typing import Any

import orjson
from fleetloop.core import checkpoint


def tree_of(blob: bytes) -> dict[str, Any]:
    """``{"format": .., "classes": .., "v": tree}`` of a checkpoint, every ``{"$p": [i, ...]}`` in it
    replaced by the elements of pieces i, ... in order (format 3's layout, read as it is stated):
    for format 3, the format 2 tree of the same value."""
    head, *pieces = (orjson.loads(d) for d in checkpoint.documents(blob))

    def join(node: Any) -> Any:
        if isinstance(node, dict):
            if set(node) == {"$p"}:
                return [join(x) for i in node["$p"] for x in pieces[i]]
            return {k: join(v) for k, v in node.items()}
        if isinstance(node, list):
            return [join(x) for x in node]
        return node

    return {"format": head["format"], "classes": head["classes"], "v": join(head["v"])}


def blob_of(tree: dict[str, Any]) -> bytes:
    """A tree as :func:`tree_of` gives it (edited) written as a checkpoint again, in the encoder's
    layout."""
    return checkpoint._pack(tree["classes"], tree["v"])


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
