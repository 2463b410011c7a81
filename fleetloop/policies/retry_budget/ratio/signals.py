"""What ratio reads besides the window's counts: the mass-failure episode, from the pool's serving
and lost nodes (README.md beside this file: "Mass failure, the episode"). The pool's counts come from
the fleet-wide columns (:mod:`fleetloop.policies.pool_figures`); ``tests/oracles/ratio.py`` states
them node by node."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleetloop.policies.retry_budget.ratio.params import RatioParams


@dataclass(frozen=True, slots=True)
class Episode:
    """A mass failure in progress: the serving nodes before it (``ref``), when it began, when a
    node was last seen lost, and the most nodes it has been short (``peak``: the ratio it adds
    while the survivors' queue drains after the nodes are back)."""

    ref: int
    since_ms: int
    last_loss_ms: int
    peak: int = 0


def episode_after(
    params: RatioParams,
    episode: Episode | None,
    warm: int,
    *,
    lost_now: Callable[[], int],
    now_ms: int,
    window_ms: int,
    failing: int = 0,
) -> tuple[Episode | None, int, int]:
    """(the episode after this tick, ``k`` nodes short, ``warm`` nodes serving) from the pool's
    counts: ``warm`` nodes serving (warm, fresh), ``lost_now()`` nodes lost (asked only when an
    episode can start), ``failing`` calls failed in the window on nodes still loaded (the pool's
    failures less those lost with their nodes). No episode without ``exempt_shed_and_lost`` or with
    ``episode_max_s`` 0.

    ``k`` is ``ref - warm`` while nodes are missing; once they are back it stays at the episode's
    ``peak`` while the survivors still fail calls: the queue they built while short (the lost
    nodes' calls) times out for up to a client timeout after the capacity returns, and those
    retries are the displaced load's, not a storm's (README.md beside this file)."""
    if not params.exempt_shed_and_lost or params.episode_max_s <= 0:
        return None, 0, warm
    lost = lost_now()
    if lost:
        if episode is None:
            episode = Episode(ref=warm + lost, since_ms=now_ms, last_loss_ms=now_ms)
        else:
            episode = Episode(max(episode.ref, warm + lost), episode.since_ms, now_ms, episode.peak)
    if episode is None:
        return None, 0, warm
    short = max(0, episode.ref - warm)
    if short > episode.peak:
        episode = Episode(episode.ref, episode.since_ms, episode.last_loss_ms, short)
    over = now_ms - episode.since_ms >= params.episode_max_s * 1000.0
    back = warm >= episode.ref and now_ms - episode.last_loss_ms >= window_ms and failing <= 0
    if over or back:
        return None, 0, warm
    return episode, short if short else episode.peak, warm
