"""What the capacity autoscaler keeps between ticks, per pool (checkpointed with the shard, so it
survives a restart): the demand history its forecast reads, the figures it learns from telemetry,
the bursts it has seen, and its own recent targets."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Burst:
    """A rise of demand beyond what the pool was sized for a cold start earlier (README.md,
    "Bursts"): when it began, the demand it rose from, its peak over that, how long it took to
    reach the peak and to fall back, and the tasks the pool lost while it lasted."""

    start_ms: int
    base: float  # calls/s forecast for the start, a cold start before it
    ratio: float  # peak / base
    rise_s: float
    duration_s: float
    lost_tasks: int


@dataclass(frozen=True, slots=True)
class Episode:
    """A burst under way: demand above the upper bound planned a cold start earlier."""

    start_ms: int
    base: float
    bound: float  # the upper bound it broke
    noise: float  # the forecast's standard deviation then
    peak: float
    peak_ms: int
    failed_at_start: int  # the pool's failed-task count when it began


@dataclass(frozen=True, slots=True)
class CapacityState:
    # (event time ms, calls/s arriving, the plan's forecast, the plan's upper bound), oldest first
    demand: tuple[tuple[int, float, float, float], ...] = ()
    # (event time ms, calls running or queued on the pool's active nodes), over one window
    in_system: tuple[tuple[int, int], ...] = ()
    cold_start_s: float | None = None  # learned cold -> warm time
    not_warm_since: tuple[tuple[str, int], ...] = ()  # node id -> first seen cold or loading
    # (calls/s, prompt tokens/s, output tokens/s) of the window, smoothed: the mix is their ratios
    rates: tuple[float, float, float] | None = None
    kv_per_call: float | None = None  # learned KV tokens per running call
    slow: float | None = None  # learned iteration time over the physics' (1: as predicted)
    recs: tuple[tuple[int, int], ...] = ()  # (event time ms, raw target) over the down window
    last_desired: int | None = None
    # No longer written or read (the engine's drain list, ``PolicyContext.draining``, says which
    # nodes are leaving); kept so a checkpoint written before still decodes.
    drained: tuple[tuple[str, int], ...] = ()
    failed_tasks: int = 0  # the pool's failed-task count at the last tick
    last_failure_ms: int | None = None
    # (event time ms, open workflows, tasks started so far, tasks ended so far), oldest first
    open_workflows: tuple[tuple[int, int, int, int], ...] = ()
    episode: Episode | None = None
    bursts: tuple[Burst, ...] = ()  # remembered, oldest first
