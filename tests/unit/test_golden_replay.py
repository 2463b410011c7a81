"""Golden replay: recorded topic contents and the decisions they must produce, checked in.

``tests/fixtures/golden/replay-policy-change/`` holds, as JSON lines, what a daemon's topics held
for one pool over 30 ticks: ``inputs.jsonl`` (telemetry and request outcomes as broker records:
topic, partition, offset, timestamp, value; one malformed record and one whose event time is far
ahead of its broker timestamp, both refused at the door), ``decisions.jsonl`` (the decision log,
across a policy change at tick 15), and the two policy documents. Replaying the inputs through the
same door, shards and policies must give exactly these bytes. A change that alters decisions fails
here; if the change is intended, regenerate with ``FLEETLOOP_REGENERATE_GOLDEN=1 pytest
tests/unit/test_golden_replay.py`` and review the diff of the fixture like code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import yaml
from fleetloop.core.shard import INPUTS, Row, Shard
from fleetloop.daemon.act.publish import decision_bytes
from fleetloop.daemon.observe.decode import Door, decode_batch
from fleetloop.daemon.replay.replay import group_ticks, replay_ticks
from fleetloop.policies.registry import CompiledPolicy, compile_policy, parse_document
from fleetloop.schemas import Decision, NodeTelemetry, RequestOutcome, Tick
from fleetloop.schemas.topics import REQUESTS, TELEMETRY
from tests.support.policies import FOUNDATION_YAML
from tests.support.records import outcome, telemetry, to_bytes

GOLDEN = Path(__file__).parents[1] / "fixtures" / "golden" / "replay-policy-change"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
NODES = [f"p/{i}" for i in range(4)]
TICKS = 30
CHANGE_AT = 15  # ticks from this one on are decided under v2
DOOR = Door()


@dataclass(frozen=True, slots=True)
class Record:
    """A broker record as the door sees it (aiokafka's ConsumerRecord has these fields)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int


def _policies() -> tuple[CompiledPolicy, CompiledPolicy]:
    v1 = yaml.safe_load(FOUNDATION_YAML.read_text())
    v2 = yaml.safe_load(FOUNDATION_YAML.read_text())
    v2["metadata"]["version"] = 2
    v2["spec"]["breaker"]["params"]["threshold"] = 3
    v2["spec"]["routing"]["params"]["alpha"] = 1.0
    return compile_policy(parse_document(v1)), compile_policy(parse_document(v2))


def _record() -> tuple[list[Record], list[bytes]]:
    """Run a daemon's shard over a generated incident (p/3 fails in bursts from tick 8): the inputs
    as the broker holds them, and the decision log it publishes."""
    v1, v2 = _policies()
    rng = np.random.default_rng(5)
    records: list[Record] = []
    offsets = {TELEMETRY: 0, REQUESTS: 0}

    def put(logical: str, ts: int, value: bytes) -> None:
        records.append(Record(logical, 0, offsets[logical], b"p", value, ts))
        offsets[logical] += 1

    n = 0
    for s in range(TICKS):
        base = T0 + s * 1000
        for i, node in enumerate(NODES):
            q = int(rng.integers(0, 6)) + (20 if node == "p/3" and s >= 8 else 0)
            put(TELEMETRY, base + 100 + i, to_bytes(telemetry(node, ts_ms=base + 100 + i, queue_depth=q)))
        for k in range(int(rng.integers(6, 12))):
            node = NODES[int(rng.integers(len(NODES)))]
            bad = node == "p/3" and s >= 8 and rng.random() < 0.85
            ts = base + 200 + 50 * k
            kind = "error" if bad else "ok"
            put(REQUESTS, ts, to_bytes(outcome(node, kind, ts_ms=ts, n=n, workflow_id=f"w-{n // 4}")))
            n += 1
        if s == 5:
            put(TELEMETRY, base + 900, b'{"node_id": "p/7", "queue_depth": "lots"}')  # malformed
        if s == 10:  # a new node stamped two minutes ahead of the broker: outside the door's window
            late = telemetry("p/8", ts_ms=base + 120_000)
            put(TELEMETRY, base + 900, to_bytes(late))
    shard = Shard(0)
    decided: list[bytes] = []
    by_topic = {k: [r for r in records if r.topic == k] for k in INPUTS}
    for logical in INPUTS:
        model = NodeTelemetry if logical == TELEMETRY else RequestOutcome
        good = dict(zip(*_decoded(model, by_topic[logical]), strict=True))
        shard.add(logical, (Row(r.offset, r.timestamp, good.get(r.offset)) for r in by_topic[logical]))
    for s in range(TICKS):
        boundary = T0 + (s + 1) * 1000
        tick = Tick(ts_ms=boundary, tick_id=boundary // 1000, pool_id="p")
        cut = shard.cut_by_time(boundary)
        out = shard.decide(tick, cut, v1 if s < CHANGE_AT else v2)
        assert out is not None
        decided.extend(decision_bytes(d) for d in out)
    return records, decided


def _decoded(model: Any, records: list[Record]) -> tuple[list[int], list[Any]]:
    d = decode_batch(model, records, DOOR)
    return d.offsets, d.items


def _write(records: list[Record], decided: list[bytes]) -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    v1, v2 = _policies()
    with (GOLDEN / "inputs.jsonl").open("wb") as f:
        for r in records:
            line = {"topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp": r.timestamp}
            f.write(orjson.dumps({**line, "value": (r.value or b"").decode()}, option=orjson.OPT_SORT_KEYS))
            f.write(b"\n")
    (GOLDEN / "decisions.jsonl").write_bytes(b"".join(d + b"\n" for d in decided))
    for p in (v1, v2):
        path = GOLDEN / f"policy-v{p.stamp.version}.json"
        path.write_bytes(
            orjson.dumps(p.document.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS) + b"\n"
        )


def _load() -> tuple[list[Record], list[bytes], dict[str, CompiledPolicy]]:
    records = []
    for line in (GOLDEN / "inputs.jsonl").read_bytes().splitlines():
        r = orjson.loads(line)
        records.append(
            Record(r["topic"], r["partition"], r["offset"], b"p", r["value"].encode(), r["timestamp"])
        )
    decided = (GOLDEN / "decisions.jsonl").read_bytes().splitlines()
    policies = [
        compile_policy(parse_document(orjson.loads((GOLDEN / f"policy-v{v}.json").read_bytes())))
        for v in (1, 2)
    ]
    return records, decided, {p.stamp.hash: p for p in policies}


if os.environ.get("FLEETLOOP_REGENERATE_GOLDEN") == "1":  # pragma: no cover - a maintainer's tool
    _write(*_record())


def _replay(records: list[Record], decided: list[bytes], policies: dict[str, CompiledPolicy]) -> Any:
    """What ``fleetloop replay`` does with these topics: door, ticks by recorded cut, policy by stamp."""
    inputs: dict[str, list[tuple[int, Any]]] = {}
    for logical in INPUTS:
        mine = [r for r in records if r.topic == logical]
        model = NodeTelemetry if logical == TELEMETRY else RequestOutcome
        good = dict(zip(*_decoded(model, mine), strict=True))
        inputs[f"{logical}:0"] = [(r.offset, good.get(r.offset)) for r in mine]
    log = [Decision.model_validate_json(d) for d in decided]
    return replay_ticks(group_ticks(log), inputs, policies)


def test_the_golden_topics_replay_to_exactly_the_golden_decisions() -> None:
    records, decided, policies = _load()
    report = _replay(records, decided, policies)
    assert report.exact, report.first_difference
    assert report.ticks_compared == TICKS
    assert report.decisions_compared == len(decided) > 200
    # What the fixture exercises: a policy change, a breaker opening, and two records refused.
    assert len(report.ticks_by_policy) == 2
    assert report.breaker_opens_recorded >= 1
    refused = [r for r in records if r.topic == TELEMETRY and r.offset not in _decoded(NodeTelemetry, [r])[0]]
    assert len(refused) == 2


def test_the_fixture_is_what_the_current_code_records() -> None:
    """The generator reproduces the checked-in fixture: the code decides today what it decided then."""
    records, decided = _record()
    on_disk_records, on_disk_decided, _ = _load()
    assert [(r.topic, r.offset, r.timestamp, r.value) for r in records] == [
        (r.topic, r.offset, r.timestamp, r.value) for r in on_disk_records
    ]
    assert decided == on_disk_decided, (
        "decisions differ from tests/fixtures/golden/replay-policy-change/decisions.jsonl; if intended, "
        "regenerate with FLEETLOOP_REGENERATE_GOLDEN=1 and review the diff"
    )


@pytest.mark.parametrize("what", ["input", "decision"])
def test_a_changed_byte_in_the_fixture_is_caught(what: str) -> None:
    records, decided, policies = _load()
    if what == "input":  # p/3's first error becomes an ok: its breaker opens later or not at all
        i = next(k for k, r in enumerate(records) if r.value and b'"outcome":"error"' in r.value)
        r = records[i]
        records[i] = Record(
            r.topic, r.partition, r.offset, r.key, r.value.replace(b'"error"', b'"ok"'), r.timestamp
        )  # type: ignore[union-attr]
    else:
        decided[40] = decided[40].replace(b'"reason":"', b'"reason":"x', 1)
    assert not _replay(records, decided, policies).exact
