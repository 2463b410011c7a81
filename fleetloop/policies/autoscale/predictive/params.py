"""slo-predictive's parameters: the ``Params`` model, its defaults and bounds (why each default is
what it is: README.md beside this file)."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from fleetloop.policies.base import Params
from fleetloop.policies.prefill import DEFAULT_EFFICIENCY


class PoolBounds(Params):
    min_nodes: int = Field(ge=0, le=100_000)
    max_nodes: int = Field(ge=1, le=100_000)


class SloPredictiveParams(Params):
    headroom: float = Field(default=0.5, ge=0.1, le=1.0)
    kv_target: float = Field(default=0.8, ge=0.1, le=1.0)
    prefill_efficiency: float = Field(default=DEFAULT_EFFICIENCY, ge=0.05, le=1.0)
    cold_start_s: float = Field(default=120.0, ge=0.0, le=3600.0)
    tolerance: float = Field(default=0.1, ge=0.0, le=1.0)
    up_window_s: float = Field(default=10.0, ge=0.0, le=600.0)
    down_window_s: float | None = Field(default=None, ge=0.0, le=3600.0)
    down_step_frac: float = Field(default=0.25, gt=0.0, le=1.0)
    down_period_s: float = Field(default=30.0, ge=0.0, le=3600.0)
    capacity_halflife_s: float = Field(default=60.0, ge=1.0, le=3600.0)
    min_requests: int = Field(default=20, ge=0, le=100_000)
    spare_nodes: int = Field(default=0, ge=0, le=100)
    min_nodes: int = Field(default=1, ge=0, le=100_000)
    max_nodes: int = Field(default=1000, ge=1, le=100_000)
    pools: dict[str, PoolBounds] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        for name, lo, hi in [("", self.min_nodes, self.max_nodes)] + [
            (f"pools.{p}.", b.min_nodes, b.max_nodes) for p, b in sorted(self.pools.items())
        ]:
            if lo > hi:
                raise ValueError(f"{name}min_nodes ({lo}) is above {name}max_nodes ({hi})")
        return self

    def bounds(self, pool_id: str) -> tuple[int, int]:
        b = self.pools.get(pool_id)
        return (b.min_nodes, b.max_nodes) if b is not None else (self.min_nodes, self.max_nodes)
