"""``fleetloop replay`` over a real decision log: exact replay is byte-identical; a what-if differs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fleetloop.daemon.cli import main
from fleetloop.schemas.topics import DECISIONS, REQUESTS, TELEMETRY, TICKS
from tests.support.kafka import producer, read_all, running_daemon, send, wait_decided
from tests.support.policies import FOUNDATION_YAML
from tests.support.records import outcome, telemetry, tick

NODES = ("p/0", "p/1", "p/2")


async def _record_an_incident(env: Any) -> int:
    """Run the daemon over a small incident (p/2 starts failing); return how many decisions it made."""
    async with running_daemon(env) as daemon, producer(env) as p:
        for k in range(1, 7):
            await send(
                p,
                env,
                TELEMETRY,
                [telemetry(n, ts_ms=k * 1000, queue_depth=k % 3 + i) for i, n in enumerate(NODES)],
            )
            ok = [outcome(n, "ok", ts_ms=k * 1000 + 100 + i, n=k * 100 + i) for i, n in enumerate(NODES[:2])]
            bad = (
                [outcome("p/2", "error", ts_ms=k * 1000 + 200 + i, n=k * 100 + 10 + i) for i in range(2)]
                if k >= 3
                else []
            )
            await send(p, env, REQUESTS, ok + bad)
            await send(p, env, TICKS, [tick(k)])
            await wait_decided(daemon, k * 1000)
    return daemon.stats.decisions_published  # read once the daemon has stopped: every publish acked


async def test_exact_replay_is_byte_identical_and_a_what_if_shows_the_difference(
    kafka_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    published = await _record_an_incident(kafka_env)
    await read_all(kafka_env, DECISIONS, until=lambda rs: len(rs) >= published)
    capsys.readouterr()  # drop the daemon's log lines
    args = ["replay", "--bootstrap-servers", kafka_env.bootstrap_servers, "--topic-prefix", kafka_env.prefix]

    # The pinned test policy is not built in: name it; its hash matches, so this is exact.
    code = await _in_thread(main, [*args, "--json", "--policy", str(FOUNDATION_YAML)])
    out, err = capsys.readouterr()
    assert out.strip(), err
    exact = json.loads(out)
    assert code == 0, json.dumps(exact)[:3000]
    assert exact["mode"] == "exact"
    assert exact["exact"] is True
    assert exact["ticks_compared"] == 6
    assert exact["identical"] == exact["decisions_compared"] == published
    assert exact["breaker_opens"]["recorded"] == exact["breaker_opens"]["replayed"] == 1

    lenient = FOUNDATION_YAML.read_text().replace("threshold: 5", "threshold: 50")
    what_if = tmp_path / "lenient.yaml"
    what_if.write_text(lenient)
    code = await _in_thread(main, [*args, "--json", "--policy", str(what_if)])
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["mode"] == "what-if"
    assert result["breaker_opens"] == {"recorded": 1, "replayed": 0}
    assert result["changed_by_kind"]["breaker"] >= 1
    assert result["changed_by_kind"]["routing"] >= 1


async def _in_thread(fn: Any, argv: list[str]) -> int:
    """The CLI runs its own event loop (asyncio.run); call it off this test's loop."""
    import asyncio

    return int(await asyncio.to_thread(fn, argv))
