"""Tick: the event that makes fleetloop decide. Ticks travel on ``control.ticks`` so a replay sees
exactly the ticks the live run saw (STYLE.md, rule 3)."""

from __future__ import annotations

from fleetloop.schemas.base import EpochMs, Ident, NonNegInt, Wire


class Tick(Wire):
    """Decide for ``pool_id`` as of event time ``ts_ms``. ``tick_id`` increases by one per tick."""

    ts_ms: EpochMs
    tick_id: NonNegInt
    pool_id: Ident
