"""cache-aware's parameters: the ``Params`` model, its defaults and bounds (why each default is what
it is: README.md beside this file)."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from fleetloop.policies.base import Params
from fleetloop.schemas.decisions import Picker

COMPONENTS: tuple[str, ...] = ("queue", "running", "tokens", "kv", "hbm", "speed")
# The router's per-call pick among the weighted nodes when the policy names none (README.md beside
# this file: "Picker"; the ``picker`` parameter).
PICKER: Picker = "weighted-random"


class CacheAwareParams(Params):
    w_queue: float = Field(default=2.0, ge=0.0, le=100.0)
    w_running: float = Field(default=1.0, ge=0.0, le=100.0)
    w_tokens: float = Field(default=1.0, ge=0.0, le=100.0)
    w_kv: float = Field(default=1.0, ge=0.0, le=100.0)
    w_hbm: float = Field(default=0.25, ge=0.0, le=100.0)
    w_speed: float = Field(default=2.0, ge=0.0, le=100.0)
    queue_scale: float = Field(default=4.0, gt=0.0, le=10_000.0)
    running_scale: float = Field(default=16.0, gt=0.0, le=10_000.0)
    alpha: float = Field(default=4.0, ge=0.5, le=16.0)
    alpha_by_priority: dict[str, float] = Field(default_factory=lambda: {"0": 6.0})
    min_score_by_priority: dict[str, float] = Field(default_factory=lambda: {"0": 0.5})
    affinity_keep_frac: float = Field(default=0.5, ge=0.0, le=1.0)
    affinity_min_speed: float = Field(default=0.5, ge=0.0, le=1.0)
    speed_memory_ms: int = Field(default=20_000, ge=0, le=600_000)
    silent_after_ms: int = Field(default=3_000, ge=0, le=600_000)
    spill_min_headroom: float = Field(default=0.5, ge=0.0, le=1.0)
    picker: Picker = PICKER

    @model_validator(mode="after")
    def _check(self) -> Self:
        if sum(self.component_weights().values()) <= 0:
            raise ValueError("at least one scorer weight (w_*) must be > 0")
        for name, table, lo, hi in (
            ("alpha_by_priority", self.alpha_by_priority, 0.5, 16.0),
            ("min_score_by_priority", self.min_score_by_priority, 0.0, 1.0),
        ):
            for key, value in table.items():
                if not key.isdigit():
                    raise ValueError(f"{name}: priority keys are non-negative integers, got {key!r}")
                if not lo <= value <= hi:
                    raise ValueError(f"{name}[{key}]: {value} is outside [{lo}, {hi}]")
        return self

    def component_weights(self) -> dict[str, float]:
        return {
            "queue": self.w_queue,
            "running": self.w_running,
            "tokens": self.w_tokens,
            "kv": self.w_kv,
            "hbm": self.w_hbm,
            "speed": self.w_speed,
        }
