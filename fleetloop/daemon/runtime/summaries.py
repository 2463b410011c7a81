"""Shard summaries on ``control.summaries``: the fleet-wide second stage's input
(:mod:`fleetloop.daemon.rollup`). Each shard that decided ticks in a batch publishes one summary of
its model (:func:`fleetloop.core.rollup.summarize`) for the newest boundary it decided, with each
pool's newest pool-wide retry budget, once every tick of that boundary it holds is decided."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

import orjson

from fleetloop.core.decide.engine import Engine, envelope_of
from fleetloop.core.rollup import summarize
from fleetloop.daemon.runtime.config import DaemonConfig
from fleetloop.daemon.runtime.link import Link
from fleetloop.daemon.runtime.partition import Partitions
from fleetloop.daemon.runtime.telemetry import DaemonStats
from fleetloop.schemas.control import Tick
from fleetloop.schemas.decisions import Decision, RetryBudgetDecision
from fleetloop.schemas.topics import SUMMARIES, topic_name


class Summaries:
    def __init__(
        self, config: DaemonConfig, parts: Partitions, link: Link, *, engine: Engine, stats: DaemonStats
    ) -> None:
        self.config = config
        self.parts = parts
        self.link = link
        self.engine = engine  # its active policy's envelope window is the summaries'
        self.stats = stats
        self.topic = topic_name(config.prefix, SUMMARIES)
        # Per partition index: the newest tick decided in this batch, and per pool its newest
        # pool-wide retry budget.
        self.due: dict[int, tuple[int, int]] = {}
        self.retries_allowed: dict[int, dict[str, int]] = {}

    def note(self, index: int, tick: Tick, decided: Sequence[Decision]) -> None:
        """Shard ``index`` decided ``tick``: its summary is due (for the newest boundary of the batch)."""
        due = self.due.get(index)
        if due is None or tick.ts_ms >= due[0]:
            self.due[index] = (tick.ts_ms, tick.tick_id)
        allowed = self.retries_allowed.setdefault(index, {})
        for d in decided:
            body = d.body
            if isinstance(body, RetryBudgetDecision) and body.tenant_id is None:
                allowed[body.pool_id] = body.retries_allowed_now

    async def publish(self) -> None:
        """Each shard that decided ticks in this batch publishes its summary for the newest boundary
        it decided, once every tick of that boundary it holds is decided: a boundary whose pools'
        ticks were split over two batches is summarized once, after the second, with every pool's
        retry budget of that boundary."""
        due, self.due = self.due, {}
        if self.link.session is None or not due:
            return
        producer = self.link.producer
        window_ms = envelope_of(self.engine.policy).window_ms
        futures: list[Awaitable[Any]] = []
        for p, (ts_ms, tick_id) in sorted(due.items()):
            owned = self.parts.get(p)
            if owned is None:
                continue
            held = owned.held
            if held and held[0].tick is not None and held[0].tick.ts_ms <= ts_ms:
                self.due[p] = (ts_ms, tick_id)  # ticks of this boundary still to decide
                continue
            shard = owned.shard
            allowed = self.retries_allowed.get(p, {})
            for pool in [q for q in allowed if q not in shard.model.pools]:
                del allowed[pool]  # evicted pools: bounded by the model's pool cap
            summary = summarize(
                shard.model,
                group=self.config.group_id,
                partition=p,
                ts_ms=ts_ms,
                tick_id=tick_id,
                window_ms=window_ms,
                retries_allowed=allowed,
            )
            futures.append(
                await producer.send(
                    self.topic,
                    key=f"{self.config.group_id}/{p}".encode(),
                    value=orjson.dumps(summary.model_dump(mode="json")),
                )
            )
        await asyncio.gather(*futures)
        self.stats.summaries_published += len(futures)
