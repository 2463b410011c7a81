"""Assignment and restore (``runtime.assignment``) on the in-memory broker in virtual time: a new
owner restores a partition's checkpoint exactly and reads on from its offsets; a partition kept in
memory past the broker's ends (an emptied broker) starts clean; one no longer assigned is forgotten."""

from __future__ import annotations

from fleetloop.core import checkpoint
from fleetloop.core.shard import INPUTS, Row, Shard
from fleetloop.daemon.runtime.port import TopicPartition
from fleetloop.schemas.topics import REQUESTS, TELEMETRY, TICKS
from tests.support.memory_broker import MemoryBroker
from tests.support.records import outcome, telemetry, to_bytes
from tests.support.runtime_harness import Rig, rig
from tests.support.virtual_time import FakeClock, run_virtual

T0 = 1_800_000_000_000


def _inputs(r: Rig, n: int) -> None:
    """``n`` telemetry records and ``n`` outcomes of pool a on partition 0."""
    for i in range(n):
        r.broker.append(r.parts.physical[TELEMETRY], to_bytes(telemetry("a/0", "a", T0 + i)), b"a")
        r.broker.append(r.parts.physical[REQUESTS], to_bytes(outcome("a/0", "ok", "a", T0 + i, n=i)), b"a")


def _read_into(r: Rig, shard: Shard) -> None:
    """Read everything partition 0 holds into ``shard`` (as the intake would) and fold half of it."""
    for logical in INPUTS:
        records = r.broker.records(logical, 0)
        shard.add(logical, [Row(x.offset, x.timestamp, _decoded(logical, x.value or b"")) for x in records])
    shard.fold_to({k: shard.read[k] // 2 for k in INPUTS})


def _decoded(logical: str, value: bytes) -> object:
    from fleetloop.schemas import NodeTelemetry, RequestOutcome

    model = NodeTelemetry if logical == TELEMETRY else RequestOutcome
    return model.model_validate_json(value)


def _assigned(r: Rig) -> list[TopicPartition]:
    tps = [r.parts.tp(k, 0) for k in (*INPUTS, TICKS)]
    r.session.consumer.assigned = set(tps)  # the group gave this member partition 0
    return tps


async def checkpointed(clock: FakeClock, broker: MemoryBroker) -> tuple[bytes, dict[str, int]]:
    """A first owner reads 40 records of each input into partition 0's shard, folds half and
    checkpoints it: the checkpoint's bytes and the shard's folded offsets."""
    async with rig(clock, broker) as first:
        _inputs(first, 40)
        owned = first.own(0)
        _read_into(first, owned.shard)
        owned.dirty = True
        assert await first.checkpoints().write(force=True)
        return checkpoint.encode(owned.shard.checkpoint_value()), dict(owned.shard.folded)


def test_a_new_owner_restores_the_checkpoint_exactly_and_reads_on_from_its_offsets() -> None:
    async def run(clock: FakeClock) -> None:
        broker = MemoryBroker(clock, partitions=1)
        written, folded = await checkpointed(clock, broker)
        async with rig(clock, broker) as second:
            assignment = second.assignment()
            await assignment.assign(_assigned(second))
            restored = second.parts[0]
            assert checkpoint.encode(restored.shard.checkpoint_value()) == written
            assert second.stats.shards_restored == 1
            assert restored.publish_from == 0  # nothing committed: publishing starts at its ticks
            positions = second.session.consumer.positions
            assert {k: positions[second.parts.tp(k, 0)] for k in INPUTS} == folded  # read on from there
            assert positions[second.parts.tp(TICKS, 0)] == restored.shard.ticks_at
            assert assignment.ready.is_set()

    run_virtual(run, wall_ms=T0)


def test_a_shard_kept_past_the_brokers_ends_starts_clean_and_a_partition_not_assigned_is_forgotten() -> None:
    async def run(clock: FakeClock) -> None:
        async with rig(clock) as r:
            _inputs(r, 20)
            owned = r.own(0)
            _read_into(r, owned.shard)
            owned.dirty = True
            r.own(1)  # another partition, not in the next assignment
            r.broker.wipe()  # the broker came back empty
            assignment = r.assignment()
            await assignment.assign(_assigned(r))
            assert r.parts.indexes() == [0]  # partition 1: forgotten, its record dropped
            clean = r.parts[0]
            assert clean is not owned
            assert clean.shard.read == dict.fromkeys(INPUTS, 0)
            assert r.stats.shards_started_clean == 1

    run_virtual(run, wall_ms=T0)
