"""``fleetloop bench latency``'s load generator (fleetloop/bench/loadgen.py): the records it builds
by patching pre-encoded bytes are records the daemon's door accepts, with the time stamp and the
changing fields of each slice; every node reports once a second; the calls land at the asked rate
on every node, the trial targets too (they serve ok traffic before they fail), and never on a
target its trial took over; each record goes to the partition the client's partitioner picks for
its pool."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from aiokafka.partitioner import DefaultPartitioner
from fleetloop.bench.loadgen import SLICES, Slices, bench_fleet, templates, trial_targets
from fleetloop.daemon.observe.decode import Door, decode_rows
from fleetloop.schemas.fast import OUTCOME_TWIN, TELEMETRY_TWIN

TS = 1_767_225_600_000


@dataclass
class _Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    topic: str = "t"
    partition: int = 0


def _second(
    n_nodes: int, per_node: float, trials: int = 5, taken: tuple[int, ...] = (), seconds: int = 1
) -> tuple[Slices, list[tuple[int, int, bytes, bytes]]]:
    fleet = bench_fleet(n_nodes)
    targets = [node for _, node in trial_targets(fleet, trials)]
    slices = Slices(fleet, templates(fleet, targets, 4), per_node)
    rows = {slices.tpl.targets[t] for t in taken}
    records = []
    for k in range(SLICES * seconds):
        records.extend(slices.records(k % SLICES, TS + k * 50, rows))
    return slices, records


def _decoded(records: list[tuple[int, int, bytes, bytes]], topic: int) -> list[object]:
    twin = TELEMETRY_TWIN if topic == 0 else OUTCOME_TWIN
    mine = [_Record(i, TS, key, value) for i, (t, _, key, value) in enumerate(records) if t == topic]
    rows, dead = decode_rows(twin, mine, Door(), lambda o, ts, item, k, v: item)
    assert dead == []
    assert all(item is not None for item in rows)
    return rows


def test_every_node_reports_once_a_second_with_its_slices_time_stamp() -> None:
    _, records = _second(1000, 0.5)
    items = _decoded(records, 0)
    by_node = Counter(t.node_id for t in items)  # type: ignore[attr-defined]
    fleet = bench_fleet(1000)
    assert set(by_node) == set(fleet.node_ids)
    assert set(by_node.values()) == {1}
    stamps = {t.ts_ms for t in items}  # type: ignore[attr-defined]
    assert stamps == {TS + k * 50 for k in range(SLICES)}  # patched per slice, not the template's
    assert len({t.queue_depth for t in items}) > 1  # type: ignore[attr-defined]


def test_calls_land_at_the_asked_rate_with_unique_ids_on_targets_too_until_taken() -> None:
    fleet = bench_fleet(200)
    targets = [node for _, node in trial_targets(fleet, 5)]
    _, records = _second(200, 2.0, seconds=10)
    calls = _decoded(records, 1)
    assert len(calls) == 4000
    called = Counter(c.node_id for c in calls)  # type: ignore[attr-defined]
    assert all(called[t] > 0 for t in targets)  # the targets serve ok traffic like the rest
    assert len({c.request_id for c in calls}) == 4000  # type: ignore[attr-defined]
    assert all(c.outcome == "ok" for c in calls)  # type: ignore[attr-defined]
    # Trials 0 and 2 taken over: no call on their targets, the others' still called.
    _, records = _second(200, 2.0, taken=(0, 2), seconds=10)
    taken = _decoded(records, 1)
    on = Counter(c.node_id for c in taken)  # type: ignore[attr-defined]
    assert on[targets[0]] == on[targets[2]] == 0
    assert on[targets[1]] > 0
    assert on[targets[3]] > 0


def test_a_loaded_fleet_has_a_queue_on_every_node() -> None:
    fleet = bench_fleet(300)
    slices = Slices(fleet, templates(fleet, [], 4), 1.0, min_queue=1)
    records = [r for k in range(SLICES) for r in slices.records(k, TS + k * 50)]
    queues = [t.queue_depth for t in _decoded(records, 0)]  # type: ignore[attr-defined]
    assert len(queues) == 300
    assert min(queues) == 1
    assert max(queues) > 1


def test_each_record_goes_to_its_pools_partition_as_the_client_would_send_it() -> None:
    _, records = _second(300, 1.0)
    partitioner = DefaultPartitioner()
    parts = [0, 1, 2, 3]
    assert {p for _, p, _, _ in records} == set(parts)
    for _, p, key, _ in records:
        assert p == partitioner(key, parts, parts)


@pytest.mark.parametrize("n_nodes", [200, 1000, 10_000])
def test_trial_targets_are_spread_over_pools_and_distinct(n_nodes: int) -> None:
    fleet = bench_fleet(n_nodes)
    trials = min(40, len(fleet.pools))
    targets = trial_targets(fleet, trials)
    assert len({node for _, node in targets}) == trials
    assert len({i for i, _ in targets}) == trials  # consecutive trials in distinct pools
    for i, node in targets:
        assert node in fleet.pools[i].node_ids


@pytest.mark.parametrize("n_nodes", [16, 1000])
def test_a_seconds_load_is_n_records_plus_the_calls(n_nodes: int) -> None:
    _, records = _second(n_nodes, 2.0)
    counts = Counter(t for t, _, _, _ in records)
    assert counts[0] == n_nodes
    assert counts[1] == SLICES * int(n_nodes * 2.0 / SLICES)
