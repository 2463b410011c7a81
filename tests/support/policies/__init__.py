"""Policy documents pinned for tests (tests must not move when the shipped default is retuned)."""

from __future__ import annotations

from pathlib import Path

from fleetloop.policies.registry import CompiledPolicy, load_policy

FOUNDATION_YAML = Path(__file__).parent / "foundation.yaml"


def foundation() -> CompiledPolicy:
    """least-queue routing, consecutive-errors breaker (5, 10 s, probe 0.05), queue-depth, fixed fleet."""
    return load_policy(FOUNDATION_YAML)
