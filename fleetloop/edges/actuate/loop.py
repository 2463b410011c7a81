"""The reconcile loop every actuator runs: one pass now, then again on a wake-up or a period.

A pass that fails with the target's own error (its API unreachable, an answer it cannot parse) is
counted and logged once per distinct message, and retried on the next period: an actuator never
stops because its target is briefly away. Any other exception is a bug and propagates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar


async def reconcile_forever(
    reconcile: Callable[[], Awaitable[Any]],
    *,
    stop: asyncio.Event,
    wake: asyncio.Event,
    period_s: float,
    target_error: type[Exception],
    on_error: Callable[[str], None],
    last_error: Callable[[], str],
    log: logging.Logger,
) -> None:
    """Run ``reconcile`` until ``stop`` is set; ``on_error(message)`` records a failed pass."""
    while not stop.is_set():
        try:
            await reconcile()
        except target_error as exc:
            if str(exc) != last_error():
                log.error("%s (retrying every %.1f s)", exc, period_s)
            on_error(str(exc))
        wake.clear()
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
        await asyncio.wait(waits, timeout=period_s, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


class Reconciler:
    """Base of an actuator: ``run`` drives its ``reconcile`` pass with :func:`reconcile_forever`.

    A subclass names its target's error class and logger, sets ``wake`` and ``period_s``, and counts
    a failed pass in ``failed`` (its stats keep the last message for ``last_error``)."""

    target_error: ClassVar[type[Exception]]
    log: ClassVar[logging.Logger]
    wake: asyncio.Event
    period_s: float

    async def reconcile(self) -> Any:
        raise NotImplementedError

    def failed(self, message: str) -> None:
        raise NotImplementedError

    def last_error(self) -> str:
        raise NotImplementedError

    async def run(self, stop: asyncio.Event) -> None:
        await reconcile_forever(
            self.reconcile,
            stop=stop,
            wake=self.wake,
            period_s=self.period_s,
            target_error=self.target_error,
            on_error=self.failed,
            last_error=self.last_error,
            log=self.log,
        )
