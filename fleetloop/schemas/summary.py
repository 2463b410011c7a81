"""ShardSummary: what one shard of the daemon folded, as of a tick, for the fleet-wide second stage.

The daemon keeps one model per partition index of the pool-keyed topics (a *shard*,
:mod:`fleetloop.core.shard`), so fleet-wide figures (the fleet's cost rate, retry-budget use across
pools, cost per successful task) are not in any one model. After deciding a shard's ticks at a
boundary, the daemon publishes that shard's summary on ``control.summaries`` (key
``<group>/<partition>``); ``fleetloop rollup`` folds the summaries of every shard into fleet figures
on ``control.state`` (key ``fleet/fleet``, :class:`fleetloop.schemas.decisions.FleetDecision`).

Money is in integer nano-dollars (sums over shards are exact and order-independent, as in the model);
ledger counts are cumulative since the shard's history began, window figures cover ``window_ms``.
"""

from __future__ import annotations

from pydantic import Field

from fleetloop.schemas.base import MAX_COUNT, MAX_TICK_ID, EpochMs, NonNegFloat, NonNegInt, Wire

MAX_NUSD = 10**18  # the model clamps one record's money far below this; sums stay under it


class ShardSummary(Wire):
    """One shard's figures at tick boundary ``ts_ms`` (published once per boundary it decided)."""

    ts_ms: EpochMs
    tick_id: int = Field(ge=0, le=MAX_TICK_ID)
    group: str = Field(min_length=1, max_length=255, description="the daemons' consumer group")
    partition: int = Field(ge=0, le=100_000, description="partition index of the pool-keyed topics")
    window_ms: int = Field(ge=1, le=3_600_000)
    pools: NonNegInt
    nodes: NonNegInt = Field(description="nodes whose newest telemetry is within the window")
    cost_rate_usd_per_h: NonNegFloat = Field(description="sum of those nodes' cost rates")
    requests_w: NonNegInt
    retries_w: NonNegInt
    shed_w: NonNegInt
    retries_allowed: NonNegInt = Field(
        description="sum over the shard's pools of the pool-wide retry budget's retries_allowed_now"
    )
    tasks_started: int = Field(ge=0, le=MAX_COUNT * 1000)
    tasks_succeeded: int = Field(ge=0, le=MAX_COUNT * 1000)
    tasks_failed: int = Field(ge=0, le=MAX_COUNT * 1000)
    tasks_handed_off: int = Field(
        default=0,  # absent in summaries of daemons before it: read as 0
        ge=0,
        le=MAX_COUNT * 1000,
        description="tasks the shard let go after they went quiet there, their outcome another shard's",
    )
    fleet_cost_nusd: int = Field(ge=0, le=MAX_NUSD, description="GPU cost of the shard's nodes so far")
    spend_on_failed_nusd: int = Field(ge=0, le=MAX_NUSD)
