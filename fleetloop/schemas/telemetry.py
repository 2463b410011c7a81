"""NodeTelemetry: what a serving node reports about itself, once per interval."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fleetloop.schemas.base import (
    MAX_GIB,
    MAX_USD_PER_H,
    DurationMs,
    EpochMs,
    Fraction,
    Ident,
    NonNegInt,
    Tokens,
    Wire,
)

WeightsState = Literal["cold", "loading", "warm"]


class NodeTelemetry(Wire):
    """One serving node (one model replica, one or more GPUs) over one reporting interval.

    Latency figures are over the interval ending at ``ts_ms``; counters (errors, tokens) count the
    interval only, so a consumer can sum them without differencing. Keyed by ``pool_id`` on the wire.
    """

    ts_ms: EpochMs
    node_id: Ident
    pool_id: Ident
    model: Ident
    gpu_type: Ident
    gpu_count: int = Field(default=1, ge=1, le=64)
    weights_state: WeightsState
    draining: bool = False
    interval_ms: int = Field(ge=1, le=600_000)
    ttft_p50_ms: DurationMs | None = None
    ttft_p99_ms: DurationMs | None = None
    tbt_p50_ms: DurationMs | None = None
    tbt_p99_ms: DurationMs | None = None
    queue_depth: NonNegInt
    running_requests: NonNegInt
    queued_prompt_tokens: Tokens = 0
    kv_cache_used_frac: Fraction
    hbm_free_gib: float = Field(ge=0.0, le=MAX_GIB, allow_inf_nan=False)
    gpu_util_frac: Fraction
    prefix_cache_hit_frac: Fraction = 0.0
    hot_prefixes: tuple[Ident, ...] = Field(default=(), max_length=256)
    max_batch_tokens: Tokens = 0
    errors: NonNegInt = 0
    timeouts: NonNegInt = 0
    preemptions: NonNegInt = 0
    requests_completed: NonNegInt = 0
    prompt_tokens: Tokens = 0
    output_tokens: Tokens = 0
    cost_rate_usd_per_h: float = Field(ge=0.0, le=MAX_USD_PER_H, allow_inf_nan=False)
