"""The reconcile loop every actuator runs: one pass now, then again on a wake-up or a period.

A pass that fails with the target's own error (its API unreachable, an answer it cannot parse) is
counted and logged once per distinct message, and retried on the next period: an actuator never
stops because its target is briefly away. Any other exception is a bug and propagates.

On a clean exit (the loop stopped: SIGTERM, SIGINT) an actuator restores its target's plain state
unless told to keep the last one (``--keep-state-on-exit``): what the target is with no fleetloop
decision held, the rotation rule's fail-static (:mod:`fleetloop.router.state`): every mapped HAProxy
server ready at the plain weight with no maxconn, every mapped worker listed. A dead actuator must
not leave servers in maint or workers removed that nothing will ever bring back; each change is
logged (``restore: ...``), then one line says how many there were.
"""

from __future__ import annotations

import abc
import argparse
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


# How long a clean exit waits for the plain state to be restored: an orchestrator's grace period
# (Kubernetes: 30 s by default) must still see the process end by itself.
RESTORE_S = 10.0


def keep_state_arg(p: argparse.ArgumentParser, plain: str) -> None:
    """``--keep-state-on-exit``, which every actuator takes; ``plain`` says what it restores without it."""
    p.add_argument(
        "--keep-state-on-exit",
        action="store_true",
        help=f"on SIGTERM/SIGINT leave the router as last reconciled (default: restore {plain})",
    )


class Reconciler(abc.ABC):
    """Base of an actuator: ``run`` drives its ``reconcile`` pass with :func:`reconcile_forever`.

    A subclass names its target's error class and logger, sets ``wake`` and ``period_s``, and counts
    a failed pass in ``failed`` (its stats keep the last message for ``last_error``)."""

    target_error: ClassVar[type[Exception]]
    log: ClassVar[logging.Logger]
    wake: asyncio.Event
    period_s: float

    @abc.abstractmethod
    async def reconcile(self) -> Any:
        raise NotImplementedError

    @abc.abstractmethod
    async def restore(self) -> list[Any]:
        """One pass to the plain state (the targets of a state that holds no decision); the changes."""
        raise NotImplementedError

    @abc.abstractmethod
    def failed(self, message: str) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def last_error(self) -> str:
        raise NotImplementedError

    async def run(self, stop: asyncio.Event, *, restore_on_exit: bool = False) -> None:
        """Reconcile until ``stop`` is set; then, with ``restore_on_exit``, :meth:`restore` once."""
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
        if restore_on_exit:
            try:
                done = await asyncio.wait_for(self.restore(), RESTORE_S)
            except self.target_error as exc:
                self.log.error("exit: the plain state was not restored: %s", exc)
                return
            except TimeoutError:
                self.log.error("exit: the plain state was not restored within %.0f s", RESTORE_S)
                return
            self.log.info("exit: plain state restored (%d change(s))", len(done))
        else:
            self.log.info("exit: last state kept (--keep-state-on-exit)")
