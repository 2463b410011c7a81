"""control.state when it changes, plus a refresh (:mod:`fleetloop.daemon.act.state_changes`): the
rule on its own, then the daemon on the in-memory broker in virtual time, where a reader of
control.state must hold, after every tick, what a reader of every decision holds."""

from __future__ import annotations

import asyncio
import itertools
import zlib
from typing import Any

from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatch
from fleetloop.daemon.act.publish import Publisher
from fleetloop.daemon.act.state_changes import StateChanges
from fleetloop.router.state import DesiredState
from fleetloop.schemas.decisions import (
    CHANGE_ONLY_FORM,
    FORM_HEADER,
    REFRESH_HEADER,
    Decision,
    refresh_s_of,
    state_headers,
)
from fleetloop.schemas.topics import DECISIONS, STATE
from tests.support.memory_broker import MemoryBroker
from tests.support.runtime_harness import TICK_MS, daemon, fleet, replay, running
from tests.support.virtual_time import FakeClock, run_virtual

T0 = 1_800_000_000_000
STAMP = {"name": "p", "version": 1, "hash": "0123456789abcdef", "mode": "enforce"}


def routing(tick_id: int, weights: dict[str, float], *, inputs: float = 0.0, pool: str = "a") -> Decision:
    return Decision.model_validate(
        {
            "ts_ms": tick_id * TICK_MS,
            "tick_id": tick_id,
            "policy": STAMP,
            "body": {
                "kind": "routing",
                "entity": f"pool/{pool}",
                "pool_id": pool,
                "reason": "balanced",
                "weights": weights,
                "inputs": {"load": inputs},
            },
        }
    )


W = {"n1": 0.5, "n2": 0.5}


def quiet(pool: str = "a", span: int = 6) -> int:
    """A tick id from which ``span`` ticks of the pool's routing key share one refresh slot."""
    phase = zlib.crc32(f"routing/pool/{pool}".encode()) % 10_000
    t = 100
    while (t * TICK_MS + phase) // 10_000 != ((t + span) * TICK_MS + phase) // 10_000:
        t += 1
    return t


def test_an_unchanged_key_is_sent_once_then_only_at_its_refresh() -> None:
    rule = StateChanges(10_000)
    first = 1_000
    sent = [t for t in range(first, first + 60) if rule.publish(routing(t, W, inputs=t))]
    assert sent[0] == first  # never sent before: sent
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    # The first refresh at the key's own slot boundary (staggered by key), then one every 10 s,
    # whatever the explanatory inputs say.
    assert 1 <= gaps[0] <= 10, gaps
    assert len(gaps) >= 5, gaps
    assert all(g == 10 for g in gaps[1:]), gaps


def test_a_change_of_what_the_key_asks_for_is_sent_at_once() -> None:
    rule = StateChanges(10_000)
    t = quiet()
    assert rule.publish(routing(t, W))
    assert not rule.publish(routing(t + 1, W))
    assert rule.publish(routing(t + 2, {"n1": 0.6, "n2": 0.4}))
    assert not rule.publish(routing(t + 3, {"n1": 0.6, "n2": 0.4}))
    shadow = routing(t + 4, {"n1": 0.6, "n2": 0.4}).model_copy(
        update={"policy": routing(t + 4, W).policy.model_copy(update={"hash": "fedcba9876543210"})}
    )
    assert rule.publish(shadow)  # another policy's decision, the same weights: sent


def test_a_key_not_decided_on_the_tick_before_is_sent() -> None:
    """After boundaries not decided here (a rebalance took the partition away and gave it back:
    another owner may have sent other state meanwhile), the first decision is sent."""
    rule = StateChanges(10_000)
    t = quiet()
    assert rule.publish(routing(t, W))
    assert not rule.publish(routing(t + 1, W))
    assert rule.publish(routing(t + 4, W))


def test_refresh_zero_is_the_every_tick_form() -> None:
    rule = StateChanges(0)
    assert all(rule.publish(routing(t, W)) for t in range(100, 130))
    assert state_headers(0) == []


def test_keys_not_decided_for_a_refresh_period_are_forgotten() -> None:
    rule = StateChanges(10_000)
    rule.publish(routing(100, W, pool="gone"))
    for t in range(100, 140):
        rule.publish(routing(t, W))
    assert len(rule) == 1


