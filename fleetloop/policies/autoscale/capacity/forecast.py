"""The demand forecast over one cold start and its uncertainty (README.md, "Forecast"), and the
bursts the pool remembers (README.md, "Bursts"). Pure functions of the history the state keeps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from fleetloop.policies.autoscale.capacity.state import Burst, Episode

Sample = tuple[int, float, float, float]  # (event time ms, arrivals, forecast, upper bound)

MIN_PAIRS = 3.0  # independent windows of lagged differences needed to read the spread from history
BURST_SIGMAS = 3.0  # a burst's peak stands this many standard deviations above the forecast it broke


def lagged_spread(
    samples: Sequence[tuple[int, float]], lag_ms: float, window_ms: int, slope: float
) -> float | None:
    """The root mean square of ``x(t + lag) - x(t) - slope * lag`` over the history: how far demand
    wanders within one lead beyond its trend. None when the history holds fewer than ``MIN_PAIRS``
    independent windows of such pairs (samples a window apart are independent counts)."""
    if len(samples) < 2 or lag_ms <= 0:
        return None
    t_last = samples[-1][0]
    pairs: list[float] = []
    j = 0
    n = len(samples)
    first_ms = samples[0][0]
    last_i_ms = first_ms
    for i in range(n):
        ti, xi = samples[i]
        if t_last - ti < lag_ms:
            break
        j = max(j, i + 1)
        while j < n and samples[j][0] - ti < lag_ms:
            j += 1
        if j >= n:
            break
        tj, xj = samples[j]
        pairs.append(xj - xi - slope * (tj - ti) / 1000.0)
        last_i_ms = ti
    if not pairs or (last_i_ms - first_ms) / max(1, window_ms) + 1.0 < MIN_PAIRS:
        return None
    return math.sqrt(sum(d * d for d in pairs) / len(pairs))


def counting_spread(rate: float, window_ms: int) -> float:
    """The standard deviation of the difference of two independent window counts of a Poisson
    stream at ``rate`` calls/s, as a rate: ``sqrt(2 rate / w)``; at least one call per window."""
    w = max(1, window_ms) / 1000.0
    return math.sqrt(2.0 * max(rate, 1.0 / w) / w)


def plan_then(history: Sequence[Sample], now: int, lead_ms: float) -> Sample | None:
    """The newest sample at least one lead old: the plan the pool's nodes were bought for."""
    found = None
    for s in history:
        if now - s[0] >= lead_ms:
            found = s
        else:
            break
    return found


def follow_episode(
    episode: Episode | None,
    *,
    now: int,
    arrivals: float,
    then: Sample | None,
    z: float,
    failed_tasks: int,
) -> tuple[Episode | None, Burst | None]:
    """(the episode after this tick, the burst it leaves when it ends). An episode opens when the
    arrivals break the upper bound planned a lead earlier; it follows the peak, and ends when the
    arrivals are back within that bound. It is remembered as a burst only when its peak stood at
    least ``BURST_SIGMAS`` standard deviations above the forecast it broke (a plan's bound is broken
    by chance one tick in twenty; a real step stands far past it)."""
    if episode is None:
        if then is None or arrivals <= then[3]:
            return None, None
        noise = (then[3] - then[2]) / z if z > 0 else 0.0
        return Episode(now, then[2], then[3], noise, arrivals, now, failed_tasks), None
    if arrivals > episode.bound:
        if arrivals > episode.peak:
            episode = replace(episode, peak=arrivals, peak_ms=now)
        return episode, None
    if episode.peak - episode.base < BURST_SIGMAS * episode.noise or episode.base <= 0.0:
        return None, None
    burst = Burst(
        start_ms=episode.start_ms,
        base=episode.base,
        ratio=episode.peak / episode.base,
        rise_s=(episode.peak_ms - episode.start_ms) / 1000.0,
        duration_s=(now - episode.start_ms) / 1000.0,
        lost_tasks=max(0, failed_tasks - episode.failed_at_start),
    )
    return None, burst
