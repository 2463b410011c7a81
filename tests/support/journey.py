"""The operator journey (docs/operations.md) as data: the command lines of its section, in order."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SECTION = "## An operator's first day, end to end"


def readme_lines() -> list[str]:
    """The command lines of the section's code blocks, in order."""
    text = (REPO / "docs" / "operations.md").read_text()
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```\n(.*?)^```$", body, re.S | re.M)
    return [ln.strip() for b in blocks for ln in b.splitlines() if ln.strip()]
