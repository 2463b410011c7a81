"""The per-node memory's window, as the oracles state it: what a tick keeps of a node's remembered
figures before adding its own."""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T", bound=tuple[Any, ...])


def kept(obs: tuple[T, ...], now: int, memory_ms: int) -> tuple[T, ...]:
    """The figures with ``0 < now - ts < memory_ms`` (``ts`` first in each).

    The memory is in ascending event time (each tick appends ``now`` after dropping everything at
    or after it), so what is kept is one slice: the figures too old are a prefix, those not before
    ``now`` (a tick decided again) a suffix."""
    lo, hi = 0, len(obs)
    while lo < hi and now - obs[lo][0] >= memory_ms:
        lo += 1
    while hi > lo and obs[hi - 1][0] >= now:
        hi -= 1
    return obs[lo:hi] if lo or hi < len(obs) else obs
