"""A checkpoint encoded in a forked child is the checkpoint of the state at the fork, byte for byte,
whatever the loop does to the state meanwhile; a child that fails says why."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fleetloop.core import checkpoint
from fleetloop.core.model.fleet import FleetModel
from fleetloop.core.shard import Row, Shard
from fleetloop.daemon import offload
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas import Tick
from fleetloop.schemas.topics import REQUESTS, TELEMETRY
from tests.support.records import telemetry

T0 = 1_700_000_000_000


def shard_of(n: int) -> Shard:
    shard = Shard(2)
    shard.add(TELEMETRY, [Row(i, T0 + i, telemetry(f"p/{i}", ts_ms=T0 + i)) for i in range(n)])
    shard.decide(Tick(ts_ms=T0 + 1000, tick_id=(T0 + 1000) // 1000, pool_id="p"), {TELEMETRY: n, REQUESTS: 0},
                 builtin_policy("default"))  # fmt: skip
    return shard


async def test_the_child_encodes_the_state_as_it_was_at_the_fork() -> None:
    shard = shard_of(50)
    before = checkpoint.encode_many([shard.checkpoint_value()])
    pending = offload.encode_in_child(checkpoint.encode_many, [shard.checkpoint_value()])
    # The loop goes on changing the state while the child encodes.
    shard.add(
        TELEMETRY, [Row(50 + i, T0 + 2000 + i, telemetry(f"p/x{i}", ts_ms=T0 + 2000 + i)) for i in range(50)]
    )
    later = Tick(ts_ms=T0 + 3000, tick_id=(T0 + 3000) // 1000, pool_id="p")
    shard.decide(later, {TELEMETRY: 100, REQUESTS: 0}, builtin_policy("default"))
    got = await pending
    assert got == before
    [blob] = checkpoint.split_many(got)
    restored = Shard.from_checkpoint(checkpoint.decode(blob))
    assert len(restored.model.nodes) == 50
    assert len(shard.model.nodes) == 100


def _fails(value: Any) -> bytes:
    raise checkpoint.CheckpointError("cannot checkpoint a value of type x")


async def test_a_failing_child_raises_its_error_in_the_parent() -> None:
    with pytest.raises(offload.OffloadError, match="CheckpointError: cannot checkpoint"):
        await offload.encode_in_child(_fails, FleetModel())


def test_several_blobs_round_trip() -> None:
    blobs = [checkpoint.encode({"a": i}) for i in range(3)]
    assert checkpoint.split_many(b"".join(len(b).to_bytes(8, "big") + b for b in blobs)) == blobs
    assert [checkpoint.decode(b) for b in checkpoint.split_many(checkpoint.encode_many([1, "x", None]))] == [
        1,
        "x",
        None,
    ]


def test_many_concurrent_children_do_not_mix_answers() -> None:
    async def main() -> list[bytes]:
        return list(
            await asyncio.gather(*(offload.encode_in_child(checkpoint.encode, {"i": i}) for i in range(8)))
        )

    assert [checkpoint.decode(b) for b in asyncio.run(main())] == [{"i": i} for i in range(8)]


async def test_the_child_says_how_much_cpu_it_used() -> None:
    shard = shard_of(200)
    data, cpu_s = await offload.encode_timed_in_child(checkpoint.encode_many, [shard.checkpoint_value()])
    assert data == checkpoint.encode_many([shard.checkpoint_value()])
    assert 0.0 < cpu_s < 60.0


@pytest.mark.parametrize(
    ("interval_s", "cpu_s", "share", "stretch", "gap_s"),
    [
        (5.0, 0.1, 0.05, 6.0, 5.0),  # cheap: the interval
        (5.0, 0.5, 0.05, 6.0, 10.0),  # 0.5 CPU-s every 10 s: 5% of a core
        (5.0, 3.0, 0.05, 6.0, 30.0),  # at most 6 intervals
        (5.0, 3.0, 0.0, 6.0, 5.0),  # no share: the interval
        (0.0, 3.0, 0.05, 6.0, 0.0),  # every batch stays every batch
        (5.0, float("nan"), 0.05, 6.0, 5.0),
        (5.0, float("inf"), 0.05, 6.0, 5.0),
        (5.0, -1.0, 0.05, 6.0, 5.0),
        (5.0, 0.5, 0.05, 1.0, 5.0),  # no stretch
    ],
)
def test_the_gap_keeps_checkpointing_near_its_cpu_share(
    interval_s: float, cpu_s: float, share: float, stretch: float, gap_s: float
) -> None:
    assert checkpoint.gap_s(interval_s, cpu_s, share, stretch) == gap_s


def test_a_costly_checkpoint_stretches_the_next_gap() -> None:
    """``Checkpoints.write``: a shard is written again only once the gap the last checkpoint's CPU
    set has passed; the CPU is counted in the stats."""
    from tests.support.runtime_harness import Rig, rig
    from tests.support.virtual_time import FakeClock, run_virtual

    cpu = [1.0]

    class Timed:  # the child's CPU seconds as given
        async def encode_timed(self, encode: Any, values: Any) -> tuple[bytes, float]:
            return encode(values), cpu[0]

        async def in_thread(self, fn: Any, arg: Any) -> Any:
            return fn(arg)

    async def run(clock: FakeClock) -> Rig:
        async with rig(clock) as r:
            owned = r.own(0, shard_of(20))
            checkpoints = r.checkpoints(offload=Timed())
            start = clock.monotonic_s()

            async def write_at(t: float) -> bool:
                await asyncio.sleep(start + t - clock.monotonic_s())
                owned.dirty = True
                wrote = await checkpoints.write()
                if checkpoints.task is not None:
                    await checkpoints.task
                return wrote

            assert await write_at(0.0)  # 1 CPU-s at 5%: the next in 20 s
            assert r.stats.checkpoint_gap_s == 20.0
            assert r.stats.checkpoint_cpu_s_total == 1.0
            assert not await write_at(10.0)
            assert not await write_at(19.9)
            cpu[0] = 0.01
            assert await write_at(20.0)  # cheap now: back to the interval
            assert r.stats.checkpoint_gap_s == 5.0
            assert await write_at(25.0)
            found = await checkpoints.read()
            assert found[0].max_seq == 3  # three written, the newest complete
            return r

    r = run_virtual(run)
    assert r.stats.checkpoints_written == 3
    assert r.stats.summary()["checkpoint_cpu_ms"] == 1020
