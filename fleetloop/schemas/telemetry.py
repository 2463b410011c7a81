"""NodeTelemetry: what a serving node reports about itself, once per interval."""

from __future__ import annotations

from typing import Annotated, Final, Literal

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

MAX_ENGINE_CHARS: Final = 32
# The serving engine's name, lower case as the engines spell themselves (``vllm``, ``sglang``,
# ``trtllm``): a bounded identifier. A name this version does not know is well-formed and kept;
# the capacity model reads it as "engine unknown" (fleetloop/policies/autoscale/capacity).
EngineName = Annotated[
    str, Field(min_length=1, max_length=MAX_ENGINE_CHARS, pattern=r"^[a-z0-9][a-z0-9_.-]*$")
]


def _unset(value: object) -> bool:
    return value is None


class NodeTelemetry(Wire):
    """One serving node (one model replica, one or more GPUs) over one reporting interval.

    Latency figures are over the interval ending at ``ts_ms``; counters (errors, tokens) count the
    interval only, so a consumer can sum them without differencing. Keyed by ``pool_id`` on the wire.

    ``engine`` names the serving engine the node runs (``vllm``, ``sglang``, ``trtllm``; absent:
    not known to the producer). It came after the other fields and is written only when set, so a
    record without it is byte for byte what earlier daemons read (``extra="forbid"``) and a record
    from an earlier producer decodes with ``engine`` None: producers and daemons upgrade in either
    order until a producer names an engine. A name in lower case that fleetloop has no runtime
    profile for (``lmdeploy``) is a valid record: the capacity model then plans with the pool's
    stated engine (the vLLM profile unless the policy names one). A name that is not such an
    identifier (upper case, spaces, over 32 characters, not a string) makes the record malformed:
    it goes to the dead-letter topic with the reason, like any other bad field.
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
    # Whole prompts, cached tokens included, of calls whose prefill ended in the interval (vLLM's
    # ``prompt_tokens_total``), and the tokens generated in it: the pool's token rates when its
    # routers' outcomes carry none (fleetloop.core.model.snapshot).
    prompt_tokens: Tokens = 0
    output_tokens: Tokens = 0
    cost_rate_usd_per_h: float = Field(ge=0.0, le=MAX_USD_PER_H, allow_inf_nan=False)
    # Written only when set (see the class docstring).
    engine: EngineName | None = Field(
        default=None,
        exclude_if=_unset,
        description="serving engine (vllm, sglang, trtllm); a name without a runtime profile: engine unknown",
    )
