"""RequestOutcome: what a router saw of one model call (one attempt of one step of a workflow)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fleetloop.schemas.base import MAX_DURATION_MS, DurationMs, EpochMs, Ident, NonNegInt, Tokens, Usd, Wire

Outcome = Literal["ok", "error", "timeout", "shed", "retry"]
TaskOutcome = Literal["succeeded", "failed"]


def _unset(value: object) -> bool:
    return value is None


class RequestOutcome(Wire):
    """One attempt of one call. ``retry`` means this attempt failed and the client will retry it.

    ``workflow_spend_usd`` is what the workflow had spent before this call (a call at step 3 of 5
    carries the spend of steps 1-2); ``cost_usd`` is this attempt's own GPU cost. The last call of a
    task carries ``task_outcome``. ``node_id`` is absent when the router shed the call before placing it.
    ``routed_from`` names the pool the router preferred when it moved the call to a pool of another
    model the caller accepts (its model spill, :mod:`fleetloop.router.pick`): that pool's demand
    includes the call, though it did not serve it. Keyed by ``pool_id`` on the wire.

    ``diverted_to`` marks the *copy* of such a record (:func:`diverted_copy`): the same call with
    ``pool_id`` set to the pool it was moved from, so that it is keyed, and partitioned, with that
    pool's records and reaches the shard that sizes it. The daemon folds a copy as that pool's
    diverted demand (its tokens) and as nothing else: not a request, not a task's call, not a node's.
    """

    ts_ms: EpochMs
    request_id: Ident
    attempt: int = Field(default=0, ge=0, le=100)
    workflow_id: Ident
    step_index: NonNegInt
    workflow_spend_usd: Usd = 0.0
    tenant_id: Ident
    priority: int = Field(ge=0, le=9)
    latency_budget_ms: int = Field(ge=0, le=int(MAX_DURATION_MS))
    pool_id: Ident
    node_id: Ident | None = None
    model: Ident
    prompt_tokens: Tokens
    cached_prompt_tokens: Tokens = 0
    output_tokens: Tokens = 0
    prefix_digest: Ident | None = None
    ttft_ms: DurationMs | None = None
    e2e_ms: DurationMs
    outcome: Outcome
    cost_usd: Usd = 0.0
    task_outcome: TaskOutcome | None = None
    # Written only when set: a record of a call that was not moved is byte for byte what daemons
    # before this field read (``extra="forbid"``), so routers and daemons upgrade in either order
    # until a router moves a call.
    routed_from: Ident | None = Field(default=None, exclude_if=_unset)
    # Set only on a moved call's copy (written only when set, as ``routed_from``).
    diverted_to: Ident | None = Field(default=None, exclude_if=_unset)

    @model_validator(mode="after")
    def _consistent(self) -> RequestOutcome:
        if self.cached_prompt_tokens > self.prompt_tokens:
            raise ValueError("cached_prompt_tokens exceeds prompt_tokens")
        if self.outcome != "shed" and self.node_id is None:
            raise ValueError(f"outcome {self.outcome!r} needs node_id (only a shed call has no node)")
        if self.diverted_to is not None and (self.diverted_to == self.pool_id or self.outcome == "shed"):
            raise ValueError("a diverted copy names another pool, and a call that was placed")
        return self


def diverted_copy(o: RequestOutcome) -> RequestOutcome | None:
    """The copy to publish beside ``o`` when the router moved the call (``o.routed_from`` set, and
    placed: not shed): keyed by the pool it was moved from, carrying the call's tokens, no cost and
    no task outcome. None when there is nothing to copy."""
    pref = o.routed_from
    if pref is None or pref == o.pool_id or o.outcome == "shed" or o.diverted_to is not None:
        return None
    return o.model_copy(update=diverted_copy_update(o.pool_id, pref))


def diverted_copy_update(served_by: str, moved_from: str) -> dict[str, object]:
    """The fields a moved call's copy changes (:func:`diverted_copy`; the simulator applies them to
    a record's fields directly)."""
    return {"pool_id": moved_from, "diverted_to": served_by, "routed_from": None, "cost_usd": 0.0,
            "task_outcome": None}  # fmt: skip
