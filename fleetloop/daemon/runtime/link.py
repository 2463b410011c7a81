"""The link to the broker: the session of the run (its clients, once started), retries while the
broker is away, and the connection state ``/readyz`` reports.

Every part reaches the broker through :class:`Link`: :meth:`Link.retrying` waits out a broker
that is away (transient errors only, with backoff) so nothing is committed before what was
computed from it is acknowledged; publishing the same decisions again is harmless (desired state
keyed by entity). A non-transient error reaches the loop, which resumes from the checkpoints.
:meth:`Link.watch` asks for metadata every ``BROKER_WATCH_S``. Both note a gap
(:attr:`Link.gap`): the boundaries the ticker missed while the broker was away are an outage's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from fleetloop.daemon.observability import logger
from fleetloop.daemon.runtime.port import (
    Broker,
    DecisionPublisher,
    GroupConsumer,
    PolicyReader,
    Producer,
    Session,
)
from fleetloop.daemon.service import metrics
from fleetloop.daemon.service.health import Health, one_line

log = logger("fleetloop.daemon")
BROKER_WATCH_S = 2.0  # how often the broker watch asks for metadata (connection state, /readyz)
RETRY_MAX_S = 5.0  # longest backoff between retries of a Kafka operation while the broker is away


class Link:
    def __init__(self, broker: Broker, health: Health, shown: str) -> None:
        self.broker = broker
        self.health = health
        self.shown = shown  # the bootstrap servers as logs show them
        self.session: Session | None = None  # set while the daemon runs
        self.stop: asyncio.Event | None = None
        self.gap = False  # the broker was unreachable since the ticker last published

    @property
    def consumer(self) -> GroupConsumer:
        assert self.session is not None
        return self.session.consumer

    @property
    def producer(self) -> Producer:
        assert self.session is not None
        return self.session.producer

    @property
    def policies(self) -> PolicyReader:
        assert self.session is not None
        return self.session.policies

    @property
    def publisher(self) -> DecisionPublisher:
        assert self.session is not None
        return self.session.publisher

    def is_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the broker's (or the network's): the loop resumes from the checkpoints."""
        return isinstance(exc, (self.broker.error, OSError))

    def trouble(self, operation: str, exc: BaseException) -> None:
        self.gap = True
        self.health.connected = False
        self.health.connection_error = one_line(exc)
        metrics.broker_errors.add(1, {"operation": operation})
        log.warning("broker unavailable; retrying", operation=operation, error=one_line(exc))

    async def retrying(self, operation: str, op: Callable[[], Any]) -> Any:
        """``await op()``, retried with backoff while the broker is away (transient errors only).

        A commit the group refused because it rebalanced while the broker was away is given up:
        whoever owns the partitions now resumes from the last commit (at least once; decisions
        made again are the same desired state, harmless)."""
        delay_s = 0.1
        broker = self.broker
        while True:
            try:
                return await op()
            except broker.error as exc:
                if broker.commit_failed(exc):
                    if operation != "commit":
                        raise
                    metrics.broker_errors.add(1, {"operation": operation})
                    log.warning("commit skipped: the group rebalanced", error=one_line(exc)[:200])
                    return None
                stop = self.stop
                if not broker.transient(exc) or (stop is not None and stop.is_set()):
                    raise
                self.trouble(operation, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait() if stop else asyncio.sleep(delay_s), delay_s)
                delay_s = min(delay_s * 2, RETRY_MAX_S)

    async def watch(self, stop: asyncio.Event, refresh: Callable[[], None]) -> None:
        """Ask the broker for metadata every ``BROKER_WATCH_S``: the connection state of /readyz
        (``refresh`` brings the rest of the health up to date)."""
        health = self.health
        while not stop.is_set():
            try:
                await asyncio.wait_for(self.consumer.topics(), timeout=max(BROKER_WATCH_S * 2, 5.0))
            except (self.broker.error, TimeoutError) as exc:
                self.gap = True
                if health.connected or not health.connection_error:
                    self.trouble(
                        "metadata", exc if isinstance(exc, self.broker.error) else self.broker.timeout_error()
                    )
                health.connected = False
            else:
                if not health.connected:
                    log.info("broker reachable", bootstrap=self.shown)
                health.connected = True
                health.connection_error = ""
            refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=BROKER_WATCH_S)
