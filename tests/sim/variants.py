"""The default policy with one line changed: how the simulator tests state an arm ("the default with
its breaker off", "the default with the cap held at 2048") as the docs they check do."""

from __future__ import annotations

from pathlib import Path

from fleetloop.sim.table import DEFAULT_POLICY

BATCHING = "batching:     {type: tbt-feedback}"
BREAKER = "breaker:      {type: latency-outlier}"
ROUTING = "routing:      {type: cache-aware}"


def default_with(tmp: Path, line: str, replacement: str, name: str) -> Path:
    """``policies/default.yaml`` with ``line`` (which must be in it) replaced, written to
    ``tmp / name``."""
    text = Path(DEFAULT_POLICY).read_text(encoding="utf-8")
    assert line in text, line
    path = tmp / name
    path.write_text(text.replace(line, replacement), "utf-8")
    return path


def static_cap(tokens: int) -> str:
    """The batching line that holds every pool's cap at ``tokens``."""
    return f"batching:     {{type: static-batching, params: {{max_batch_tokens: {tokens}}}}}"
