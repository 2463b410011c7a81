"""The consumer loop gives the loop's other tasks a turn between batches: with records buffered
the fetch returns without waiting, and a batch with no tick to decide awaits nothing, so without a
turn the loop read a whole backlog in one step (at 10,000 nodes up to 130 ms of its own CPU while
the ticker, the client's sends and the group heartbeat waited). Virtual time: counted, not timed."""

from __future__ import annotations

import asyncio

from fleetloop.schemas.topics import TELEMETRY, topic_name
from tests.support.memory_broker import MemoryBroker
from tests.support.records import telemetry, to_bytes
from tests.support.runtime_harness import daemon, running
from tests.support.virtual_time import FakeClock, run_virtual

T0 = 1_800_000_000_000
RECORDS = 2_000
BATCH = 50


def test_another_task_runs_between_the_batches_of_a_backlog() -> None:
    async def main(clock: FakeClock) -> list[int]:
        broker = MemoryBroker(clock)
        d = daemon(broker, clock, max_batch=BATCH, run_ticker=False)
        async with running(d):
            now = clock.wall_ms()
            for i in range(RECORDS):  # a backlog: every record there before the loop reads one
                pool = f"p{i % 4}"
                broker.append(
                    topic_name(broker.prefix, TELEMETRY),
                    to_bytes(telemetry(f"{pool}/{i}", pool, now)),
                    pool.encode(),
                )
            seen: list[int] = []  # what the daemon had read at each turn this task got
            while d.stats.events_in < RECORDS:
                seen.append(d.stats.events_in)
                await asyncio.sleep(0)
            return seen

    seen = run_virtual(main, wall_ms=T0)
    # A turn after (nearly) every batch: the backlog's progress seen in many steps, none of more
    # than a few batches. Without the turn, one step read it all (0, then every record).
    steps = sorted(set(seen))
    assert len(steps) >= RECORDS // BATCH // 2, steps
    assert max(b - a for a, b in zip(steps, [*steps[1:], RECORDS], strict=True)) <= 4 * BATCH, steps
