"""A checkpoint encoded in a forked child is the checkpoint of the state at the fork, byte for byte,
whatever the loop does to the state meanwhile; a child that fails says why."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fleetloop.daemon import checkpoint, offload
from fleetloop.daemon.model.fleet import FleetModel
from fleetloop.daemon.shard import Row, Shard
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
