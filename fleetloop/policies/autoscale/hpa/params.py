"""The HPA's parameters: the replica bounds, the scaling behavior (stabilization and rate policies)
and the sync every HPA-based autoscaler shares (``hpa``, ``keda-engine``, ``keda-epp``), then
``hpa``'s own target (README.md beside this file: "Parameters")."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from fleetloop.policies.base import Params


class ScalingPolicy(Params):
    type: Literal["Pods", "Percent"]
    value: int = Field(gt=0, le=100_000)
    period_s: int = Field(gt=0, le=1800)


class ScalingRules(Params):
    stabilization_window_s: int = Field(ge=0, le=3600)
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"
    policies: tuple[ScalingPolicy, ...] = ()


DEFAULT_SCALE_UP = ScalingRules(
    stabilization_window_s=0,
    select_policy="Max",
    policies=(
        ScalingPolicy(type="Pods", value=4, period_s=15),
        ScalingPolicy(type="Percent", value=100, period_s=15),
    ),
)
DEFAULT_SCALE_DOWN = ScalingRules(
    stabilization_window_s=300,
    select_policy="Max",
    policies=(ScalingPolicy(type="Percent", value=100, period_s=15),),
)


class PoolBounds(Params):
    min_replicas: int = Field(ge=0, le=100_000)
    max_replicas: int = Field(ge=1, le=100_000)


class ReplicaBounds(Params):
    """``min_replicas``, ``max_replicas`` and per-pool overrides, checked in order (for autoscalers
    built on :func:`fleetloop.policies.autoscale.hpa.rule.sync`)."""

    min_replicas: int = Field(default=1, ge=0, le=100_000)
    max_replicas: int = Field(default=1000, ge=1, le=100_000)
    pools: dict[str, PoolBounds] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        for name, lo, hi in [("", self.min_replicas, self.max_replicas)] + [
            (f"pools.{p}.", b.min_replicas, b.max_replicas) for p, b in sorted(self.pools.items())
        ]:
            if lo > hi:
                raise ValueError(f"{name}min_replicas ({lo}) is above {name}max_replicas ({hi})")
        return self

    def bounds(self, pool_id: str) -> tuple[int, int]:
        b = self.pools.get(pool_id)
        return (b.min_replicas, b.max_replicas) if b is not None else (self.min_replicas, self.max_replicas)


class SyncParams(ReplicaBounds):
    """What every HPA-based autoscaler's sync takes besides its metric: the tolerance, the sync
    period and the default ``behavior`` (the HPA that KEDA generates for a ScaledObject takes the
    same)."""

    tolerance: float = Field(default=0.1, ge=0.0, le=1.0)
    sync_period_ms: int = Field(default=15_000, ge=1, le=600_000)
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN


class HpaParams(SyncParams):
    target_utilization_pct: int = Field(default=70, ge=1, le=1000)
