"""The capacity autoscaler's parameters, each default with what it rests on (README.md, "Parameters")."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from fleetloop.perf.engines import check_family
from fleetloop.policies.base import Params


class PoolSpec(Params):
    """What the operator states about one pool: its node bounds, and what telemetry does not say of
    its nodes (the serving engine and its release, the precision of weights and KV cache)."""

    min_nodes: int | None = Field(default=None, ge=0, le=100_000)
    max_nodes: int | None = Field(default=None, ge=1, le=100_000)
    engine: Literal["vllm", "sglang", "trtllm"] = "vllm"
    engine_version: str | None = Field(default=None, max_length=20)
    precision: Literal["bf16", "fp8"] = "bf16"

    @model_validator(mode="after")
    def _family(self) -> Self:
        check_family(self.engine, self.engine_version)
        return self


DEFAULT_POOL = PoolSpec()


class CapacityParams(Params):
    # The one-sided probability that a pool's demand over the next cold start stays within what it
    # is sized for (the forecast's upper bound): 0.95 (z = 1.645).
    coverage: float = Field(default=0.95, ge=0.5, le=0.9999)
    # The lead until a cold start is observed; None: the catalog's uncached cold start of the
    # pool's model on its GPU (the longer of the two published profiles).
    cold_start_s: float | None = Field(default=None, ge=0.0, le=3600.0)
    # A scale-down goes to the highest need of this many seconds; None: the lead (one cold start).
    # Ski rental: a node given back costs a cold start to get back, so keeping an idle one for as
    # long as a cold start lasts costs at most twice the best choice whatever demand does next.
    down_window_s: float | None = Field(default=None, ge=0.0, le=3600.0)
    # Half-life of the figures learned from telemetry (KV per running call, the pool's speed
    # against its physics): six telemetry windows.
    halflife_s: float = Field(default=60.0, ge=1.0, le=3600.0)
    # How long a burst is remembered: a day, the period of the commonest traffic cycle.
    memory_s: float = Field(default=86_400.0, ge=0.0, le=30 * 86_400.0)
    # Bursts remembered per pool (the newest kept).
    max_bursts: int = Field(default=8, ge=0, le=64)
    # N + k: nodes added to a serving pool's need for the loss of k nodes (0: the 99th-percentile
    # population and the forecast's upper bound are the margin).
    spare_nodes: int = Field(default=0, ge=0, le=100)
    min_nodes: int = Field(default=1, ge=0, le=100_000)
    max_nodes: int = Field(default=1000, ge=1, le=100_000)
    pools: dict[str, PoolSpec] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        for name, (lo, hi) in [("", (self.min_nodes, self.max_nodes))] + [
            (f"pools.{p}.", self.bounds(p)) for p in sorted(self.pools)
        ]:
            if lo > hi:
                raise ValueError(f"{name}min_nodes ({lo}) is above {name}max_nodes ({hi})")
        return self

    def pool(self, pool_id: str) -> PoolSpec:
        return self.pools.get(pool_id, DEFAULT_POOL)

    def bounds(self, pool_id: str) -> tuple[int, int]:
        p = self.pools.get(pool_id)
        lo = p.min_nodes if p is not None and p.min_nodes is not None else self.min_nodes
        hi = p.max_nodes if p is not None and p.max_nodes is not None else self.max_nodes
        return lo, hi