def test_the_form_is_named_in_the_headers_and_read_back() -> None:
    headers = state_headers(10_000)
    assert dict(headers) == {FORM_HEADER: CHANGE_ONLY_FORM, REFRESH_HEADER: b"10000"}
    assert refresh_s_of(headers) == 10.0
    assert refresh_s_of([]) == 0.0  # the every-tick form
    assert refresh_s_of([(FORM_HEADER, b"3"), (REFRESH_HEADER, b"10000")]) == 0.0  # a form not known
    assert refresh_s_of([(FORM_HEADER, CHANGE_ONLY_FORM), (REFRESH_HEADER, b"soon")]) == 0.0


def _wanted(d: Decision) -> tuple[Any, ...]:
    body = d.body.model_dump(mode="json")
    body.pop("inputs")
    return d.policy.hash, tuple(sorted((k, str(v)) for k, v in body.items()))


def test_the_daemon_sends_changes_and_refreshes_and_a_state_reader_loses_nothing() -> None:
    """40 s of a steady fleet: control.state holds a fraction of the enforced decisions, and after
    every tick the newest record per key on control.state asks for what the newest on
    control.decisions asks for; the records say their form; replay is exact."""

    async def main(clock: FakeClock) -> tuple[list[Any], list[Any], bool]:
        broker = MemoryBroker(clock)
        d = daemon(broker, clock)
        async with running(d):
            await fleet(broker, clock, ["a", "b"], T0 + 40 * TICK_MS, nodes=4)
        return broker.records(DECISIONS), broker.records(STATE), replay(broker, d).exact

    logged, state, exact = run_virtual(main, wall_ms=T0)
    assert exact
    assert state
    assert all(refresh_s_of(r.headers) == 10.0 for r in state)
    every = [Decision.model_validate_json(r.value or b"") for r in logged]
    sent = [Decision.model_validate_json(r.value or b"") for r in state]
    assert len(sent) < len(every) / 2, (len(sent), len(every))
    # What a router holds after each tick: the newest record per key, from either topic.
    held_all: dict[str, Decision] = {}
    held_state: dict[str, Decision] = {}
    i = 0
    for tick_id in sorted({x.tick_id for x in every}):
        for x in every:
            if x.tick_id == tick_id:
                held_all[x.key] = x
        while i < len(sent) and sent[i].tick_id <= tick_id:
            held_state[sent[i].key] = sent[i]
            i += 1
        assert held_all.keys() == held_state.keys()
        for key, x in held_all.items():
            assert _wanted(held_state[key]) == _wanted(x), (tick_id, key)
    # A router following control.state never holds a routing decision staler than the refresh.
    state_view = DesiredState()
    for x in sent:
        state_view.accept(x, x.ts_ms / 1000.0, 10.0)
    assert state_view.pools
    assert all(st.routing_refresh_s == 10.0 for st in state_view.pools.values())


def test_the_publisher_writes_the_form_headers_into_the_clients_own_batches() -> None:
    """The real publisher over aiokafka's record batches (the producer's other calls stood in
    for): control.state's records carry the form's headers, control.decisions' carry none, and
    an unchanged key goes to control.decisions only."""

    class Producer:
        def __init__(self) -> None:
            self.sent: list[tuple[str, BatchBuilder]] = []

        async def partitions_for(self, topic: str) -> set[int]:
            return {0}

        def create_batch(self) -> BatchBuilder:
            return BatchBuilder(1 << 20, 0, is_transactional=False)

        async def send_batch(
            self, batch: BatchBuilder, topic: str, *, partition: int
        ) -> asyncio.Future[object]:
            self.sent.append((topic, batch))
            done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

    async def main() -> list[tuple[str, list[Any]]]:
        producer = Producer()
        pub = Publisher(producer, "", 10_000)  # type: ignore[arg-type]
        t = quiet()
        await pub.publish([routing(t, W)])
        await pub.publish([routing(t + 1, W)])
        out = []
        for topic, batch in producer.sent:
            records = DefaultRecordBatch(bytearray(batch._builder.build()))
            out.extend((topic, list(r.headers)) for r in records)
        return out

    got = asyncio.run(main())
    assert [topic for topic, _ in got].count(DECISIONS) == 2
    assert [(topic, h) for topic, h in got if topic == STATE] == [(STATE, state_headers(10_000))]
    assert all(h == [] for topic, h in got if topic == DECISIONS)
