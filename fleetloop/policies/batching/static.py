"""static-batching: a fixed per-pool cap on tokens per batch iteration.

Formula: ``max_batch_tokens = max_batch_tokens`` (param). Inputs: none. Parameters:
``max_batch_tokens`` 8192 (256-1 048 576; vLLM's default for chunked prefill is 2048-8192).
Trade-offs: never adapts; a cap too high lets prefill stall decodes (TBT), too low wastes GPU.
Failure mode: none beyond a poor constant.
"""

from __future__ import annotations

from pydantic import Field

from fleetloop.policies.base import FleetSnapshot, Params, PolicyContext, PolicyResult
from fleetloop.schemas.decisions import BatchingDecision


class StaticBatchingParams(Params):
    max_batch_tokens: int = Field(default=8192, ge=256, le=1_048_576)


class StaticBatching:
    name = "static-batching"
    section = "batching"
    Params = StaticBatchingParams

    def initial_state(self) -> None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: StaticBatchingParams, state: None, ctx: PolicyContext
    ) -> PolicyResult[None]:
        decision = BatchingDecision(
            entity=f"pool/{ctx.pool_id}",
            pool_id=ctx.pool_id,
            max_batch_tokens=params.max_batch_tokens,
            reason="static",
        )
        return PolicyResult(decisions=(decision,), state=None)
