"""PolicyDocument: the versioned YAML that picks and parametrizes the algorithms (DESIGN.md).

This model checks the document's shape. Each section's ``params`` is checked against the named
algorithm's own ``Params`` model by :func:`fleetloop.policies.registry.compile_policy`, so an
unknown algorithm or a bad parameter is refused before the document can take effect.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from fleetloop.schemas.base import Wire

Mode = Literal["enforce", "shadow"]
SECTIONS: tuple[str, ...] = ("routing", "breaker", "admission", "retry_budget", "autoscale", "batching")


class AlgorithmRef(Wire):
    """``{type: <algorithm>, params: {...}}``: one registered algorithm and its parameters."""

    type: str = Field(min_length=1, pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")
    params: dict[str, Any] = Field(default_factory=dict)
    mode: Mode | None = None  # per-section override of spec.mode


class PolicySpec(Wire):
    mode: Mode = "enforce"
    tick_ms: int = Field(default=1000, ge=100, le=600_000)
    routing: AlgorithmRef
    breaker: AlgorithmRef
    admission: AlgorithmRef
    retry_budget: AlgorithmRef
    autoscale: AlgorithmRef
    batching: AlgorithmRef = AlgorithmRef(type="static-batching")
    envelope: dict[str, Any] = Field(default_factory=dict)


class PolicyMetadata(Wire):
    name: str = Field(min_length=1, max_length=100, pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")
    version: int = Field(ge=1)
    description: str = ""


class PolicyDocument(Wire):
    apiVersion: Literal["fleetloop/v1"]
    kind: Literal["FleetPolicy"]
    metadata: PolicyMetadata
    spec: PolicySpec
