"""StateFollower: keeps a router current from ``control.state`` (the I/O shell around the pure state).

It reads every partition of ``control.state`` from the beginning (the topic is compacted: the
newest desired state per key), then follows it. Each record is decoded into a ``Decision`` and
handed to the sink (a :class:`~fleetloop.router.pick.Router`, or anything with the same ``apply``),
which keeps the newest tick per key. A record is stamped with its arrival on the router's monotonic
clock minus its age (``wall now - ts_ms``, clamped to [0, the sink's TTL]), so a router starting on an
old compacted state does not take it for fresh: the fail-static TTL counts from when fleetloop
decided, not from when this router happened to read it. A record of the change-only form (headers
``fleetloop.state_form`` 2 and ``fleetloop.refresh_ms``, :func:`~fleetloop.schemas.decisions.refresh_s_of`)
is handed over with its refresh period: its daemon re-sends an unchanged key only that often, so the
sink keeps its routing fresh that much longer. A record without them is the every-tick form.

Optionally it follows ``fleet.telemetry`` from its end and keeps :class:`Endpoint` load figures
(queue depth, running requests, warm, draining) current for admission decisions.

A malformed record is counted and its reason kept (``stats.malformed``, ``stats.last_error``); it
never stops the follower: the daemon's dead-letter topic is where bad input is reported, a router
only has to survive it. A record from a daemon newer than this router is not malformed: it is read
without the fields this version does not know, and a decision of a kind it does not know is skipped
(:func:`~fleetloop.schemas.decisions.decision_from_newer`); both are counted (``stats.newer``,
``stats.last_newer`` names what was left out), so an operator can see a router is older than its
daemon while it goes on following the state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError

from fleetloop.kafka_security import Bootstrap, connect
from fleetloop.router import clock
from fleetloop.router.pick import Endpoint
from fleetloop.router.state import DesiredState
from fleetloop.schemas.decisions import Decision, decision_from_newer, refresh_s_of
from fleetloop.schemas.telemetry import NodeTelemetry
from fleetloop.schemas.topics import STATE, TELEMETRY, topic_name


class StateSink(Protocol):
    fail_static_s: float

    def apply(
        self, decisions: Sequence[Decision], now_s: float, refresh_s: float = 0.0
    ) -> list[Decision]: ...
    def fleet_changed(self) -> None: ...


@dataclass(slots=True)
class FollowerStats:
    records: int = 0
    accepted: int = 0
    malformed: int = 0
    last_error: str = ""
    newer: int = 0  # records from a newer daemon: read without what this version does not know
    last_newer: str = ""
    telemetry: int = 0
    last_tick_id: int = -1
    caught_up: bool = False


class StateFollower:
    """Follow ``control.state`` into ``sink``; ``await start()`` returns once caught up."""

    def __init__(
        self,
        sink: StateSink,
        bootstrap_servers: Bootstrap,
        *,
        topic_prefix: str = "",
        endpoints: Mapping[str, Endpoint] | None = None,
        on_accepted: Callable[[list[Decision]], None] | None = None,
        consumer_options: Mapping[str, Any] | None = None,
        poll_ms: int = 100,
    ) -> None:
        self.sink = sink
        self.endpoints = endpoints
        self.on_accepted = on_accepted
        self.stats = FollowerStats()
        self._state_topic = topic_name(topic_prefix, STATE)
        self._tel_topic = topic_name(topic_prefix, TELEMETRY)
        self._poll_ms = poll_ms
        self._consumer = AIOKafkaConsumer(
            **connect(bootstrap_servers),  # a host:port list, or a KafkaConnection (TLS, SASL)
            enable_auto_commit=False,
            group_id=None,
            **dict(consumer_options or {}),
        )
        self._task: asyncio.Task[None] | None = None
        self._caught_up = asyncio.Event()
        self._targets: dict[TopicPartition, int] = {}

    async def start(self, *, catch_up_timeout_s: float = 30.0) -> None:
        """Connect, read ``control.state`` from the beginning up to its end, then follow in the background."""
        c = self._consumer
        try:
            await c.start()  # inside the try: a start that fails closes the consumer too
            parts = await self._partitions(self._state_topic)
            state_tps = [TopicPartition(self._state_topic, p) for p in parts]
            tps = list(state_tps)
            tel_tps: list[TopicPartition] = []
            if self.endpoints is not None:
                tel_parts = await self._partitions(self._tel_topic)
                tel_tps = [TopicPartition(self._tel_topic, p) for p in tel_parts]
                tps += tel_tps
            c.assign(tps)
            await c.seek_to_beginning(*state_tps)
            if tel_tps:
                await c.seek_to_end(*tel_tps)
            ends = await c.end_offsets(state_tps)
            self._targets = {tp: off for tp, off in ends.items() if off > 0}
            if not self._targets:
                self._mark_caught_up()
            self._task = asyncio.create_task(self._run(), name="fleetloop-router-follow")
            await asyncio.wait_for(self._caught_up.wait(), catch_up_timeout_s)
        except BaseException:
            await self.stop()
            raise

    async def _partitions(self, topic: str) -> list[int]:
        """The topic's partitions, from a fresh metadata fetch (the consumer's own cache only knows
        topics it already tracks; Apache Kafka and Tansu differ in what a first fetch returns)."""
        for _ in range(50):
            cluster = await self._consumer._client.fetch_all_metadata()
            parts = cluster.partitions_for_topic(topic)
            if parts:
                return sorted(parts)
            await asyncio.sleep(0.1)
        raise RuntimeError(f"topic {topic!r} does not exist on the broker")

    def _mark_caught_up(self) -> None:
        self.stats.caught_up = True
        self._caught_up.set()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._consumer.stop()

    async def _run(self) -> None:
        c = self._consumer
        while True:
            batch = await c.getmany(timeout_ms=self._poll_ms, max_records=5000)
            decisions: list[tuple[Decision, float]] = []
            for tp, records in batch.items():
                if tp.topic == self._tel_topic:
                    self._telemetry([r.value for r in records if r.value is not None])
                    continue
                for r in records:
                    self.stats.records += 1
                    if r.value is None:
                        continue
                    dropped: list[str] = []
                    try:
                        d = decision_from_newer(r.value, dropped)
                    except ValidationError as exc:
                        self.stats.malformed += 1
                        why = exc.errors()[0]["msg"]
                        self.stats.last_error = f"{tp.topic}:{tp.partition}:{r.offset}: {why}"
                        continue
                    if dropped:
                        self.stats.newer += 1
                        self.stats.last_newer = f"{tp.topic}:{tp.partition}:{r.offset}: {', '.join(dropped)}"
                    if d is not None:
                        decisions.append((d, refresh_s_of(r.headers)))
                if records and tp in self._targets and records[-1].offset + 1 >= self._targets[tp]:
                    del self._targets[tp]
            if decisions:
                self._apply(decisions)
            if not self._caught_up.is_set() and not self._targets:
                self._mark_caught_up()

    def _apply(self, decisions: list[tuple[Decision, float]]) -> None:
        now_s = clock.monotonic_s()
        wall = clock.wall_ms()
        ttl = self.sink.fail_static_s
        accepted: list[Decision] = []
        # One call per age bucket would be exact; one per record keeps it simple and is cheap.
        for d, refresh_s in decisions:
            age_s = min(max(0.0, (wall - d.ts_ms) / 1000.0), ttl + refresh_s + 1.0)
            accepted += self.sink.apply([d], now_s - age_s, refresh_s)
            self.stats.last_tick_id = max(self.stats.last_tick_id, d.tick_id)
        self.stats.accepted += len(accepted)
        if accepted and self.on_accepted is not None:
            self.on_accepted(accepted)

    def _telemetry(self, values: list[bytes]) -> None:
        eps = self.endpoints
        if eps is None:
            return
        changed = False
        for v in values:
            self.stats.telemetry += 1
            try:
                t = NodeTelemetry.model_validate(orjson.loads(v))
            except (ValidationError, orjson.JSONDecodeError):
                self.stats.malformed += 1
                continue
            ep = eps.get(t.node_id)
            if ep is None:
                continue
            warm = t.weights_state == "warm"
            if ep.draining != t.draining or ep.warm != warm:
                changed = True
            ep.queue_depth = t.queue_depth
            ep.running = t.running_requests
            ep.warm = warm
            ep.draining = t.draining
        if changed:
            self.sink.fleet_changed()


class StateOnly:
    """A sink that only keeps desired state (for actuators, which pick nothing per call)."""

    def __init__(self, fail_static_s: float = 30.0) -> None:
        self.state = DesiredState()
        self.fail_static_s = fail_static_s

    def apply(self, decisions: Sequence[Decision], now_s: float, refresh_s: float = 0.0) -> list[Decision]:
        return [d for d in decisions if self.state.accept(d, now_s, refresh_s)]

    def fleet_changed(self) -> None:
        return None
