"""latency-outlier's parameters: the ``Params`` model, its defaults and bounds, and the fixed constants
of its formula (why each default is what it is: README.md beside this file)."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from fleetloop.policies.base import Params
from fleetloop.policies.breaker.consecutive_errors import ConsecutiveErrorsParams

MAD_SCALE = 1.4826  # MAD -> standard deviation for normal data
POOL_WIDE_SHARE = 0.5  # the median node failing at >= half this node's rate: the failure is the pool's
TBT_SIGNALS: tuple[str, ...] = ("tbt_p50_ms", "tbt_p99_ms")
TTFT_SIGNALS: tuple[str, ...] = ("ttft_mean_ms_w", "ttft_p99_ms")
SIGNALS: tuple[str, ...] = (*TBT_SIGNALS, *TTFT_SIGNALS)


class LatencyOutlierParams(Params):
    ratio: float = Field(default=3.0, ge=1.5, le=100.0)
    k: float = Field(default=3.0, ge=0.0, le=20.0)
    tbt_floor_frac: float = Field(default=0.1, ge=0.0, le=1.0)
    ttft_floor_frac: float = Field(default=0.05, ge=0.0, le=1.0)
    min_hosts: int = Field(default=3, ge=2, le=1000)
    memory_ms: int = Field(default=20_000, ge=0, le=600_000)
    min_samples: int = Field(default=2, ge=1, le=1000)
    detect_ticks: int = Field(default=10, ge=1, le=100)
    base_ejection_ms: int = Field(default=30_000, ge=100, le=3_600_000)
    max_ejection_ms: int = Field(default=300_000, ge=100, le=86_400_000)
    probe_frac: float = Field(default=0.05, ge=0.0, le=0.5)
    probe_min_ms: int = Field(default=10_000, ge=0, le=3_600_000)
    probe_max_ms: int = Field(default=60_000, ge=0, le=3_600_000)
    slow_start_ms: int = Field(default=20_000, ge=0, le=600_000)
    slow_start_min_frac: float = Field(default=0.25, ge=0.0, le=1.0)
    max_ejected_frac: float = Field(default=0.34, ge=0.0, le=1.0)
    panic_threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    forgive_after_ms: int = Field(default=300_000, ge=0)
    error_threshold: int = Field(default=5, ge=1, le=1000)
    error_forgive_after_ms: int = Field(default=300_000, ge=0)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.max_ejection_ms < self.base_ejection_ms:
            raise ValueError("max_ejection_ms cannot be smaller than base_ejection_ms")
        if self.probe_max_ms < self.probe_min_ms:
            raise ValueError("probe_max_ms cannot be smaller than probe_min_ms")
        return self

    def errors(self) -> ConsecutiveErrorsParams:
        """The consecutive-errors machine's parameters (same backoff and probe share), built once
        per params object (params are frozen)."""
        found = _ERRORS.get(id(self))
        if found is not None and found[0] is self:
            return found[1]
        if len(_ERRORS) >= 64:
            _ERRORS.clear()
        errors = self._errors()
        _ERRORS[id(self)] = (self, errors)
        return errors

    def _errors(self) -> ConsecutiveErrorsParams:
        return ConsecutiveErrorsParams(
            threshold=self.error_threshold,
            base_ejection_ms=self.base_ejection_ms,
            max_ejection_ms=self.max_ejection_ms,
            probe_frac=self.probe_frac,
            forgive_after_ms=self.error_forgive_after_ms,
        )


# id(params) -> (params, its errors()): the params object is kept, so its id is not reused meanwhile.
_ERRORS: dict[int, tuple[LatencyOutlierParams, ConsecutiveErrorsParams]] = {}
