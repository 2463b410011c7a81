"""PolicyDocument: the versioned YAML that picks and parametrizes the algorithms (docs/policies.md).

This model checks the document's shape. Each section's ``params`` is checked against the named
algorithm's own ``Params`` model by :func:`fleetloop.policies.registry.compile_policy`, so an
unknown algorithm or a bad parameter is refused before the document can take effect.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from fleetloop.schemas.base import MAX_TICK_ID, Wire

Mode = Literal["enforce", "shadow"]
SECTIONS: tuple[str, ...] = ("routing", "breaker", "admission", "retry_budget", "autoscale", "batching")


class AlgorithmRef(Wire):
    """``{type: <algorithm>, params: {...}}``: one registered algorithm and its parameters."""

    type: str = Field(min_length=1, pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")
    params: dict[str, Any] = Field(default_factory=dict)
    mode: Mode | None = None  # per-section override of spec.mode


class SloTarget(Wire):
    """A latency objective: time to first token (a tail: p99) and time between tokens."""

    ttft_ms: float = Field(ge=50.0, le=600_000.0, description="time to first token, p99, ms")
    tbt_ms: float = Field(ge=5.0, le=60_000.0, description="time between output tokens, p99, ms")


class SloClass(SloTarget):
    """The SLO of one priority class, optionally only on one model's or one pool's calls."""

    priority: int = Field(ge=0, le=9)
    model: str | None = Field(default=None, min_length=1, max_length=200)
    pool: str | None = Field(default=None, min_length=1, max_length=200)


class SloSpec(Wire):
    """``spec.slo``: the one place SLOs are written. Every algorithm that judges latency reads it
    through the engine (``PolicyContext.slo``); none carries its own copy.

    A call of priority ``p`` on pool ``P`` serving model ``M`` is held to the most specific class
    that matches: pool and priority, then model and priority, then priority alone, then
    ``default``."""

    default: SloTarget = SloTarget(ttft_ms=2000.0, tbt_ms=100.0)
    classes: tuple[SloClass, ...] = Field(default=(), max_length=1000)

    @model_validator(mode="after")
    def _unique(self) -> Self:
        seen: set[tuple[int, str | None, str | None]] = set()
        for c in self.classes:
            if c.model is not None and c.pool is not None:
                raise ValueError(f"classes[priority={c.priority}]: give a model or a pool, not both")
            key = (c.priority, c.model, c.pool)
            if key in seen:
                raise ValueError(
                    f"classes: priority {c.priority}"
                    + (f" model {c.model}" if c.model else "")
                    + (f" pool {c.pool}" if c.pool else "")
                    + " given twice"
                )
            seen.add(key)
        return self


class PolicySpec(Wire):
    mode: Mode = "enforce"
    tick_ms: int = Field(default=1000, ge=100, le=600_000)
    routing: AlgorithmRef
    breaker: AlgorithmRef
    admission: AlgorithmRef
    retry_budget: AlgorithmRef
    autoscale: AlgorithmRef
    batching: AlgorithmRef = AlgorithmRef(type="static-batching")
    slo: SloSpec = SloSpec()
    envelope: dict[str, Any] = Field(default_factory=dict)


class PolicyMetadata(Wire):
    name: str = Field(min_length=1, max_length=100, pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")
    version: int = Field(ge=1, le=MAX_TICK_ID)
    description: str = Field(default="", max_length=10_000)


class PolicyDocument(Wire):
    apiVersion: Literal["fleetloop/v1"]
    kind: Literal["FleetPolicy"]
    metadata: PolicyMetadata
    spec: PolicySpec
